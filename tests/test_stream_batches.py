"""A lighter stream: what one read of a streamed answer brings is handed to the loop as one chunk
of text (one event, one write to the chat log), not one per token; what comes in later reads
still comes as it arrives."""

from __future__ import annotations

import asyncio
import json

from http_helpers import Origin, Seen
from ollie import backends
from ollie.backends import coalesce
from ollie.types import Done, GenerationParams, Message, ReasoningDelta, TextDelta, ToolCallDelta


def _event(delta: dict | None = None, finish: str | None = None) -> bytes:
    data = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    data["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def test_the_events_of_one_read_come_as_one_text_chunk_and_later_ones_as_they_arrive():
    gate = asyncio.Event()

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        first = b"".join(_event({"content": c}) for c in "abcde")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        await writer.drain()
        await gate.wait()  # the client has had the first read's chunks
        rest = _event({"content": "f"}) + _event(finish="stop") + b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        await writer.drain()
        return True

    async with Origin({"/v1/chat/completions": handler}) as origin:
        be = backends.create("openai", "m", base_url=f"http://127.0.0.1:{origin.port}/v1", api_key="k")
        chunks = []
        async for c in be.stream([Message("user", "hi")], [], GenerationParams()):
            chunks.append(c)
            if len(chunks) == 1:
                assert isinstance(c, TextDelta) and c.text == "abcde"  # before the rest was even sent
                gate.set()
    texts = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert texts == ["abcde", "f"] and isinstance(chunks[-1], Done)


def test_coalesce_joins_runs_of_text_and_of_reasoning_only():
    call = ToolCallDelta(0, "id", "f", "{}")
    chunks = [
        ReasoningDelta("th"),
        ReasoningDelta("ink"),
        TextDelta("a"),
        TextDelta("b"),
        call,
        TextDelta("c"),
        TextDelta(None),  # type: ignore[arg-type]  (malformed: left for the loop to refuse)
        TextDelta("d"),
    ]
    assert coalesce(chunks) == [
        ReasoningDelta("think"),
        TextDelta("ab"),
        call,
        TextDelta("c"),
        TextDelta(None),  # type: ignore[arg-type]
        TextDelta("d"),
    ]
    assert coalesce([TextDelta("x")]) == [TextDelta("x")]
