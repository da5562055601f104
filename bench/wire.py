"""A local OpenAI-wire server for the benches (bench/loop_overhead.py, bench/scale.py), in a process
of its own.

    .venv/bin/python bench/wire.py [--steps 10] [--port 0]

It answers `GET /v1/models` (one model, "bench", with its context length, as vLLM and llama.cpp say
it) and `POST /v1/chat/completions` with a streamed answer: a call of the tool `--tool` (default
`noop`) until the turn (the history since its last user message) holds `steps` tool results,
then the text "done"; with a delay, each answer streams its events over that time. Keep-alive
HTTP/1.1, no chunked encoding. Anything else gets a 404; a client that hangs up mid-request is
just forgotten (no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import heapq
import itertools
import json
import multiprocessing
import os
import sys
from typing import Any

MODELS = {"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench", "context_length": 131072}]}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def answer(body: dict, steps: int, tool: str = "noop", arguments: str = "{}", chunks: int = 0) -> bytes:
    """A tool call until the turn (the history since the last user message) holds `steps` tool
    results, then a text answer."""
    return b"".join(events(body, steps, tool, arguments, chunks))


def events(body: dict, steps: int, tool: str = "noop", arguments: str = "{}", chunks: int = 0) -> list[bytes]:
    """The answer's server-sent events: with `chunks`, text deltas ("t ") lead the tool call (or
    make up the answer, "done" its last) so that the answer comes in about that many events."""
    messages = list(body.get("messages", ()))
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    done = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "tool")  # this turn's
    return _encoded(min(done, steps), steps, tool, arguments, chunks, body.get("model", "bench"))


@functools.lru_cache(maxsize=256)
def _encoded(done: int, steps: int, tool: str, arguments: str, chunks: int, model: str) -> list[bytes]:
    """The events of the answer after `done` tool results, encoded once (the mock's CPU is the
    bench's, not the client's)."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model}
    text = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "t "}, "finish_reason": None}]}] * max(
        0, chunks - 3
    )
    if done < steps:
        fn = {"name": tool, "arguments": arguments}
        call = {"index": 0, "id": f"call_{done}", "type": "function", "function": fn}
        parts = [
            *text,
            {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
    else:
        parts = [
            *text,
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "done"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
    parts.append({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})
    return [_sse({**base, **c}) for c in parts] + [b"data: [DONE]\n\n"]


class _Pacer:
    """Every answer's events, each written at its own time (late wakeups do not add up), by one
    timer for them all: the mock stays light beside the client it measures. A timer an event
    (asyncio's `call_at`, a handle run by the loop, the transport's checks) cost the mock some
    10 us of Python an event, 0.6 ms of the machine's CPU a step at 500 agents; here an event is
    a heap's pop and a `send` on the socket (the transport's `write` when it holds data back)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, asyncio.BaseTransport, list[bytes], int, float, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._order = itertools.count()  # ties keep their order; no two entries are compared further

    def add(self, writer: asyncio.StreamWriter, parts: list[bytes], delay: float) -> asyncio.Future:
        """Write `parts` spread over `delay`; the future resolves after the last."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()
        start = loop.time()
        self._push(start + delay / len(parts), writer.transport, parts, 0, start, delay, ended)
        return ended

    def _push(self, when, transport, parts, i, start, delay, ended) -> None:
        heapq.heappush(self._due, (when, next(self._order), transport, parts, i, start, delay, ended))
        if self._timer is None or when < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        due = self._due
        while due and due[0][0] <= now:
            _, _, transport, parts, i, start, delay, ended = heapq.heappop(due)
            if transport.is_closing():
                if not ended.done():
                    ended.set_result(None)
                continue
            _send(transport, parts[i])
            if i + 1 < len(parts):
                heapq.heappush(
                    due,
                    (
                        start + delay * (i + 2) / len(parts),
                        next(self._order),
                        transport,
                        parts,
                        i + 1,
                        start,
                        delay,
                        ended,
                    ),
                )
            elif not ended.done():
                ended.set_result(None)
        if due:
            self._timer = asyncio.get_running_loop().call_at(due[0][0], self._fire)


def _send(transport, data: bytes) -> None:
    """`data` sent on the transport's socket at once, the rest (if the socket is full) through
    the transport, which keeps the order: nothing goes around what it holds back."""
    if transport.get_write_buffer_size() == 0:
        try:  # (asyncio's socket wrapper has no `send`; a write to a socket is one)
            sent = os.write(transport.get_extra_info("socket").fileno(), data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return  # the client hung up: the transport finds out on its own
        data = data[sent:]
    if data:
        transport.write(data)


def _response(status: str, ctype: str, payload: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status.encode(),
        ctype.encode(),
        len(payload),
        payload,
    )


async def _handle(
    reader,
    writer,
    steps: int,
    tool: str,
    arguments: str,
    delay: float,
    chunks: int,
    pacer: _Pacer,
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = (lines[0].split(b" ") + [b"", b""])[:2]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            raw = await reader.readexactly(length) if length else b""
            path = path.split(b"?")[0].rstrip(b"/")
            if method == b"GET" and path in (b"/v1/models", b"/models"):
                out = _response("200 OK", "application/json", json.dumps(MODELS).encode())
            elif method == b"POST" and path in (b"/v1/chat/completions", b"/chat/completions"):
                try:
                    body = json.loads(raw)
                except ValueError:
                    out = _response("400 Bad Request", "application/json", b'{"error": {"message": "bad JSON"}}')
                else:
                    parts = events(body, steps, tool, arguments, chunks)
                    if delay <= 0:
                        out = _response("200 OK", "text/event-stream", b"".join(parts))
                    else:  # the answer spread over `delay`, one event at a time, as a model streams it
                        writer.write(
                            _response("200 OK", "text/event-stream", b"").replace(
                                b"content-length: 0", b"content-length: %d" % sum(map(len, parts))
                            )
                        )
                        await pacer.add(writer, parts, delay)
                        out = b""
            else:
                out = _response("404 Not Found", "application/json", b'{"error": {"message": "not found"}}')
            writer.write(out)
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(
    port: int, steps: int, tool: str, arguments: str, ready=None, delay: float = 0, chunks: int = 0
) -> None:
    pacer = _Pacer()
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, steps, tool, arguments, delay, chunks, pacer), "127.0.0.1", port, backlog=4096
    )
    bound = server.sockets[0].getsockname()[1]
    if ready is None:
        print(f"http://127.0.0.1:{bound}/v1", flush=True)
    else:
        ready.put(bound)
    await server.serve_forever()


def _run(ready, port: int, steps: int, tool: str, arguments: str, delay: float = 0, chunks: int = 0) -> None:
    try:
        asyncio.run(_serve(port, steps, tool, arguments, ready, delay, chunks))
    except KeyboardInterrupt:
        pass


class WireServer:
    """The server in a child process: `with WireServer(steps) as port: ...`."""

    def __init__(
        self, steps: int, tool: str = "noop", arguments: str = "{}", port: int = 0, delay: float = 0, chunks: int = 0
    ):
        """`delay`: seconds each answer takes, streamed in about `chunks` events (0: at once)."""
        self.args = (port, steps, tool, arguments, delay, chunks)
        self.proc: multiprocessing.Process | None = None

    def __enter__(self) -> int:
        q: multiprocessing.Queue = multiprocessing.Queue()
        self.proc = multiprocessing.Process(target=_run, args=(q, *self.args), daemon=True)
        self.proc.start()
        return q.get(timeout=10)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="tool calls before the answer (default 10)")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    ap.add_argument("--tool", default="noop", help="the tool the answers call (default noop)")
    args = ap.parse_args()
    try:
        asyncio.run(_serve(args.port, args.steps, args.tool, "{}"))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
