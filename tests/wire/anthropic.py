"""The Anthropic Messages API wire format: SSE streams and error bodies, as the API sends them."""

from __future__ import annotations

import json
from typing import Any

from . import Reply, json_reply, sse, stream_reply

PATH = "/v1/messages"


def usage(input_tokens: int = 10, output_tokens: int = 1, cache_read: int = 0, cache_write: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": cache_write,
        "cache_read_input_tokens": cache_read,
    }


def block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """content_block_start / _delta(s) / _stop for one block, its content split into two deltas
    the way the API streams it. `block` is the finished block, e.g. {"type": "text", "text": "hi"}."""
    kind = block["type"]

    def delta(d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}

    if kind == "text":
        start, text = {"type": "text", "text": ""}, block["text"]
        deltas = [delta({"type": "text_delta", "text": part}) for part in _halves(text)]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [delta({"type": "thinking_delta", "thinking": part}) for part in _halves(block["thinking"])]
        deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [delta({"type": "input_json_delta", "partial_json": p}) for p in _halves(json.dumps(block["input"]))]
    else:  # redacted_thinking and other blocks arrive whole
        start, deltas = block, []
    return [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
        *deltas,
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def message_events(
    blocks: list[dict[str, Any]],
    stop_reason: str = "end_turn",
    model: str = "claude-sonnet-4-6",
    start_usage: dict[str, Any] | None = None,
    output_tokens: int = 5,
) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage or usage(),
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(blocks):
        events += block_events(i, block)
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def stream(blocks: list[dict[str, Any]], **kw: Any) -> Reply:
    return stream_reply(sse(message_events(blocks, **kw)))


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_01"}


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return json_reply(error_body(kind, message), status, {"request-id": "req_01", **(headers or {})})


def _halves(text: str) -> list[str]:
    mid = len(text) // 2
    return [p for p in (text[:mid], text[mid:]) if p] or [""]
