"""OpenAI-compatible Chat Completions over ollie's own HTTP/1.1 client (`_http`, imported on first
request): a JSON body out, server-sent events back, parsed as plain dicts. The `openai` SDK's
transport cost ~3 ms of the event loop's CPU per request, 30 times a bare client's (_http's
docstring). Retries are the Core's business: a failure is raised as the BackendError it is, in
the words every backend uses (`transport_error`, `status_error`).

Configuration: OLLIE_OPENAI_URL (without /v1) or OPENAI_BASE_URL, OLLIE_OPENAI_KEY or OPENAI_API_KEY.
Presets (openrouter, copilot, local servers) are this backend with other defaults: see presets.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ..types import (
    BackendError,
    Chunk,
    ConfigError,
    Done,
    GenerationParams,
    Message,
    ReasoningDelta,
    StopReason,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageChunk,
)
from . import coalesce, http_error, json_value, parse_url, status_error, transport_error, url_setting

if TYPE_CHECKING:
    from . import _http

OPENAI_URL = "https://api.openai.com/v1"
# event loop -> the same key -> (when asked, the answer to GET /models): a thousand sessions opened on
# one server ask once, not each (a request each cost ~2 ms of the loop); kept MODELS_TTL seconds
_MODELS: weakref.WeakKeyDictionary[Any, dict[tuple, tuple[float, asyncio.Future[list[dict[str, Any]]]]]] = (
    weakref.WeakKeyDictionary()
)
MODELS_TTL = 60.0
# What ends an answer's stream (a finish reason, the end marker, a failure): seen, the events
# held for their reader (_http.STREAM_HOLD) go to it at once. A false match only stops the holding.
# (Patterns looked for one by one: _http.Ends says why.)
_END = tuple(map(re.compile, (rb'"finish_reason"\s*:\s*"', rb"\[DONE\]", rb'"error"\s*:')))
# finish_reason → stop reason; any other value is "other" (the raw value goes in Done.reason)
_FINISH: dict[str, StopReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
    # Servers that speak the wire in their own words: Together says "eos", TGI and watsonx "eos_token".
    "eos": "stop",
    "eos_token": "stop",
}
# Parameters the Chat Completions API takes by these names; the rest go in the body as local servers
# (llama.cpp, vLLM) spell them.
_BODY_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_completion_tokens",
    "stop": "stop",
    "response_format": "response_format",
    "reasoning_effort": "reasoning_effort",
}


def with_v1(url: str) -> str:
    """A server's root URL as the API's base: OLLIE_*_URL variables are given without /v1."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def env_url() -> str:
    if url := os.environ.get("OLLIE_OPENAI_URL"):
        return with_v1(url)
    return os.environ.get("OPENAI_BASE_URL") or OPENAI_URL


class OpenAIBackend:
    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        name: str = "openai",
        headers: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        prepare: Callable[[dict[str, Any]], None] | None = None,
        key_vars: tuple[str, ...] = ("OLLIE_OPENAI_KEY", "OPENAI_API_KEY"),
        default_model: str = "gpt-4o-mini",
        setting: str | None = None,
        timeout: float | None = None,
    ):
        """`prepare(body)` may edit each request body in place (a preset's cache_control, say);
        `setting` says where the URL came from, for messages (by default: the URL variables, or
        nothing when `base_url` is given); `timeout`: seconds the server may stay silent."""
        self.name = name
        if setting is None:
            setting = "" if base_url else url_setting(("OLLIE_OPENAI_URL", "OPENAI_BASE_URL"))
        self._setting = setting
        self.base_url = (base_url or env_url()).rstrip("/")
        self._timeout = timeout
        self.model = model or os.environ.get("OLLIE_MODEL") or default_model
        if api_key is None:
            api_key = next((os.environ[v] for v in key_vars if os.environ.get(v)), None)
        if api_key is None and self.base_url == OPENAI_URL:
            raise ConfigError(
                f"{name}: no API key: set {' or '.join(key_vars)} (or OLLIE_OPENAI_URL for a local server)"
            )
        self._api_key = api_key or "none"  # local servers take any key
        self._headers = headers or {}
        self._extra_body = extra_body or {}
        self._prepare = prepare
        self._url: _http.URL | None = None  # base_url parsed, on first request
        self._chat_url: _http.URL | None = None
        self._send_headers: dict[str, str] = {}
        self._model_info: list[dict[str, Any]] | None = None

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> OpenAIBackend:
        return cls(model, **options)

    def _key(self) -> tuple:
        return (self.base_url, self._api_key, tuple(sorted(self._headers.items())))

    def _http(self) -> tuple[Any, _http.URL]:
        """The HTTP client module and this backend's base URL, parsed once."""
        from . import _http

        if self._url is None:
            self._url = parse_url(self.name, self.base_url, self._setting)
            self._chat_url = self._url.join("/chat/completions")
            self._send_headers = _http.json_headers({"authorization": f"Bearer {self._api_key}", **self._headers})
        return _http, self._url

    # ---- the request ------------------------------------------------------------------------------
    def request_body(self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = _wire_tools(tools)
        for key, value in params.nonempty().items():
            if key in _BODY_PARAMS:
                body[_BODY_PARAMS[key]] = value
        body.update(self._extra_body)
        if self._prepare:
            self._prepare(body)
        return body

    def _payload(self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams) -> bytes:
        """The request body as JSON. The tools' schemas are most of it (execute_code's is 2.6 KB, 30 us
        to encode: a tenth of a step's CPU) and the same at every request, so their JSON is made
        when they change (`_tools_json`) and put at the body's end as it is; unless `prepare` (which
        may edit them) or `extra_body` (which may replace them) has a say."""
        if not tools or self._prepare is not None or "tools" in self._extra_body:
            return _dumps(self.request_body(messages, tools, params))
        body = _dumps(self.request_body(messages, [], params))
        return b'%s,"tools":%s}' % (body[:-1], _tools_json(tools))

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        http, _ = self._http()
        payload = self._payload(messages, tools, params)
        try:
            response = await http.request(
                "POST", self._chat_url, self._send_headers, payload, read_timeout=self._timeout or http.READ_TIMEOUT
            )
        except http.HTTPError as e:
            raise self._unreachable(e) from None
        done: list[Done] = []  # held back: the usage chunk comes after the finish_reason
        try:
            if response.status >= 300:
                raise await status_error(self.name, response)
            await response.expect("events")
            async for chunks in self._batches(response, done):  # what came meanwhile, handled as one
                for chunk in coalesce(chunks):
                    yield chunk
                if chunks:  # the answer's first content came at once; what follows may gather
                    response.hold(_END)
        except http.HTTPError as e:
            raise self._unreachable(e) from None
        finally:
            await response.aclose()
        for chunk in done:
            yield chunk

    async def _batches(self, response: Any, done: list[Done]) -> AsyncIterator[list[Chunk]]:
        """The chunks of each list of events but the Done, which goes to `done`. After `data: [DONE]`
        the rest of the body is read (the connection is reused), not parsed."""
        ended = False
        async for batch in response.event_batches():
            chunks: list[Chunk] = []
            for _, data in batch:
                if ended:
                    continue
                if data.startswith("[DONE]"):
                    ended = True
                    continue
                for chunk in self._parse(_loads(data, self.name)):
                    if isinstance(chunk, Done):
                        done[:] = [chunk]
                    else:
                        chunks.append(chunk)
            yield chunks

    def _unreachable(self, e: Exception) -> BackendError:
        """A failure below the API, in the words every backend uses."""
        return transport_error(self.name, e, self._setting)

    def _parse(self, data: Any) -> list[Chunk]:
        if isinstance(data, dict) and data.get("error"):  # OpenRouter and vLLM report a failure after the 200 so
            error = data["error"]
            message = error.get("message") if isinstance(error, dict) else None
            code = error.get("code") if isinstance(error, dict) else None  # OpenRouter: the upstream's HTTP status
            raise http_error(
                self.name,
                code if isinstance(code, int) else None,
                message if isinstance(message, str) and message else "An error occurred during streaming",
            )
        try:
            return self._chunks(data)
        except (AttributeError, TypeError):  # a chunk not shaped as the API's
            raise BackendError(f"malformed stream chunk: {str(data)[:200]}", provider=self.name) from None

    def _chunks(self, data: dict[str, Any]) -> list[Chunk]:
        out: list[Chunk] = []
        if usage := data.get("usage"):
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") or 0
            out.append(
                UsageChunk(
                    Usage(
                        input_tokens=(usage.get("prompt_tokens") or 0) - cached,
                        output_tokens=usage.get("completion_tokens") or 0,
                        cache_read_tokens=cached,
                        cache_write_tokens=details.get("cache_write_tokens") or 0,
                        requests=1,
                        cost=usage.get("cost"),
                    )
                )
            )
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                out.append(ReasoningDelta(reasoning))
            if content := delta.get("content"):
                out.append(TextDelta(content))
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                out.append(
                    ToolCallDelta(
                        call.get("index", 0), call.get("id") or "", fn.get("name") or "", fn.get("arguments") or ""
                    )
                )
            if reason := choice.get("finish_reason"):
                out.append(_done(reason))
        return out

    # ---- models ---------------------------------------------------------------------------------
    async def _models(self, fresh: bool = False) -> list[dict[str, Any]]:
        """The server's model list: this backend's answer, else one that another backend of this loop
        with the same URL, key and headers got less than MODELS_TTL seconds ago (or is getting)."""
        if self._model_info is not None and not fresh:
            return self._model_info
        shared = _MODELS.setdefault(asyncio.get_running_loop(), {})
        key = self._key()
        asked = shared.get(key)
        if fresh or asked is None or time.monotonic() - asked[0] > MODELS_TTL or asked[1].cancelled():
            task = asyncio.ensure_future(self._fetch_models())
            shared[key] = asked = (time.monotonic(), task)
            task.add_done_callback(lambda t: _forget_failed(shared, key, t))
        self._model_info = await asyncio.shield(asked[1])
        return self._model_info

    async def _fetch_models(self) -> list[dict[str, Any]]:
        http, base = self._http()
        try:
            response = await http.request("GET", base.join("/models"), self._send_headers)
            try:
                if response.status >= 300:
                    raise await status_error(self.name, response)
                raw = await response.read()
            finally:
                await response.aclose()
        except http.HTTPError as e:
            raise self._unreachable(e) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise BackendError(
                f"GET {self.base_url}/models: the answer is not JSON: {http.snippet(raw)}", provider=self.name
            ) from None
        models = data.get("data") if isinstance(data, dict) else None
        return [m for m in models or () if isinstance(m, dict)]

    async def models(self) -> list[str]:
        return sorted(str(m.get("id")) for m in await self._models(fresh=True))

    async def context_length(self) -> int | None:
        """What the server says of the model (OpenRouter, vLLM and llama.cpp say it), else None."""
        for m in await self._models():
            if m.get("id") == self.model:
                meta = m.get("meta") or {}
                for value in (
                    m.get("context_length"),
                    m.get("max_model_len"),
                    meta.get("n_ctx"),
                    meta.get("n_ctx_train"),
                ):
                    if isinstance(value, int) and value > 0:
                        return value
        return None

    async def aclose(self) -> None:
        pass  # the connections are the event loop's pool's (_http), shared by every backend on the loop


def _forget_failed(shared: dict[tuple, Any], key: tuple, task: asyncio.Future[Any]) -> None:
    """A failed GET /models is not kept: the next backend asks again."""
    if (task.cancelled() or task.exception() is not None) and shared.get(key, (0, None))[1] is task:
        del shared[key]


def _done(finish_reason: Any) -> Done:
    if not isinstance(finish_reason, str):
        raise TypeError(f"finish_reason {finish_reason!r}")  # a malformed chunk
    stop = _FINISH.get(finish_reason, "other")
    return Done(stop, reason="" if finish_reason in ("stop", "tool_calls", "function_call") else finish_reason)


# The tools last encoded and their JSON, whichever backend sent them: a server's sessions of one agent
# offer equal tools, most often the very same schema objects, which compare at no cost. (A schema is a
# value, never edited in place: a server whose tools change lists new ones.)
_TOOLS_JSON: tuple[list[ToolSpec], bytes] = ([], b"[]")


def _tools_json(tools: list[ToolSpec]) -> bytes:
    global _TOOLS_JSON
    if _TOOLS_JSON[0] != tools:
        _TOOLS_JSON = (list(tools), _dumps(_wire_tools(tools)))
    return _TOOLS_JSON[1]


def _wire_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
        for t in tools
    ]


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps with options makes one a call


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def _wire_message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}


def _loads(data: str, provider: str) -> Any:
    """An event's data as JSON; data that is no JSON is a BackendError that quotes the decoder."""
    try:
        return json_value(data)
    except json.JSONDecodeError as e:
        raise BackendError(f"malformed stream chunk: {e}", provider=provider) from None
    except RecursionError:
        raise BackendError("malformed stream chunk: nested too deeply to read", provider=provider) from None
