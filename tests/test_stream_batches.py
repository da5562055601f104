"""A lighter stream: what one read of a streamed answer brings is handed to the loop as one chunk
of text (one event, one write to the chat log), not one per token; what comes in later reads
still comes as it arrives."""

from __future__ import annotations

import asyncio
import json

import pytest

from http_helpers import Origin, Seen
from ollie import backends
from ollie.backends import _http, coalesce
from ollie.backends.hold import held_for, stream_hold
from ollie.types import Done, GenerationParams, Message, ReasoningDelta, TextDelta, ToolCallDelta
from wire import anthropic as anthropic_wire
from wire import ndjson, sse
from wire import ollama as ollama_wire
from wire import openai as openai_wire


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


@pytest.mark.parametrize(
    "text",
    [
        '{"choices": [{"delta": {"content": "t"}}]}',
        ' {"a": 1}\n',  # whitespace around: json.loads allows it
        '{"a": 1} {"b": 2}',  # more after it
        '{"a": 1',
        "",
        "[DONE]",
        "\ufeff{}",  # a byte-order mark
        '"\\ud800"',  # a lone surrogate escape
        "NaN",
        "1e400",
    ],
)
def test_a_stream_event_is_read_as_json_loads_reads_it(text):
    """The streams' fast reading of an event gives what json.loads gives: the same value, or the
    same error (which the backends quote to the user)."""
    try:
        expected = ("value", json.loads(text))
    except json.JSONDecodeError as e:
        expected = ("error", str(e))
    try:
        got = ("value", backends.json_value(text))
    except json.JSONDecodeError as e:
        got = ("error", str(e))
    assert repr(got) == repr(expected)


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


LETTERS = "abcdefghij"


def _parts(kind: str) -> tuple[str, str, list[bytes], list[bytes]]:
    """(path, content type, the answer's pieces one letter each, the pieces that end it) on a wire."""
    if kind == "openai":
        pieces = sse((None, openai_wire.chunk({"content": c})) for c in LETTERS)
        end = sse(
            [
                (None, openai_wire.chunk({}, "stop")),
                (None, openai_wire.chunk(usage=openai_wire.usage())),
                (None, "[DONE]"),
            ]
        )
        return "/v1/chat/completions", "text/event-stream", pieces, end
    if kind == "anthropic":
        events = anthropic_wire.message_events([])
        delta = [
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": c}},
            )
            for c in LETTERS
        ]
        start = (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
        stop = ("content_block_stop", {"type": "content_block_stop", "index": 0})
        return anthropic_wire.PATH, "text/event-stream", sse([*events[:2], start, *delta, stop]), sse(events[2:])
    pieces = ndjson(ollama_wire.chat_line(content=c) for c in LETTERS)
    return "/api/chat", "application/x-ndjson", pieces, ndjson([ollama_wire.done_line()])


async def _answer(
    writer: asyncio.StreamWriter, pieces: list[bytes], gap: float, pause: float, end: list[bytes]
) -> bool:
    """An event stream in chunked transfer coding: each piece a chunk of its own, `gap` seconds
    apart, then after `pause` seconds the pieces that end it."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for piece in pieces:
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(gap)
    await asyncio.sleep(pause)
    rest = b"".join(end)
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
    await writer.drain()
    return True


@pytest.mark.parametrize("kind", ["openai", "anthropic", "ollama"])
async def test_events_that_come_close_together_are_held_as_one_and_the_end_comes_at_once(kind, monkeypatch):
    """A model's pieces a few ms apart reach the loop in one chunk, not one each: after a chunk the
    reader waits up to STREAM_HOLD for more. The answer's first piece does not wait, nor does its
    end: the pattern that ends each wire's stream wakes the reader when it arrives (here the hold is
    5 s, and the end comes 0.3 s after the pieces)."""
    monkeypatch.setattr(_http, "STREAM_HOLD", 5.0)
    path, content_type, pieces, end = _parts(kind)
    loop = asyncio.get_running_loop()
    end_sent = 0.0

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        nonlocal end_sent
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n" % content_type.encode()
        )
        for piece in pieces:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        rest = b"".join(end)
        end_sent = loop.time()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        await writer.drain()
        return True

    async def show(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:  # Ollama's model card
        body = b"".join(ollama_wire.show(8192).chunks)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        return True

    async with Origin({path: handler, "/api/show": show}) as origin:
        url = origin.url() + ("/v1" if kind == "openai" else "")
        be = backends.create(kind, "m", base_url=url, **({} if kind == "ollama" else {"api_key": "k"}))
        chunks = [c async for c in be.stream([Message("user", "hi")], [], GenerationParams())]
        ended = loop.time()
        await be.aclose()
    texts = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert "".join(texts) == LETTERS and isinstance(chunks[-1], Done)
    assert texts[0] == "a" and len(texts) <= 3, texts  # the first at once; the other nine gathered
    assert ended - end_sent < 2.0  # not the 5 s hold: the end woke the reader


async def test_a_stream_without_its_end_pattern_is_held_no_longer_than_the_hold(monkeypatch):
    """What no end pattern wakes is taken when the hold is up: here the model's last text piece,
    after which the model pauses (the end comes 1 s later)."""
    monkeypatch.setattr(_http, "STREAM_HOLD", 0.1)
    path, content_type, pieces, end = _parts("openai")
    loop = asyncio.get_running_loop()
    times: dict[str, float] = {}

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (pieces[0], pieces[1]):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        times["sent"] = loop.time()
        await asyncio.sleep(1.0)
        rest = b"".join(end)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        await writer.drain()
        return True

    async with Origin({path: handler}) as origin:
        be = backends.create("openai", "m", base_url=origin.url() + "/v1", api_key="k")
        async for c in be.stream([Message("user", "hi")], [], GenerationParams()):
            if isinstance(c, TextDelta) and c.text.endswith("b"):
                times["got"] = loop.time()
        await be.aclose()
    assert times["got"] - times["sent"] < 0.6  # the hold (0.1 s), not the model's pause (1 s)


async def test_a_body_that_ended_is_not_held_and_its_connection_serves_the_next_answer(monkeypatch):
    """A body framed by its length ends with its last read: its connection goes back to the pool
    then, so nothing more is held on it (a hold there waited on the next answer's reader). Answers
    one after another on the one connection, each with the hold at 2 s, take no hold's time."""
    monkeypatch.setattr(_http, "STREAM_HOLD", 2.0)
    path, _, pieces, end = _parts("openai")

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        body = [*pieces, b"".join(end)]
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % sum(map(len, body))
        )
        for piece in body:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.005)
        return True

    async with Origin({path: handler}) as origin:
        be = backends.create("openai", "m", base_url=origin.url() + "/v1", api_key="k")
        loop = asyncio.get_running_loop()
        for _ in range(3):
            start = loop.time()
            chunks = [c async for c in be.stream([Message("user", "hi")], [], GenerationParams())]
            assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == LETTERS
            assert loop.time() - start < 1.0
        await be.aclose()
    assert origin.connections == 1


async def test_the_hold_is_whoever_runs_the_streams(monkeypatch):
    """`stream_hold` sets the hold the HTTP streams wait for more (asked at each wait):
    here 5 s where STREAM_HOLD says 0, so the pieces 5 ms apart gather as they did above."""
    monkeypatch.setattr(_http, "STREAM_HOLD", 0.0)
    path, _, pieces, end = _parts("openai")
    asked: list[float] = []

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        return await _answer(writer, pieces, 0.005, 0.0, end)

    def hold() -> float:
        asked.append(5.0)
        return 5.0

    async with Origin({path: handler}) as origin:
        be = backends.create("openai", "m", base_url=origin.url() + "/v1", api_key="k")
        with stream_hold(hold):
            chunks = [c async for c in be.stream([Message("user", "hi")], [], GenerationParams())]
        await be.aclose()
    texts = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert "".join(texts) == LETTERS and texts[0] == "a" and len(texts) <= 3, texts
    assert asked  # asked at the waits, not fixed when the stream began
    assert held_for(0.25) == 0.25  # outside it, the transport's own


async def _answer_events(follow: str) -> list[str]:
    """The assistant text events a session's subscriber sees of an answer streamed a letter every
    60 ms, its end 0.2 s after its last letter: `follow` "no" (the subscriber does not show the
    text), "subscriber" (it does) or "looked" (someone read the chat)."""
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.config import AgentConfig
    from ollie.tools import dispatcher_factory

    path, _, pieces, end = _parts("openai")

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        return await _answer(writer, pieces, 0.06, 0.2, end)

    async with Origin({path: handler}) as origin:
        be = backends.create("openai", "m", base_url=origin.url() + "/v1", api_key="k")
        new_dispatcher = dispatcher_factory({})
        env = await build_agent_env(AgentConfig(), new_dispatcher(), ".")
        core = Core(CoreConfig(be, env, new_dispatcher))
        texts: list[str] = []
        core.subscribe(lambda ev: texts.append(ev.text) if ev.kind == "assistant" else None, follows=follow != "no")
        if follow == "looked":
            core.looked()
        try:
            await core.submit("hi")
        finally:
            await core.close()
    assert "".join(texts) == LETTERS
    return texts


async def test_an_answer_no_one_follows_gathers_in_its_stream_and_one_followed_streams_as_it_comes():
    """While no one shows a session's text as it comes, its answer gathers in the stream for up to
    a second (events.UNFOLLOWED_HOLD): the first letter at once, the others with the end, which
    still comes at once. A subscriber that follows the text, or a reader that looked at the chat
    (`Core.looked`, what an open or a read of `chat` does), gets it 20 times a second."""
    unfollowed = await _answer_events("no")
    assert unfollowed[0] == "a" and len(unfollowed) <= 2, unfollowed
    for follow in ("subscriber", "looked"):
        followed = await _answer_events(follow)
        assert followed[0] == "a" and len(followed) >= 5, (follow, followed)
