"""ollie's own HTTP/1.1 client (backends/_http.py) against real servers on real sockets: bodies by
length, chunks and the connection's end, server-sent events, the keep-alive pool (and a server that
closes idle connections), timeouts, TLS, proxies (a CONNECT tunnel and the absolute form; loopback
never proxied), and the OpenAI backend's errors over it (429 and Retry-After, a cut stream). What
real endpoints do to every backend (redirects, encodings, HTML, proxies of each kind, happy
eyeballs, a CA of its own) is tests/test_http_cases.py's."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ollie import backends
from ollie.backends import _http
from ollie.types import Done, GenerationParams, Message, RateLimitError, TextDelta, TransientError

Handler = Callable[["Conn", bytes, bytes], Awaitable[bool]]  # (conn, head, body) -> keep the connection?


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.requests = 0  # on this connection


class Server:
    """An HTTP/1.1 server on 127.0.0.1 in the test's own event loop; `handler` answers each request
    (writing raw bytes) and says whether to keep the connection."""

    def __init__(self, handler: Handler, ssl_context=None) -> None:
        self.handler, self.ssl = handler, ssl_context
        self.connections = 0
        self.heads: list[bytes] = []
        self._conns: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for w in self._conns:
            w.transport.abort()
        await _http.aclose_pool()

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{'localhost' if self.ssl else '127.0.0.1'}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._conns.add(writer)
        conn = Conn(reader, writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                conn.requests += 1
                self.heads.append(head)
                if not await self.handler(conn, head, body):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.transport.abort()


def answer(status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return head.encode() + b"\r\n" + body


def chunked(pieces: list[bytes], end: bool = True, headers: str = "content-type: text/event-stream\r\n") -> bytes:
    out = f"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n{headers}\r\n".encode()
    out += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return out + (b"0\r\n\r\n" if end else b"")


def replies(*raw: bytes, keep: bool = True) -> Handler:
    """Answer the requests with these raw answers in turn."""
    queue = list(raw)

    async def handler(conn: Conn, head: bytes, body: bytes) -> bool:
        conn.writer.write(queue.pop(0))
        return keep

    return handler


# ---- bodies and events ----------------------------------------------------------------------------


async def test_a_content_length_body_and_keep_alive_reuse_one_connection():
    async with Server(replies(answer(body=b"one"), answer(body=b"two", headers={"x-a": "1"}))) as s:
        r = await _http.request("GET", s.url + "/a")
        assert (r.status, await r.read()) == (200, b"one")
        r = await _http.request("POST", s.url + "/b?q=1", {"authorization": "Bearer k"}, b"{}")
        assert (await r.read(), r.headers["x-a"]) == (b"two", "1")
        assert s.connections == 1
        assert s.heads[1].startswith(b"POST /b?q=1 HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b"authorization: Bearer k\r\n" in s.heads[1] and b"content-length: 2\r\n" in s.heads[1]


async def test_chunked_server_sent_events_split_anywhere_are_whole_events():
    stream = (
        b": a comment, as keep-alive pings are\r\n\r\n"
        b"data: one\r\n\r\n"
        b"event: named\ndata: two\ndata: lines\n\n"
        b'data:three\r\rdata: {"x": 1}\n\n'
        b"id: 7\nretry: 5\n\n"  # no data: no event
        b"data: last, without the blank line after it\n"
    )
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]  # splits CRLFs and field names
    async with Server(replies(chunked(pieces), answer(body=b"after"))) as s:
        r = await _http.request("POST", s.url, body=b"{}")
        events = [e async for e in r.events()]
        assert events == [
            (None, "one"),
            ("named", "two\nlines"),
            (None, "three"),
            (None, '{"x": 1}'),
            (None, "last, without the blank line after it"),
        ]
        assert r.complete  # read to its end: the connection went back to the pool
        r = await _http.request("GET", s.url)
        assert await r.read() == b"after" and s.connections == 1


async def test_a_chunk_bigger_than_one_read():
    big = bytes(range(256)) * 1024  # 256 KiB
    async with Server(replies(chunked([big, b"tail"]), answer(body=b"next"))) as s:
        r = await _http.request("GET", s.url)
        assert await r.read() == big + b"tail"
        assert await (await _http.request("GET", s.url)).read() == b"next" and s.connections == 1


async def test_a_body_read_to_the_connections_end():
    async def handler(conn: Conn, head: bytes, body: bytes) -> bool:
        conn.writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        await conn.writer.drain()
        return False  # the server closes: that ends the body

    async with Server(handler) as s:
        r = await _http.request("GET", s.url)
        assert await r.read() == b"until the end"
        r = await _http.request("GET", s.url)  # not reused: a new connection
        assert await r.read() == b"until the end" and s.connections == 2


# ---- the pool, and a server that closes idle connections ----------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_not_used():
    async with Server(replies(answer(body=b"a"), answer(body=b"b"), keep=False)) as s:
        assert await (await _http.request("GET", s.url)).read() == b"a"
        await asyncio.sleep(0.05)  # the server's close reaches the client
        assert await (await _http.request("GET", s.url)).read() == b"b"
        assert s.connections == 2


async def test_a_request_on_a_connection_closing_under_it_is_sent_again_once_on_a_fresh_one():
    """The race the check above cannot see: the server closes an idle connection as the request
    leaves. Nothing of an answer came back, so the request is sent again on a new connection."""

    async def handler(conn: Conn, head: bytes, body: bytes) -> bool:
        if conn.requests == 2:
            return False  # read the second request, answer nothing, close
        conn.writer.write(answer(body=b"ok"))
        return True

    async with Server(handler) as s:
        assert await (await _http.request("POST", s.url, body=b"1")).read() == b"ok"
        assert await (await _http.request("POST", s.url, body=b"2")).read() == b"ok"
        assert (s.connections, len(s.heads)) == (2, 3)


async def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_resend():
    async def handler(conn: Conn, head: bytes, body: bytes) -> bool:
        return False

    async with Server(handler) as s:
        with pytest.raises(_http.ProtocolError, match="closed the connection before answering"):
            await _http.request("POST", s.url, body=b"x")
        assert len(s.heads) == 1


async def test_an_answer_cut_after_some_bytes_is_not_sent_again():
    async def handler(conn: Conn, head: bytes, body: bytes) -> bool:
        if conn.requests == 2:
            conn.writer.write(b"HTTP/1.1 200")  # half a status line, then gone
            return False
        conn.writer.write(answer(body=b"ok"))
        return True

    async with Server(handler) as s:
        await (await _http.request("GET", s.url)).read()
        with pytest.raises(_http.ProtocolError):
            await _http.request("GET", s.url)
        assert len(s.heads) == 2


async def test_a_response_left_unread_closes_its_connection():
    async with Server(replies(answer(body=b"x" * 100), answer(body=b"y"))) as s:
        r = await _http.request("GET", s.url)
        await r.aclose()
        assert await (await _http.request("GET", s.url)).read() == b"y"
        assert s.connections == 2


# ---- truncation, timeouts, garbage --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n50\r\nhel",
    ],
    ids=["length", "chunks", "mid-chunk"],
)
async def test_a_body_cut_short_is_a_protocol_error_after_what_came(raw):
    async with Server(replies(raw, keep=False)) as s:
        r = await _http.request("GET", s.url)
        got = []
        with pytest.raises(_http.ProtocolError, match="closed the connection before the answer ended"):
            async for piece in r.pieces():
                got.append(piece)
        assert b"".join(got) in (b"only this", b"hello", b"")


async def test_malformed_answers_are_protocol_errors():
    async with Server(replies(b"SMTP ready\r\n\r\n", keep=False)) as s:
        with pytest.raises(_http.ProtocolError, match="not an HTTP/1.x answer"):
            await _http.request("GET", s.url)
    bad_chunk = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
    async with Server(replies(bad_chunk, keep=False)) as s:
        r = await _http.request("GET", s.url)
        with pytest.raises(_http.ProtocolError, match="malformed chunk size"):
            await r.read()


async def test_read_and_connect_failures():
    async def silent(conn: Conn, head: bytes, body: bytes) -> bool:
        await asyncio.sleep(10)
        return False

    async with Server(silent) as s:
        with pytest.raises(_http.ReadTimeout, match="no answer within 0.2 s"):
            await _http.request("GET", s.url, read_timeout=0.2)
    with pytest.raises(_http.ConnectError, match=r"cannot reach http://127.0.0.1:9/: connection refused") as e:
        await _http.request("GET", "http://127.0.0.1:9/")
    assert not e.value.transient and "check that the server is running" in e.value.check


async def test_the_read_timeout_is_for_silence_not_for_the_whole_answer():
    """A piece every 0.1 s for 0.6 s passes a 0.3 s read timeout; the silence after it does not,
    mid-body, with the pieces before it read."""

    async def chunked_trickle(conn: Conn, head: bytes, body: bytes) -> bool:
        conn.writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(6):
            await asyncio.sleep(0.1)
            conn.writer.write(b"%x\r\ndata: %d\n\n\r\n" % (len(b"data: 0\n\n"), i))
        await asyncio.sleep(5)
        return False

    async with Server(chunked_trickle) as s:
        r = await _http.request("GET", s.url, read_timeout=0.3)
        got = []
        with pytest.raises(_http.ReadTimeout, match="sent nothing for 0.3 s"):
            async for event in r.events():
                got.append(event[1])
        assert got == ["0", "1", "2", "3", "4", "5"]


async def test_a_body_to_the_connections_end_that_stalls_times_out():
    async def stall(conn: Conn, head: bytes, body: bytes) -> bool:
        conn.writer.write(b"HTTP/1.1 200 OK\r\n\r\nsome")
        await asyncio.sleep(5)
        return False

    async with Server(stall) as s:
        r = await _http.request("GET", s.url, read_timeout=0.2)
        with pytest.raises(_http.ReadTimeout):
            await r.read()


# ---- TLS and proxies ----------------------------------------------------------------------------


@pytest.fixture
def cert(tmp_path: Path) -> Path:
    """A self-signed certificate for localhost (openssl CLI), with its key in the same file."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl command")
    pem = tmp_path / "localhost.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,DNS:origin.test", "-keyout", str(pem), "-out", str(pem)],
        check=True,
        capture_output=True,
    )
    return pem


def server_tls(pem: Path):
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pem)
    return ctx


class Proxy:
    """A tiny forward proxy: CONNECT tunnels, and requests in absolute form relayed as they are. It
    stands on another machine, one that knows origin.test: every name it is asked for is 127.0.0.1
    (loopback origins are never proxied, and the tests send no name to a DNS server)."""

    def __init__(self, need_auth: str | None = None) -> None:
        self.need_auth = need_auth
        self.seen: list[bytes] = []

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self._tasks: set[asyncio.Task] = set()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for t in self._tasks:
            t.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            writer.close()
            return
        self.seen.append(head)
        line = head.split(b"\r\n")[0].decode()
        method, target, _ = line.split(" ")
        if self.need_auth and f"proxy-authorization: Basic {self.need_auth}" not in head.decode():
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up_r, up_w = await asyncio.open_connection("127.0.0.1", int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:  # http://host:port/path: relay the request to the origin, as it came
            rest = target.split("://", 1)[1]
            hostport = rest.split("/", 1)[0]
            host, port = hostport.rsplit(":", 1)
            up_r, up_w = await asyncio.open_connection("127.0.0.1", int(port))
            up_w.write(head)
        for a, b in ((reader, up_w), (up_r, writer)):
            task = asyncio.ensure_future(_pipe(a, b))
            self._tasks.add(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def test_https_with_a_certificate_from_ssl_cert_file(cert, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    async with Server(replies(answer(body=b"secret")), ssl_context=server_tls(cert)) as s:
        assert await (await _http.request("GET", s.url + "/x")).read() == b"secret"


async def test_https_refuses_a_certificate_it_cannot_verify(cert, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    async with Server(replies(answer(body=b"secret")), ssl_context=server_tls(cert)) as s:
        with pytest.raises(_http.ConnectError, match=r"its TLS certificate is not trusted \(self-signed certificate"):
            await _http.request("GET", s.url)


async def test_https_through_a_proxy_tunnel_with_credentials(cert, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    auth = base64.b64encode(b"me:p@ss").decode()
    async with Server(replies(answer(body=b"one"), answer(body=b"two")), ssl_context=server_tls(cert)) as s:
        async with Proxy(need_auth=auth) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", f"http://me:p%40ss@127.0.0.1:{proxy.port}")
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            origin = f"https://origin.test:{s.port}"
            assert await (await _http.request("GET", origin + "/a")).read() == b"one"
            assert await (await _http.request("GET", origin + "/b")).read() == b"two"  # the tunnel, kept alive
            assert len(proxy.seen) == 1 and proxy.seen[0].startswith(f"CONNECT origin.test:{s.port} HTTP/1.1".encode())
            assert s.heads[0].startswith(b"GET /a HTTP/1.1") and b"proxy-authorization" not in s.heads[0]


async def test_a_proxy_that_refuses_the_tunnel_says_so(monkeypatch):
    async with Proxy(need_auth="nobody") as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"127.0.0.1:{proxy.port}")
        with pytest.raises(_http.ConnectError, match="refused a tunnel to example.invalid:443: HTTP 407"):
            await _http.request("GET", "https://example.invalid/")


async def test_plain_http_through_a_proxy_in_absolute_form_and_loopback_never(monkeypatch):
    async with Server(replies(answer(body=b"via proxy"), answer(body=b"direct"), keep=False)) as s:
        async with Proxy() as proxy:
            monkeypatch.setenv("HTTP_PROXY", f"http://u:pw@127.0.0.1:{proxy.port}")
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            assert await (await _http.request("GET", f"http://origin.test:{s.port}/p")).read() == b"via proxy"
            assert proxy.seen[0].startswith(f"GET http://origin.test:{s.port}/p HTTP/1.1".encode())
            assert f"proxy-authorization: Basic {base64.b64encode(b'u:pw').decode()}".encode() in proxy.seen[0]
            # A local server is never asked for through a proxy, which could not reach it.
            assert await (await _http.request("GET", s.url + "/d")).read() == b"direct"
            assert len(proxy.seen) == 1


@pytest.mark.parametrize(
    "no_proxy, proxied",
    [("", True), ("origin.test", False), (".test", False), ("other.test,origin.test:443", False), ("*", False)],
)
def test_no_proxy_exempts_hosts(monkeypatch, no_proxy, proxied):
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    for var in ("NO_PROXY", "no_proxy", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    if no_proxy:
        monkeypatch.setenv("NO_PROXY", no_proxy)
    route = _http.proxy_for(_http.URL.parse("https://origin.test/v1"))
    assert (route is not None) == proxied
    for local in ("http://localhost:8080", "http://127.0.0.1:11434", "http://[::1]:8000", "http://127.1.2.3/"):
        assert _http.proxy_for(_http.URL.parse(local)) is None


# ---- the OpenAI backend over it -----------------------------------------------------------------


def sse_body(*objs) -> list[bytes]:
    return [b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs]


def delta(text: str | None = None, finish: str | None = None) -> dict:
    d = {"content": text} if text else {}
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


async def collect(be) -> list:
    return [c async for c in be.stream([Message("user", "hi")], [], GenerationParams())]


async def test_the_backend_streams_over_a_tunnel_and_reuses_it(cert, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    body = chunked(sse_body(delta("hel"), delta("lo"), delta(finish="stop"), b"[DONE]"))
    async with Server(replies(body, body), ssl_context=server_tls(cert)) as s:
        async with Proxy() as proxy:
            monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
            be = backends.create("openai", "m", base_url=f"https://origin.test:{s.port}/v1", api_key="k")
            for _ in range(2):
                chunks = await collect(be)
                assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "hello"
                assert chunks[-1] == Done("stop")
            assert s.connections == 1 and len(proxy.seen) == 1
            assert s.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1")


async def test_the_backend_maps_a_429_with_an_http_date_retry_after():
    import time
    from email.utils import formatdate

    when = formatdate(time.time() + 30, usegmt=True)
    err = json.dumps({"error": {"message": "Too many requests"}}).encode()
    async with Server(replies(answer(429, err, {"retry-after": when}), answer(503, b"<html>down</html>"))) as s:
        be = backends.create("openai", "m", base_url=s.url + "/v1", api_key="k")
        with pytest.raises(RateLimitError, match=r"openai \(HTTP 429\): Too many requests") as e:
            await collect(be)
        assert 25 < e.value.retry_after <= 30
        with pytest.raises(TransientError, match=r"openai \(HTTP 503\): Error code: 503"):
            await collect(be)
        assert s.connections == 1  # error bodies are read: the connection stays


async def test_the_backend_keeps_what_came_before_a_cut_and_says_the_stream_was_cut():
    body = chunked(sse_body(delta("kept"), delta(" too")), end=False)
    async with Server(replies(body, keep=False)) as s:
        be = backends.create("openai", "m", base_url=s.url + "/v1", api_key="k")
        got = []
        with pytest.raises(
            TransientError, match=r"openai: http://127.0.0.1:\d+/v1/chat/completions closed the connection before the"
        ):
            async for c in be.stream([Message("user", "hi")], [], GenerationParams()):
                got.append(c)
        assert [c.text for c in got] == ["kept", " too"]


async def test_a_stream_given_up_midway_closes_its_connection_and_the_next_request_opens_another():
    """A turn interrupted while the answer streams: the half-read connection is not pooled."""

    async def slow(conn: Conn, head: bytes, body: bytes) -> bool:
        if conn.requests == 1 and s.connections == 1:
            conn.writer.write(chunked(sse_body(delta("one")), end=False))
            await asyncio.sleep(5)
            return False
        conn.writer.write(chunked(sse_body(delta("two"), delta(finish="stop"))))
        return True

    async with Server(slow) as s:
        be = backends.create("openai", "m", base_url=s.url + "/v1", api_key="k")
        stream = be.stream([Message("user", "hi")], [], GenerationParams())
        assert (await anext(stream)).text == "one"
        await stream.aclose()  # what cancelling the turn's task does to it
        chunks = await collect(be)
        assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["two"] and chunks[-1] == Done("stop")
        assert s.connections == 2
