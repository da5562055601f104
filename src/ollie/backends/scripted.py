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
answering), `chunk` (stream text in pieces of this many characters), `stop_reason` (one of ollie's
stop reasons, or any other word: that ends the answer as "other", with the word as the provider's),
`drop` (end the stream without its final chunk, as a dropped connection does), `error` ({type:
rate_limit | transient | context_overflow | tool_unsupported | other, message, retry_after}), and
`expect` (a substring the last user or tool message must contain: the double fails loudly when the
agent sent something else).
A turn of the wrong shape (not an object, an unknown key, a value of the wrong type) is refused when
the backend is built, naming the turn; what a tool call holds is left as written, so that a script
can play a model that sends malformed calls.

Instead of a list, `{"rules": [{"match": REGEX, ...turn}]}` answers every request with the first rule
whose regex matches the last user message; rules are never used up (for agents in long scripts).

From the CLI: `--backend scripted --script FILE` (JSON or YAML); the script path may also be given as
the model (`"backend": "scripted", "model": "/path/script.yaml"` in an agent config).
"""

from __future__ import annotations

import asyncio
import json
import re
import reprlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

from ..textcalls import arguments_text
from ..types import (
    BackendError,
    Chunk,
    ConfigError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    OllieError,
    RateLimitError,
    ReasoningDelta,
    StopReason,
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


# A turn's keys and their types. The contents of a tool call are not checked: a script may play a
# model that sends a malformed one.
_TURN_KEYS: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "reasoning": (str,),
    "tool_calls": (list,),
    "usage": (dict,),
    "delay": (int, float),
    "chunk": (int,),
    "stop_reason": (str,),
    "drop": (bool,),
    "error": (dict,),
    "expect": (str,),
}
_RULE_KEYS = {**_TURN_KEYS, "match": (str,)}
_STOP_REASONS: dict[str, StopReason] = {r: r for r in get_args(StopReason)}
_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "a number", bool: "true or false"}


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
        raise ConfigError(f'scripted backend: {path} must hold a list of turns or {{"rules": [...]}}')
    return data


class ScriptedBackend:
    name = "scripted"

    def __init__(
        self, script: list[dict] | dict | str | Path, *, model: str = "scripted", context_length: int = 128_000
    ):
        data = load_script(script)
        self._rules: list[dict] | None = data.get("rules") if isinstance(data, dict) else None
        if isinstance(data, dict) and not isinstance(self._rules, list):
            raise ConfigError('scripted backend: a script object needs a "rules" list')
        self._turns: list[dict] = list(data) if isinstance(data, list) else []
        for i, turn in enumerate(self._turns):
            _check_turn(turn, f"turn {i + 1} (index {i})", _TURN_KEYS)
        for i, rule in enumerate(self._rules or ()):
            _check_turn(rule, f"rule {i + 1} (index {i})", _RULE_KEYS)
        self.model = model
        self._context_length = context_length
        self.requests: list[list[Message]] = []  # every request's messages, for assertions
        self.tools_seen: list[list[ToolSpec]] = []
        self.failures: list[ScriptError] = []  # every mismatch, even those the loop reported and went on

    @classmethod
    def from_options(cls, model: str | None = None, script: Any = None, **_: Any) -> ScriptedBackend:
        source = script if script is not None else model  # an empty script is one: every request fails
        if source is None or source == "":
            raise ConfigError("scripted backend: give a script (--script FILE, or the file as the model)")
        return cls(source, model=str(model or "scripted"))

    def _next_turn(self, messages: list[Message]) -> dict:
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        if self._rules is not None:
            for rule in self._rules:
                if re.search(rule.get("match") or "", last_user, re.S):
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
                arguments=args if isinstance(args, str) else arguments_text(args),
            )
        if turn.get("drop"):
            return
        usage = turn.get("usage") or {}
        yield UsageChunk(Usage(requests=1, **usage))
        yield _done(turn.get("stop_reason") or ("tool_calls" if calls else "stop"))

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


def _done(stop_reason: str) -> Done:
    """A stop reason ollie knows is passed on (as the provider's word too, unless a plain stop or
    tool use); any other string is "other", with the script's word as the provider's."""
    known = _STOP_REASONS.get(stop_reason)
    if known is None:
        return Done("other", reason=stop_reason)
    return Done(known, reason="" if known in ("stop", "tool_calls") else known)


def _check_turn(turn: Any, where: str, keys: dict[str, tuple[type, ...]]) -> None:
    """A ConfigError naming the turn (or rule) and what is wrong with its shape."""
    if not isinstance(turn, dict):
        raise ConfigError(
            f"scripted backend: {where} must be an object with keys such as text and tool_calls, "
            f"not {type(turn).__name__} {reprlib.repr(turn)}"
        )
    for key, value in turn.items():
        if key not in keys:
            raise ConfigError(f"scripted backend: {where} has an unknown key {key!r}; known keys: {', '.join(keys)}")
        if value is not None and not isinstance(value, keys[key]):
            raise ConfigError(
                f"scripted backend: {where}: {key} must be {_TYPE_NAMES[keys[key][0]]}, "
                f"not {type(value).__name__} {reprlib.repr(value)}"
            )
    for n, call in enumerate(turn.get("tool_calls") or ()):
        if not isinstance(call, dict):
            raise ConfigError(
                f"scripted backend: {where}: tool_calls[{n}] must be an object (name, arguments, id), "
                f"not {type(call).__name__} {reprlib.repr(call)}"
            )
    if unknown := set(turn.get("usage") or ()) - set(Usage.__dataclass_fields__):
        raise ConfigError(
            f"scripted backend: {where}: usage has unknown keys {sorted(unknown)}; known: "
            f"{', '.join(Usage.__dataclass_fields__)}"
        )
    if turn.get("match") is not None:
        try:
            re.compile(turn["match"])
        except re.error as e:
            raise ConfigError(f"scripted backend: {where}: match is no regular expression: {e}") from None
