"""Anthropic Messages API over ollie's own HTTP/1.1 client (`_http`, imported on first request), as
the OpenAI-compatible backends speak theirs: a JSON body out, server-sent events back, read as
plain dicts. (The official SDK cost 2.4 ms of the event loop's CPU per request, 16 times this,
and over a second to import.)

Thinking blocks and their signatures come back in `Done.provider_data["anthropic_thinking"]`; the
Core stores them on the assistant message, and they are sent back before that message's text and
tool calls on later requests that have thinking on, as the API requires.

Configuration: OLLIE_ANTHROPIC_KEY or ANTHROPIC_API_KEY; OLLIE_ANTHROPIC_URL or ANTHROPIC_BASE_URL
(the API's root, as the SDK takes it: without /v1).
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
from urllib.parse import quote

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
    TransientError,
    Usage,
    UsageChunk,
)
from . import (
    ERROR_TYPE_STATUS,
    coalesce,
    http_error,
    json_value,
    object_arguments,
    parse_url,
    status_error,
    transport_error,
    url_setting,
)

if TYPE_CHECKING:
    from . import _http

PROVIDER = "anthropic"
WINDOW_TTL = 60.0
# What ends a stream (the stop reason's message_delta, message_stop, an error): the held events
# go to their reader at once (openai.py's _END says why).
_END = tuple(map(re.compile, (rb"message_delta", rb"message_stop", rb'"type"\s*:\s*"error"', rb"event:\s*error")))
# event loop -> (URL, key, model) -> (when asked, its input window)
_WINDOWS: weakref.WeakKeyDictionary[Any, dict[tuple[str, str, str], tuple[float, int]]] = weakref.WeakKeyDictionary()
DEFAULT_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 8192
THINKING_KEY = "anthropic_thinking"  # provider_data key of the thinking blocks
LARGE_TOOL_RESULT = 4096  # characters (~1k tokens, the smallest cacheable prefix): cache from here
EFFORT_BUDGETS = {"low": 2048, "medium": 8192, "high": 24576}  # reasoning_effort without a budget
_EPHEMERAL = {"type": "ephemeral"}
_SAMPLING = ("temperature", "top_p", "top_k")  # thinking allows none of these but top_p >= 0.95

# stop_reason → ours; any other (pause_turn, a newer one) is "other", its raw value in Done.reason
_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
}


class AnthropicBackend:
    name = PROVIDER

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        api_key = api_key or os.environ.get("OLLIE_ANTHROPIC_KEY") or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise ConfigError("anthropic: no API key; set OLLIE_ANTHROPIC_KEY or ANTHROPIC_API_KEY")
        self._setting = "" if base_url else url_setting(("OLLIE_ANTHROPIC_URL", "ANTHROPIC_BASE_URL"))
        url = (
            base_url or os.environ.get("OLLIE_ANTHROPIC_URL") or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_URL
        ).rstrip("/")
        self.base_url = url[:-3] if url.endswith("/v1") else url  # the endpoints add /v1
        self.model = model or DEFAULT_MODEL
        self._api_key = api_key
        self._timeout = timeout
        self._url: _http.URL | None = None  # base_url parsed, on first request
        self._messages_url: _http.URL | None = None
        self._send_headers: dict[str, str] = {}
        self._context_length: int | None = None

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> AnthropicBackend:
        return cls(model, **options)

    def _http(self) -> tuple[Any, _http.URL]:
        """The HTTP client module and the API's root URL, parsed once."""
        from . import _http

        if self._url is None:
            self._url = parse_url("anthropic", self.base_url, self._setting)
            self._messages_url = self._url.join("/v1/messages")
            self._send_headers = _http.json_headers({"x-api-key": self._api_key, "anthropic-version": API_VERSION})
        return _http, self._url

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        http, _ = self._http()
        request, headers = build_request(self.model, messages, tools, params)
        request["stream"] = True
        send = {**self._send_headers, **headers} if headers else self._send_headers
        try:
            response = await http.request(
                "POST", self._messages_url, send, _payload(request, tools), read_timeout=self._timeout
            )
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        answer = _Answer()
        ended = False  # after message_stop the rest of the body is read (the connection is reused), not parsed
        try:
            if response.status >= 300:
                raise await status_error(PROVIDER, response)
            await response.expect("events")
            async for batch in response.event_batches():  # what came meanwhile, handled as one
                chunks: list[Chunk] = []
                for _, data in batch:
                    if ended:
                        continue
                    event = _loads(data)
                    try:
                        if event.get("type") == "message_stop":
                            ended = True
                            continue
                        chunks.extend(answer.read(event))
                    except (AttributeError, KeyError, TypeError, ValueError, IndexError):  # not shaped as the API's
                        raise BackendError(f"malformed stream event: {data[:200]}", provider=PROVIDER) from None
                for chunk in coalesce(chunks):
                    yield chunk
                if chunks:  # the answer's first content came at once; what follows may gather
                    response.hold(_END)
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        finally:
            await response.aclose()
        if not ended:
            raise TransientError("the stream ended before message_stop", provider=PROVIDER)
        yield UsageChunk(answer.usage)
        yield answer.done()

    async def _get_json(self, path: str) -> Any:
        http, base = self._http()
        try:
            response = await http.request("GET", base.join(path), self._send_headers, read_timeout=60.0)
            try:
                if response.status >= 300:
                    raise await status_error(PROVIDER, response)
                raw = await response.read()
            finally:
                await response.aclose()
        except http.HTTPError as e:
            raise transport_error(PROVIDER, e, self._setting) from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise BackendError(
                f"GET {base.join(path).display}: the answer is not JSON: {http.snippet(raw)}", provider=PROVIDER
            ) from None

    async def models(self) -> list[str]:
        ids: list[str] = []
        after = ""
        for _ in range(100):  # pages of 1000: more than any account has
            data = await self._get_json(f"/v1/models?limit=1000{f'&after_id={quote(after)}' if after else ''}")
            if not isinstance(data, dict):
                break
            ids += [str(m["id"]) for m in data.get("data") or () if isinstance(m, dict) and m.get("id")]
            last = data.get("last_id")
            if not data.get("has_more") or not isinstance(last, str) or not last:
                break
            after = last
        return sorted(ids)

    async def context_length(self) -> int | None:
        """The model's input window from the models API; 200k (every Claude model's) if it says none.
        Asked once by this backend, and once per WINDOW_TTL seconds by all the backends (sessions)
        of this event loop with the same URL, key and model."""
        if self._context_length is None:
            cache = _WINDOWS.setdefault(asyncio.get_running_loop(), {})
            key = (self.base_url, self._api_key, self.model)
            known = cache.get(key)
            if known is None or time.monotonic() - known[0] > WINDOW_TTL:
                try:
                    info = await self._get_json(f"/v1/models/{quote(self.model, safe='')}")
                except Exception:  # an alias the API does not list, or no network: the common window
                    return 200_000
                window = info.get("max_input_tokens") if isinstance(info, dict) else None
                known = cache[key] = (
                    time.monotonic(),
                    window if isinstance(window, int) and window > 0 else 200_000,
                )
            self._context_length = known[1]
        return self._context_length

    async def aclose(self) -> None:
        pass  # the connections are the event loop's pool's (_http), shared by every backend on the loop


# ---- the request --------------------------------------------------------------------------------


def build_request(
    model: str, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
) -> tuple[dict[str, Any], dict[str, str]]:
    """The Messages API request body and extra headers for one stream."""
    budget = params.reasoning_budget or EFFORT_BUDGETS.get(params.reasoning_effort or "")
    max_tokens = params.max_tokens or params.max_completion_tokens or DEFAULT_MAX_TOKENS
    if budget and max_tokens <= budget:  # the budget is part of max_tokens: leave room for the answer
        max_tokens = budget + DEFAULT_MAX_TOKENS
    req: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": _messages(messages, with_thinking=bool(budget), tools_offered=bool(tools)),
    }
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    if system:
        req["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    if tools:
        req["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]
        req["tools"][-1]["cache_control"] = _EPHEMERAL
    if params.stop:
        req["stop_sequences"] = params.stop
    headers: dict[str, str] = {}
    if budget:
        # Thinking allows no temperature but 1, no top_k, and top_p only from 0.95.
        req["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if params.top_p is not None and params.top_p >= 0.95:
            req["top_p"] = params.top_p
        if tools:
            headers["anthropic-beta"] = "interleaved-thinking-2025-05-14"
    else:
        for key in _SAMPLING:
            if (value := getattr(params, key)) is not None:
                req[key] = value
    return req, headers


def _messages(messages: list[Message], with_thinking: bool, tools_offered: bool) -> list[dict[str, Any]]:
    """API messages; consecutive messages of one API role (tool results, then a user prompt)
    become one message, since the API wants user and assistant turns to alternate.

    The API refuses tool_use and tool_result blocks in a request that offers no tools (the last
    answer after a step budget ran out, say): then past calls and results are sent as text, and
    thinking blocks, which only a tool-use loop needs back, are left out."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        role = "assistant" if m.role == "assistant" else "user"
        if role == "assistant":
            blocks = _assistant_blocks(m, with_thinking and tools_offered, calls_as_text=not tools_offered)
        else:
            blocks = _user_blocks(m, result_as_text=not tools_offered)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    _cache_large_last_tool_result(out)
    return out


def _user_blocks(m: Message, result_as_text: bool) -> list[dict[str, Any]]:
    if m.role == "tool" and result_as_text:
        return [{"type": "text", "text": f"[Tool result{' (error)' if m.is_error else ''}]: {m.content}"}]
    if m.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
        if m.is_error:
            block["is_error"] = True
        return [block]
    return [{"type": "text", "text": m.content}] if m.content else []


def _assistant_blocks(m: Message, with_thinking: bool, calls_as_text: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = list(m.provider_data.get(THINKING_KEY, ())) if with_thinking else []
    if m.content:
        blocks.append({"type": "text", "text": m.content})
    for call in m.tool_calls:
        if calls_as_text:
            blocks.append({"type": "text", "text": f"[Tool call: {call.name}({call.arguments})]"})
        else:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    """Arguments as the object the API wants; anything else (text that is not JSON, a JSON
    array from another model, nesting too deep) is sent as it was written, since the API refuses
    a history with a non-object input on every later request."""
    return object_arguments(arguments)


def _cache_large_last_tool_result(out: list[dict[str, Any]]) -> None:
    if not out or out[-1]["role"] != "user":
        return
    results = [b for b in out[-1]["content"] if b["type"] == "tool_result"]
    if results and len(results[-1]["content"]) >= LARGE_TOOL_RESULT:
        results[-1]["cache_control"] = _EPHEMERAL


# ---- the answer ---------------------------------------------------------------------------------


class _Answer:
    """What the events of one answer built up so far. Tool calls are numbered in the order their
    blocks start."""

    def __init__(self) -> None:
        self.usage = Usage(requests=1)
        self.tool_index: dict[int, int] = {}  # content block index → tool call index
        self.tool_has_input: set[int] = set()
        self.thinking: dict[int, dict[str, Any]] = {}  # content block index → block to send back
        self.stop: StopReason = "other"  # until message_delta says
        self.reason = ""  # the API's stop_reason, unless it is a plain stop or tool use

    def read(self, ev: dict[str, Any]) -> Iterator[Chunk]:
        """The chunks of one event before message_stop (events of other types carry none)."""
        kind = ev["type"]
        if kind == "content_block_delta":
            yield from self._block_delta(ev["index"], ev["delta"])
        elif kind == "content_block_start":
            yield from self._block_start(ev["index"], ev["content_block"])
        elif kind == "content_block_stop":
            index = ev["index"]
            if index in self.tool_index and index not in self.tool_has_input:
                yield ToolCallDelta(index=self.tool_index[index], arguments="{}")
        elif kind == "message_start":
            _read_usage(self.usage, ev["message"].get("usage"))
        elif kind == "message_delta":
            raw = ev["delta"].get("stop_reason") or ""
            self.stop = _STOP_REASONS.get(raw, "other")
            self.reason = "" if self.stop in ("stop", "tool_calls") else raw
            _read_usage(self.usage, ev.get("usage"))
        elif kind == "error":  # an error after the 200: its type says which status it stands for
            error = ev.get("error") or {}
            message = error.get("message") or "an error event in the stream"
            raise http_error(PROVIDER, ERROR_TYPE_STATUS.get(error.get("type") or "", 500), str(message))

    def _block_start(self, index: int, block: dict[str, Any]) -> Iterator[Chunk]:
        kind = block["type"]
        if kind == "tool_use":
            self.tool_index[index] = len(self.tool_index)
            yield ToolCallDelta(index=self.tool_index[index], id=block["id"], name=block["name"])
        elif kind == "thinking":
            self.thinking[index] = {
                "type": "thinking",
                "thinking": block.get("thinking") or "",
                "signature": block.get("signature") or "",
            }
        elif kind == "redacted_thinking":
            self.thinking[index] = {"type": "redacted_thinking", "data": block["data"]}

    def _block_delta(self, index: int, d: dict[str, Any]) -> Iterator[Chunk]:
        kind = d["type"]
        if kind == "text_delta":
            yield TextDelta(d["text"])
        elif kind == "input_json_delta":
            if partial := d["partial_json"]:
                self.tool_has_input.add(index)
                yield ToolCallDelta(index=self.tool_index[index], arguments=partial)
        elif kind == "thinking_delta":
            self.thinking[index]["thinking"] += d["thinking"]
            yield ReasoningDelta(d["thinking"])
        elif kind == "signature_delta":
            self.thinking[index]["signature"] += d["signature"]

    def done(self) -> Done:
        thinking = self.thinking
        data = {THINKING_KEY: [thinking[i] for i in sorted(thinking)]} if thinking else {}
        return Done(stop_reason=self.stop, provider_data=data, reason=self.reason)


_USAGE_FIELDS = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_input_tokens", "cache_read_tokens"),
    ("cache_creation_input_tokens", "cache_write_tokens"),
)


def _read_usage(usage: Usage, u: Any) -> None:
    """message_start carries the input counts; message_delta the running output count (and,
    on newer API versions, the input counts again)."""
    if not u:
        return
    for attr, field in _USAGE_FIELDS:
        if (value := u.get(attr)) is not None:
            setattr(usage, field, value)


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps with options makes one a call


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


# The tools last encoded and their JSON: the same at every request of a session, and most of its
# body (as in openai.py, whose reasons hold here).
_TOOLS_JSON: tuple[list[ToolSpec], bytes] = ([], b"[]")


def _payload(request: dict[str, Any], tools: list[ToolSpec]) -> bytes:
    """The request as JSON, its tools' JSON made only when they change and put at its end."""
    global _TOOLS_JSON
    wire_tools = request.pop("tools", None)
    if wire_tools is None:
        return _dumps(request)
    if _TOOLS_JSON[0] != tools:
        _TOOLS_JSON = (list(tools), _dumps(wire_tools))
    return b'%s,"tools":%s}' % (_dumps(request)[:-1], _TOOLS_JSON[1])


def _loads(data: str) -> dict[str, Any]:
    """An event's data as a JSON object; anything else is a BackendError that says what."""
    try:
        event = json_value(data)
    except json.JSONDecodeError as e:
        raise BackendError(f"malformed stream event: {e}", provider=PROVIDER) from None
    except RecursionError:
        raise BackendError("malformed stream event: nested too deeply to read", provider=PROVIDER) from None
    if not isinstance(event, dict):
        raise BackendError(f"malformed stream event: {data[:200]}", provider=PROVIDER)
    return event
