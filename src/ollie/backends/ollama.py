"""Ollama's native API: /api/chat streamed as NDJSON, /api/tags, /api/show.

Ollama silently drops the start of a prompt longer than its context window, which defaults far
below most models' own. So every request sets `num_ctx` to the model's context length from
/api/show, and `context_length()` reports that same figure so the Core compacts before it.
Tool calls come without ids: each gets a stable one derived from its position in the history,
its index in the turn, its name and its arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from ..textcalls import BadArguments, arguments_text, parse_arguments, stable_call_id
from ..types import (
    BackendError,
    Chunk,
    Done,
    GenerationParams,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    TransientError,
    Usage,
    UsageChunk,
)
from . import http_error

PROVIDER = "ollama"
DEFAULT_URL = "http://localhost:11434"
DEFAULT_MODEL = "llama3.2"

# GenerationParams field → Ollama option
_OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "stop": "stop",
}


def base_url_from_env() -> str:
    """OLLIE_OLLAMA_URL, else OLLAMA_HOST, else the default. Like Ollama's own client, a bare
    host or host:port means http with port 11434 unless given."""
    url = os.environ.get("OLLIE_OLLAMA_URL") or os.environ.get("OLLAMA_HOST") or DEFAULT_URL
    if "://" not in url:
        host, _, path = url.partition("/")
        if ":" not in host.rsplit("]", 1)[-1]:  # no port (an IPv6 literal keeps its colons in brackets)
            host += ":11434"
        url = f"http://{host}/{path}"
    return url.rstrip("/")


class OllamaBackend:
    name = PROVIDER

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        num_ctx: int | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.model = model or DEFAULT_MODEL
        self.base_url = (base_url or base_url_from_env()).rstrip("/")
        self._num_ctx = num_ctx  # None: the model's own context length, from /api/show
        self._shown: dict[str, int | None] = {}  # model → context length from /api/show
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=10.0))

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> OllamaBackend:
        return cls(model, **options)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        body = build_request(self.model, messages, tools, params, await self.context_length())
        turn = len(messages)  # the turn's position in the history: part of each generated call id
        try:
            async with self._http.stream("POST", "/api/chat", json=body) as resp:
                if resp.is_error:
                    raise _status_error(resp.status_code, (await resp.aread()).decode(errors="replace"), resp)
                async for chunk in _chunks(resp.aiter_lines(), turn):
                    yield chunk
        except httpx.TransportError as e:
            raise TransientError(f"network: {e!r} ({self.base_url})", provider=PROVIDER) from e

    async def models(self) -> list[str]:
        data = await self._get_json("GET", "/api/tags")
        return sorted(m["name"] for m in data.get("models") or ())

    async def context_length(self) -> int | None:
        if self._num_ctx:
            return self._num_ctx
        if self.model not in self._shown:
            info = (await self._get_json("POST", "/api/show", {"model": self.model})).get("model_info") or {}
            lengths = [v for k, v in info.items() if k.endswith(".context_length") and isinstance(v, int)]
            self._shown[self.model] = lengths[0] if lengths else None
        return self._shown[self.model]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get_json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            resp = await self._http.request(method, path, json=body)
        except httpx.TransportError as e:
            raise TransientError(f"network: {e!r} ({self.base_url})", provider=PROVIDER) from e
        if resp.is_error:
            raise _status_error(resp.status_code, resp.text, resp)
        return resp.json()


# ---- the request --------------------------------------------------------------------------------


def build_request(
    model: str, messages: list[Message], tools: list[ToolSpec], params: GenerationParams, num_ctx: int | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [_message(m) for m in messages], "stream": True}
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in tools
        ]
    options = {opt: v for key, opt in _OPTIONS.items() if (v := getattr(params, key)) is not None}
    if max_tokens := params.max_tokens or params.max_completion_tokens:
        options["num_predict"] = max_tokens
    if num_ctx:
        options["num_ctx"] = num_ctx
    if options:
        body["options"] = options
    if params.reasoning_effort:
        body["think"] = params.reasoning_effort  # gpt-oss takes a level; others treat it as on
    elif params.reasoning_budget:
        body["think"] = True
    if fmt := params.response_format:
        # {"type": "json_schema", "json_schema": {"schema": …}} → the schema; json_object → "json"
        schema = (fmt.get("json_schema") or {}).get("schema")
        body["format"] = schema if schema else "json"
    return body


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"function": {"name": c.name, "arguments": _arguments(c.arguments)}} for c in m.tool_calls]
    if m.role == "tool" and m.name:
        out["tool_name"] = m.name
    return out


def _arguments(text: str) -> dict[str, Any]:
    """An object, as Ollama refuses any other arguments (on every later request); arguments that
    make none are sent as they were written."""
    try:
        return parse_arguments(text)
    except BadArguments:
        return {"_raw": text}


# ---- the answer ---------------------------------------------------------------------------------


async def _chunks(lines: AsyncIterator[str], turn: int) -> AsyncIterator[Chunk]:
    calls = 0
    async for line in lines:
        if not line.strip():
            continue
        try:
            chunks = list(_line_chunks(json.loads(line), turn, calls))
        except RecursionError:  # the JSON decoder gave up on it
            raise BackendError(
                f"malformed stream line, nested too deeply to read: {line[:100]!r}…", provider=PROVIDER
            ) from None
        except (ValueError, AttributeError, TypeError):  # not JSON, or not shaped as Ollama's lines
            raise BackendError(f"malformed stream line: {line[:200]!r}", provider=PROVIDER) from None
        for chunk in chunks:
            yield chunk
            if isinstance(chunk, Done):
                return
            calls += isinstance(chunk, ToolCallDelta)
    raise TransientError("the stream ended before its final (done) line", provider=PROVIDER)


def _line_chunks(obj: dict[str, Any], turn: int, calls: int) -> Iterator[Chunk]:
    """The chunks of one line; `calls` of the answer came before it."""
    if err := obj.get("error"):  # an error after the stream started has no status of its own
        raise http_error(PROVIDER, None, str(err))
    msg = obj.get("message") or {}
    if thinking := msg.get("thinking"):
        yield ReasoningDelta(thinking)
    if content := msg.get("content"):
        yield TextDelta(content)
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        args = fn.get("arguments") or {}
        if not isinstance(args, str):  # an object, as Ollama sends it; some models' templates give text
            args = arguments_text(args)
        call_id = call.get("id") or stable_call_id(turn, calls, fn.get("name", ""), args)
        yield ToolCallDelta(index=calls, id=call_id, name=fn.get("name", ""), arguments=args)
        calls += 1
    if obj.get("done"):
        usage = Usage(
            input_tokens=obj.get("prompt_eval_count") or 0, output_tokens=obj.get("eval_count") or 0, requests=1
        )
        yield UsageChunk(usage)
        yield _done(obj.get("done_reason"), calls)


def _done(done_reason: Any, calls: int) -> Done:
    """Ollama says stop (also when the model called tools) or length; any other done_reason is
    "other", with Ollama's word for it."""
    raw = done_reason or ""
    if not isinstance(raw, str):
        raise TypeError(f"done_reason {done_reason!r}")  # a malformed line
    if raw == "length":
        return Done("length", reason=raw)
    if calls:
        return Done("tool_calls")
    return Done("stop") if raw == "stop" or not raw else Done("other", reason=raw)


def _status_error(status: int, text: str, resp: httpx.Response) -> Exception:
    try:
        message = json.loads(text).get("error") or text
    except (ValueError, AttributeError):
        message = text
    return http_error(PROVIDER, status, str(message).strip() or resp.reason_phrase, resp.headers.get("retry-after"))
