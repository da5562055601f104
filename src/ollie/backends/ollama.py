"""Ollama's native API over ollie's own HTTP/1.1 client (`_http`, imported on first request):
/api/chat streamed as NDJSON, /api/tags, /api/show.

Ollama silently drops the start of a prompt longer than its context window, which defaults far
below most models' own. So every request sets `num_ctx` to the model's context length from
/api/show, and `context_length()` reports that same figure so the Core compacts before it.
Tool calls come without ids: each gets a stable one derived from its position in the history,
its index in the turn, its name and its arguments.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ..textcalls import arguments_text, stable_call_id
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
from . import coalesce, http_error, json_value, object_arguments, parse_url, status_error, transport_error, url_setting
from .openai import _tools_json

if TYPE_CHECKING:
    from . import _http

PROVIDER = "ollama"
SHOWN_TTL = 60.0
# What ends a stream (its last line, an error): the held lines go to their reader at once
# (openai.py's _END says why).
_END = tuple(map(re.compile, (rb'"done"\s*:\s*true', rb'"error"\s*:')))
# event loop -> (URL, model) -> (when asked, its context length)
_SHOWN: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], tuple[float, int | None]]] = weakref.WeakKeyDictionary()
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
        self._setting = "" if base_url else url_setting(("OLLIE_OLLAMA_URL", "OLLAMA_HOST"))
        self.base_url = (base_url or base_url_from_env()).rstrip("/")
        self._num_ctx = num_ctx  # None: the model's own context length, from /api/show
        self._shown: dict[str, int | None] = {}  # model → context length from /api/show
        self._timeout = timeout
        self._url: _http.URL | None = None  # base_url parsed, on first request
        self._chat_url: _http.URL | None = None
        self._send_headers: dict[str, str] = {}

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> OllamaBackend:
        return cls(model, **options)

    def _http(self) -> tuple[Any, _http.URL]:
        """The HTTP client module and the server's URL, parsed once."""
        from . import _http

        if self._url is None:
            self._url = parse_url("ollama", self.base_url, self._setting)
            self._chat_url = self._url.join("/api/chat")
            self._send_headers = _http.json_headers({"accept": "application/x-ndjson, application/json"})
        return _http, self._url

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        http, _ = self._http()
        body = build_request(self.model, messages, [], params, await self.context_length())
        payload = _dumps(body)
        if tools:  # the tools' JSON is OpenAI's, made when they change (openai.py says why)
            payload = b'%s,"tools":%s}' % (payload[:-1], _tools_json(tools))
        turn = len(messages)  # the turn's position in the history: part of each generated call id
        try:
            response = await http.request(
                "POST", self._chat_url, self._send_headers, payload, read_timeout=self._timeout
            )
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        try:
            if response.status >= 300:
                raise await status_error(PROVIDER, response)
            await response.expect("lines")
            async for chunk in _chunks(response.line_batches(), turn):
                yield chunk
                response.hold(_END)  # after the first content, what follows may gather (openai.py)
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        finally:
            await response.aclose()

    async def models(self) -> list[str]:
        data = await self._get_json("GET", "/api/tags")
        return sorted(str(m["name"]) for m in data.get("models") or () if isinstance(m, dict) and m.get("name"))

    async def context_length(self) -> int | None:
        """The model's context length from /api/show: asked once by this backend, and once per
        SHOWN_TTL seconds by all the backends (sessions) of this event loop that use that server."""
        if self._num_ctx:
            return self._num_ctx
        if self.model not in self._shown:
            cache = _SHOWN.setdefault(asyncio.get_running_loop(), {})
            key = (self.base_url, self.model)
            shown = cache.get(key)
            if shown is None or time.monotonic() - shown[0] > SHOWN_TTL:
                info = (await self._get_json("POST", "/api/show", {"model": self.model})).get("model_info")
                lengths = [
                    v
                    for k, v in (info.items() if isinstance(info, dict) else ())
                    if k.endswith(".context_length") and isinstance(v, int)
                ]
                shown = cache[key] = (time.monotonic(), lengths[0] if lengths else None)
            self._shown[self.model] = shown[1]
        return self._shown[self.model]

    async def aclose(self) -> None:
        pass  # the connections are the event loop's pool's (_http), shared by every backend on the loop

    async def _get_json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        http, base = self._http()
        url = base.join(path)
        try:
            response = await http.request(
                method, url, self._send_headers, b"" if body is None else _dumps(body), read_timeout=self._timeout
            )
            try:
                if response.status >= 300:
                    raise await status_error(PROVIDER, response)
                raw = await response.read()
            finally:
                await response.aclose()
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise BackendError(
                f"{method} {url.display}: the answer is not a JSON object: {http.snippet(raw)}", provider=PROVIDER
            )
        return data


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
    return object_arguments(text)


# ---- the answer ---------------------------------------------------------------------------------


async def _chunks(batches: AsyncIterator[list[str]], turn: int) -> AsyncIterator[Chunk]:
    """The answer's chunks from its lines, as one read brought them: handled as one (`coalesce`)."""
    calls = 0
    done = False  # after the done line the rest of the body is read (the connection is reused), not parsed
    async for lines in batches:
        out: list[Chunk] = []
        for line in lines:
            if done or not line.strip():
                continue
            try:
                chunks = list(_line_chunks(json_value(line), turn, calls))
            except RecursionError:  # the JSON decoder gave up on it
                raise BackendError(
                    f"malformed stream line, nested too deeply to read: {line[:100]!r}…", provider=PROVIDER
                ) from None
            except (ValueError, AttributeError, TypeError):  # not JSON, or not shaped as Ollama's lines
                raise BackendError(f"malformed stream line: {line[:200]!r}", provider=PROVIDER) from None
            for chunk in chunks:
                out.append(chunk)
                if isinstance(chunk, Done):
                    done = True
                    break
                calls += isinstance(chunk, ToolCallDelta)
        for chunk in coalesce(out):
            yield chunk
    if not done:
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


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps with options makes one a call


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()
