"""The scripted backend: a test double that plays a script of model turns.

Ship it in your own tests the way ollie's tests use it:

    backend = ScriptedBackend([
        {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "ls"}]}}]},
        {"text": "Two files.", "expect": "README.md"},
    ])
    ...
    backend.assert_consumed()

A turn answers one request. Keys: `text`, `reasoning`, `tool_calls` (name + arguments as an object
or JSON text; `id` optional), `usage` ({input_tokens, output_tokens, ...}), `delay` (seconds before
answering), `chunk` (stream text in pieces of this many characters), `stop_reason`, `drop` (end the
stream without its final chunk, as a dropped connection does), `error` ({type: rate_limit | transient |
context_overflow | tool_unsupported | other, message, retry_after}), and `expect` (a substring the
last user or tool message must contain: the double fails loudly when the agent sent something else).

Instead of a list, `{"rules": [{"match": REGEX, ...turn}]}` answers every request with the first rule
whose regex matches the last user message; rules are never used up (for agents in long scripts).

From the CLI: `--backend scripted --script FILE` (JSON or YAML); the script path may also be given as
the model (`"backend": "scripted", "model": "/path/script.yaml"` in an agent config).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..types import (
    BackendError,
    Chunk,
    OllieError,
    ConfigError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    RateLimitError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    ToolUnsupportedError,
    TransientError,
    Usage,
    UsageChunk,
)

_ERRORS: dict[str, type[BackendError]] = {
    "rate_limit": RateLimitError,
    "transient": TransientError,
    "context_overflow": ContextOverflowError,
    "tool_unsupported": ToolUnsupportedError,
    "other": BackendError,
}


class ScriptError(OllieError, AssertionError):
    """The agent did not do what the script expected (an OllieError: reported in one line, and
    kept, so that `assert_consumed` fails the test even when the loop caught it)."""


def load_script(source: str | Path | list | dict) -> list[dict] | dict:
    if isinstance(source, (list, dict)):
        return source
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"scripted backend: cannot read script {path}: {e.strerror}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:
        raise ConfigError(f"scripted backend: {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {e}") from None
    if not isinstance(data, (list, dict)):
        raise ConfigError(f"scripted backend: {path} must hold a list of turns or {{\"rules\": [...]}}")
    return data


class ScriptedBackend:
    name = "scripted"

    def __init__(self, script: list[dict] | dict | str | Path, *, model: str = "scripted", context_length: int = 128_000):
        data = load_script(script)
        self._rules: list[dict] | None = data.get("rules") if isinstance(data, dict) else None
        if isinstance(data, dict) and self._rules is None:
            raise ConfigError("scripted backend: a script object needs a \"rules\" list")
        self._turns: list[dict] = list(data) if isinstance(data, list) else []
        self.model = model
        self._context_length = context_length
        self.requests: list[list[Message]] = []  # every request's messages, for assertions
        self.tools_seen: list[list[ToolSpec]] = []
        self.failures: list[ScriptError] = []  # every mismatch, even those the loop reported and went on

    @classmethod
    def from_options(cls, model: str | None = None, script: Any = None, **_: Any) -> ScriptedBackend:
        source = script or model
        if not source:
            raise ConfigError("scripted backend: give a script (--script FILE, or the file as the model)")
        return cls(source, model=str(model or "scripted"))

    def _next_turn(self, messages: list[Message]) -> dict:
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        if self._rules is not None:
            for rule in self._rules:
                if re.search(rule.get("match", ""), last_user, re.S):
                    return rule
            raise self._fail(f"scripted backend: no rule matches the request {last_user[:200]!r}")
        if not self._turns:
            raise self._fail(
                f"scripted backend: unexpected request #{len(self.requests)}: the script has no turns left "
                f"(last message: {messages[-1].role}: {messages[-1].content[:200]!r})"
            )
        return self._turns.pop(0)

    def _fail(self, message: str) -> ScriptError:
        self.failures.append(ScriptError(message))
        return self.failures[-1]

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        self.requests.append(list(messages))
        self.tools_seen.append(list(tools))
        turn = self._next_turn(messages)
        if expect := turn.get("expect"):
            last = next((m.content for m in reversed(messages) if m.role in ("user", "tool")), "")
            if expect not in last:
                raise self._fail(f"scripted backend: expected {expect!r} in the last message, got {last[:300]!r}")
        if delay := turn.get("delay"):
            await asyncio.sleep(delay)
        if err := turn.get("error"):
            cls = _ERRORS.get(err.get("type", "other"), BackendError)
            kw: dict[str, Any] = {"provider": "scripted", "status": err.get("status")}
            if cls is RateLimitError:
                kw["retry_after"] = err.get("retry_after")
            raise cls(err.get("message", "scripted error"), **kw)
        if reasoning := turn.get("reasoning"):
            yield ReasoningDelta(reasoning)
        if text := turn.get("text"):
            step = int(turn.get("chunk") or len(text))
            for i in range(0, len(text), step):
                yield TextDelta(text[i : i + step])
                if turn.get("chunk"):
                    await asyncio.sleep(0)
        calls = turn.get("tool_calls") or []
        for i, call in enumerate(calls):
            args = call.get("arguments", {})
            yield ToolCallDelta(
                index=i,
                id=call.get("id") or f"call_{len(self.requests)}_{i}",
                name=call.get("name", ""),
                arguments=args if isinstance(args, str) else json.dumps(args),
            )
        if turn.get("drop"):
            return
        usage = turn.get("usage") or {}
        yield UsageChunk(Usage(requests=1, **usage))
        yield Done(turn.get("stop_reason") or ("tool_calls" if calls else "stop"))

    def assert_consumed(self) -> None:
        """Fail if the agent did something the script did not expect, or left turns unrequested."""
        if self.failures:
            raise self.failures[0]
        if self._turns:
            raise ScriptError(f"scripted backend: {len(self._turns)} turn(s) never requested: {self._turns[0]}")

    async def models(self) -> list[str]:
        return [self.model]

    async def context_length(self) -> int | None:
        return self._context_length

    async def aclose(self) -> None:
        return None
