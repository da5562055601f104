"""A local HTTP server for tests that speaks a provider's exact wire format and records requests.

Each test scripts the replies (status, headers, body pieces sent as they would stream) and then
checks both what the client sent (`server.requests`) and what it made of the answer. It runs in
a thread, so it serves async and sync clients alike, and binds 127.0.0.1 on a free port.

    with WireServer() as server:
        server.reply("/v1/messages", stream_reply(sse([("ping", {"type": "ping"})])))
        ... client at server.url ...
        assert server.requests[0].json["model"] == "m"
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)  # body pieces, each flushed on its own
    stream: bool = False  # chunked transfer encoding instead of Content-Length
    cut: bool = False  # drop the connection before the body is complete
    delay: float = 0.0  # seconds to wait before each piece (to test cancellation)


@dataclass
class Recorded:
    method: str
    path: str  # with the query string
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Recorded], Reply]


def json_reply(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"content-type": "application/json", **(headers or {})}, [json.dumps(obj).encode()])


def stream_reply(chunks: Iterable[bytes], content_type: str = "text/event-stream", **kw: Any) -> Reply:
    return Reply(headers={"content-type": content_type}, chunks=list(chunks), stream=True, **kw)


def sse(events: Iterable[tuple[str | None, Any]]) -> list[bytes]:
    """Server-sent events; a None event name writes only `data:` (the OpenAI style).
    Non-string data is JSON-encoded."""
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode())
    return out


def ndjson(objs: Iterable[Any]) -> list[bytes]:
    return [json.dumps(o).encode() + b"\n" for o in objs]


class WireServer:
    """Replies are queued per path (FIFO, each used once) or given by a handler for every request."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._queued: dict[str, deque[Reply]] = {}
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda request, address: None  # a client that hangs up is no test failure
        # A short poll interval makes shutdown (which waits for the next poll) quick.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def reply(self, path: str, *replies: Reply) -> None:
        with self._lock:
            self._queued.setdefault(path, deque()).extend(replies)

    def route(self, path: str, handler: Handler) -> None:
        self._handlers[path] = handler

    def requests_to(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path.split("?")[0] == path]

    def _answer(self, req: Recorded) -> Reply:
        path = req.path.split("?")[0]
        with self._lock:
            self.requests.append(req)
            queue = self._queued.get(path)
            if queue:
                return queue.popleft()
        if handler := self._handlers.get(path):
            return handler(req)
        return json_reply({"error": f"test server: no reply scripted for {req.method} {path}"}, 404)

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def _make_handler(server: WireServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = server._answer(Recorded(self.command, self.path, headers, body))
            self._send(reply)

        do_GET = do_POST = do_DELETE = do_PUT = _handle

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            if reply.stream:
                self.send_header("transfer-encoding", "chunked")
            else:
                self.send_header("content-length", str(sum(map(len, reply.chunks))))
            if reply.cut:
                self.send_header("connection", "close")
            self.end_headers()
            try:
                for piece in reply.chunks:
                    if reply.delay:
                        time.sleep(reply.delay)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if reply.stream else piece)
                    self.wfile.flush()
                if reply.cut:
                    self.close_connection = True
                    return
                if reply.stream:
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):  # the client went away: that is its right
                self.close_connection = True

    return _Handler
