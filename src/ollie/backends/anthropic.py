"""Anthropic Messages API on the official SDK (imported only when this backend is built).

Thinking blocks and their signatures come back in `Done.provider_data["anthropic_thinking"]`; the
Core stores them on the assistant message, and they are sent back before that message's text and
tool calls on later requests that have thinking on, as the API requires.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..textcalls import BadArguments, parse_arguments
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
from . import http_error

PROVIDER = "anthropic"
DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 8192
THINKING_KEY = "anthropic_thinking"  # provider_data key of the thinking blocks
LARGE_TOOL_RESULT = 4096  # characters (~1k tokens, the smallest cacheable prefix): cache from here
EFFORT_BUDGETS = {"low": 2048, "medium": 8192, "high": 24576}  # reasoning_effort without a budget
_EPHEMERAL = {"type": "ephemeral"}
# The SDK no longer has arguments for these; they are sent as extra body fields when set.
_SAMPLING = ("temperature", "top_p", "top_k")

# stop_reason → ours; any other (pause_turn, a newer one) is "other", its raw value in Done.reason
_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "refusal",
}
# An `error` event mid-stream carries no HTTP status; its type says which one it stands for.
_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
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
        base_url = base_url or os.environ.get("OLLIE_ANTHROPIC_URL") or os.environ.get("ANTHROPIC_BASE_URL")
        import anthropic

        self.model = model or DEFAULT_MODEL
        # The Core retries with its own countdown; the SDK's silent retries would hide them.
        self._client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)
        self._context_length: int | None = None

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> AnthropicBackend:
        return cls(model, **options)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        import anthropic
        import httpx2  # the SDK's HTTP client: its transport errors surface mid-stream unwrapped

        request, headers = build_request(self.model, messages, tools, params)
        sampling = {k: request.pop(k) for k in _SAMPLING if k in request}
        try:
            events = await self._client.messages.create(
                **request, stream=True, extra_headers=headers, extra_body=sampling or None
            )
            async for chunk in _chunks(events):
                yield chunk
        except anthropic.APIStatusError as e:
            raise _status_error(e) from e
        except (anthropic.APIConnectionError, httpx2.TransportError) as e:
            raise TransientError(f"network: {e}", provider=PROVIDER) from e
        except (ValueError, AttributeError, KeyError, TypeError) as e:  # JSON or events not as the API sends them
            raise BackendError(f"malformed stream event: {e!r}", provider=PROVIDER) from e
        except RecursionError:  # the SDK's JSON decoder gave up on it
            raise BackendError("malformed stream event: nested too deeply to read", provider=PROVIDER) from None

    async def models(self) -> list[str]:
        import anthropic

        try:
            return sorted([m.id async for m in self._client.models.list()])
        except anthropic.APIStatusError as e:
            raise _status_error(e) from e
        except anthropic.APIConnectionError as e:
            raise TransientError(f"network: {e}", provider=PROVIDER) from e

    async def context_length(self) -> int | None:
        """The model's input window from the models API; 200k (every Claude model's) if it says none."""
        if self._context_length is None:
            try:
                info = await self._client.models.retrieve(self.model)
                self._context_length = info.max_input_tokens or 200_000
            except Exception:  # an alias the API does not list, or no network: the common window
                return 200_000
        return self._context_length

    async def aclose(self) -> None:
        await self._client.close()


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
    try:
        return parse_arguments(arguments)
    except BadArguments:
        return {"_raw": arguments}


def _cache_large_last_tool_result(out: list[dict[str, Any]]) -> None:
    if not out or out[-1]["role"] != "user":
        return
    results = [b for b in out[-1]["content"] if b["type"] == "tool_result"]
    if results and len(results[-1]["content"]) >= LARGE_TOOL_RESULT:
        results[-1]["cache_control"] = _EPHEMERAL


# ---- the answer ---------------------------------------------------------------------------------


async def _chunks(events: AsyncIterator[Any]) -> AsyncIterator[Chunk]:
    """Raw stream events → chunks. Tool calls are numbered in the order their blocks start."""
    answer = _Answer()
    async for ev in events:
        if ev.type == "message_stop":
            yield UsageChunk(answer.usage)
            yield answer.done()
            return
        for chunk in answer.read(ev):
            yield chunk
    raise TransientError("the stream ended before message_stop", provider=PROVIDER)


class _Answer:
    """What the events of one answer built up so far."""

    def __init__(self) -> None:
        self.usage = Usage(requests=1)
        self.tool_index: dict[int, int] = {}  # content block index → tool call index
        self.tool_has_input: set[int] = set()
        self.thinking: dict[int, dict[str, Any]] = {}  # content block index → block to send back
        self.stop: StopReason = "other"  # until message_delta says
        self.reason = ""  # the API's stop_reason, unless it is a plain stop or tool use

    def read(self, ev: Any) -> Iterator[Chunk]:
        """The chunks of one event before message_stop (events of other types carry none)."""
        kind = ev.type
        if kind == "message_start":
            _read_usage(self.usage, ev.message.usage)
        elif kind == "content_block_start":
            yield from self._block_start(ev.index, ev.content_block)
        elif kind == "content_block_delta":
            yield from self._block_delta(ev.index, ev.delta)
        elif kind == "content_block_stop":
            if ev.index in self.tool_index and ev.index not in self.tool_has_input:
                yield ToolCallDelta(index=self.tool_index[ev.index], arguments="{}")
        elif kind == "message_delta":
            raw = ev.delta.stop_reason or ""
            self.stop = _STOP_REASONS.get(raw, "other")
            self.reason = "" if self.stop in ("stop", "tool_calls") else raw
            _read_usage(self.usage, ev.usage)

    def _block_start(self, index: int, block: Any) -> Iterator[Chunk]:
        if block.type == "tool_use":
            self.tool_index[index] = len(self.tool_index)
            yield ToolCallDelta(index=self.tool_index[index], id=block.id, name=block.name)
        elif block.type == "thinking":
            self.thinking[index] = {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
        elif block.type == "redacted_thinking":
            self.thinking[index] = {"type": "redacted_thinking", "data": block.data}

    def _block_delta(self, index: int, d: Any) -> Iterator[Chunk]:
        if d.type == "text_delta":
            yield TextDelta(d.text)
        elif d.type == "thinking_delta":
            self.thinking[index]["thinking"] += d.thinking
            yield ReasoningDelta(d.thinking)
        elif d.type == "signature_delta":
            self.thinking[index]["signature"] += d.signature
        elif d.type == "input_json_delta" and d.partial_json:
            self.tool_has_input.add(index)
            yield ToolCallDelta(index=self.tool_index[index], arguments=d.partial_json)

    def done(self) -> Done:
        thinking = self.thinking
        data = {THINKING_KEY: [thinking[i] for i in sorted(thinking)]} if thinking else {}
        return Done(stop_reason=self.stop, provider_data=data, reason=self.reason)


def _read_usage(usage: Usage, u: Any) -> None:
    """message_start carries the input counts; message_delta the running output count (and,
    on newer API versions, the input counts again)."""
    if u is None:
        return
    for attr, field in (
        ("input_tokens", "input_tokens"),
        ("output_tokens", "output_tokens"),
        ("cache_read_input_tokens", "cache_read_tokens"),
        ("cache_creation_input_tokens", "cache_write_tokens"),
    ):
        if (value := getattr(u, attr, None)) is not None:
            setattr(usage, field, value)


def _status_error(e: Any) -> BackendError:
    """An HTTP error reply, or an `error` event in a stream that started fine (status 200)."""
    status = e.status_code
    if status < 400:
        status = _ERROR_TYPE_STATUS.get(e.type or "", 500)
    message = e.api_message or str(e)
    retry_after = e.response.headers.get("retry-after") if e.status_code == 429 else None
    return http_error(PROVIDER, status, message, retry_after)
