"""The OpenAI Chat Completions wire format: SSE chunks as the API streams them."""

from __future__ import annotations

from typing import Any

from . import Reply, sse, stream_reply

PATH = "/v1/chat/completions"


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict | None = None, index: int = 0
) -> dict[str, Any]:
    choices = (
        []
        if delta is None and finish is None
        else [{"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1764000000,
        "model": "gpt-4o-mini",
        "choices": choices,
        "usage": usage,
    }


def usage(prompt: int = 12, completion: int = 5, cached: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        **extra,
    }


def text_stream(text: str, prompt_tokens: int = 12, finish: str = "stop") -> Reply:
    """A whole text answer: role chunk, the text in two pieces, finish, usage, [DONE]."""
    half = len(text) // 2
    return stream_reply(
        sse(
            [
                (None, chunk({"role": "assistant", "content": ""})),
                (None, chunk({"content": text[:half]})),
                (None, chunk({"content": text[half:]})),
                (None, chunk({}, finish)),
                (None, chunk(usage=usage(prompt_tokens))),
                (None, "[DONE]"),
            ]
        )
    )


def tool_call_stream(calls: list[tuple[str, str, str]]) -> Reply:
    """Tool calls (id, name, arguments JSON), each streamed in pieces, the calls interleaved."""
    events = [(None, chunk({"role": "assistant", "content": None}))]
    for i, (cid, name, _) in enumerate(calls):
        events.append(
            (
                None,
                chunk(
                    {
                        "tool_calls": [
                            {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
                        ]
                    }
                ),
            )
        )
    for part in (0, 1):  # the arguments of every call in two halves, interleaved across calls
        for i, (_, _, args) in reversed(list(enumerate(calls))):
            half = len(args) // 2
            piece = args[:half] if part == 0 else args[half:]
            events.append((None, chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})))
    events += [(None, chunk({}, "tool_calls")), (None, chunk(usage=usage())), (None, "[DONE]")]
    return stream_reply(sse(events))
