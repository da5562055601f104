"""A small asyncio HTTP/1.1 client for the backends: what the OpenAI-compatible wire needs, no more.

    response = await request("POST", url, {"authorization": "Bearer …"}, body)
    try:
        if response.status >= 400:
            text = await response.read()
        async for event, data in response.events():   # server-sent events
            ...
    finally:
        await response.aclose()   # a response read to its end goes back to the pool; else its connection closes

What it does: a keep-alive pool per (scheme, host, port), bound to the running event loop; bodies
framed by Content-Length, chunked transfer coding or the connection's end; server-sent events;
connect and read timeouts; TLS verified with the system's default context (OpenSSL reads
SSL_CERT_FILE and SSL_CERT_DIR); HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY (a CONNECT tunnel
for https, the absolute form for http; the proxy itself spoken to in plain http).

Failures are `HTTPError`s: `ConnectError` (nothing reached the server), `ReadTimeout`, and
`ProtocolError` (the connection closed mid-answer, or the answer is not HTTP). A pooled connection
that the server closed while it was idle is noticed when the request finds it closed with no byte
of the answer read; the request is then sent again, once, on a fresh connection. Nothing else is
retried: retries with their waits are the Core's.

Why not the `openai` SDK's transport (httpx and httpcore): a request through it cost 2.7-3.5 ms of
the event loop's CPU against 0.09 ms for a bare asyncio client, which capped a server of a thousand
busy sessions at ~270 requests/s (bench/scale.py).
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

CONNECT_TIMEOUT = 5.0  # seconds to open a connection (TCP, the proxy's tunnel, TLS)
READ_TIMEOUT = 600.0  # seconds without a byte of the answer: a model may think long before its first token
IDLE_MAX = 1024  # idle connections kept per (scheme, host, port)
IDLE_EXPIRY = 30.0  # seconds an idle connection is kept
_HEAD_MAX = 64 * 1024  # a response's status line and headers
_PIECE = 64 * 1024


class HTTPError(Exception):
    """A request failed below HTTP: its message says what and where."""


class ConnectError(HTTPError):
    """No connection (refused, no such host, TLS, the proxy): the server got nothing."""


class ReadTimeout(HTTPError):
    """The server sent nothing for the read timeout."""


class ProtocolError(HTTPError):
    """The connection closed before the answer ended, or the answer is not HTTP/1.x."""


@dataclass(frozen=True, slots=True)
class URL:
    """A parsed http(s) URL; `target` is the path with its query, as a request line wants it."""

    scheme: str
    host: str
    port: int
    target: str

    @classmethod
    def parse(cls, url: str) -> URL:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(scheme, parts.hostname, port, target)

    def join(self, path: str) -> URL:
        """This URL with `path` appended to its path (a base URL and an endpoint)."""
        base, _, query = self.target.partition("?")
        return URL(self.scheme, self.host, self.port, base.rstrip("/") + path + (f"?{query}" if query else ""))

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"


# ---- connections and the pool -----------------------------------------------------------------


class _Conn:
    """A connection, with its read timer: one timer per wait that outlasts the timeout's start,
    not one per read (a timer per read cost a tenth of a request's CPU). `wait()` before awaiting
    the server, `waiting = False` after; past the timeout the timer aborts the connection and marks
    it `timed_out`, which turns the failed read into a ReadTimeout."""

    __slots__ = (
        "reader", "writer", "key", "absolute", "proxy_auth", "idle_since",
        "loop", "timer", "timeout", "since", "waiting", "timed_out",
    )  # fmt: skip

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: tuple) -> None:
        self.reader, self.writer, self.key = reader, writer, key
        self.absolute = False  # plain http through a proxy: the request line names the whole URL
        self.proxy_auth = ""  # its Proxy-Authorization header line, if the proxy URL has credentials
        self.idle_since = 0.0
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None
        self.timeout = READ_TIMEOUT
        self.since = 0.0  # when the current wait began
        self.waiting = self.timed_out = False

    def alive(self, now: float) -> bool:
        r = self.reader
        return not (
            r.at_eof() or r.exception() is not None or self.writer.is_closing() or now - self.idle_since > IDLE_EXPIRY
        )

    def wait(self) -> None:
        self.since, self.waiting = self.loop.time(), True
        if self.timer is None:
            self.timer = self.loop.call_at(self.since + self.timeout, self._check)

    def _check(self) -> None:
        self.timer = None
        if not self.waiting:  # between reads: the next wait() arms it again
            return
        if self.loop.time() - self.since >= self.timeout - 0.001:  # timers may fire a hair early
            self.timed_out = True
            self.writer.transport.abort()  # the read under way fails at once
        else:
            self.timer = self.loop.call_at(self.since + self.timeout, self._check)

    def unwatch(self) -> None:
        self.waiting = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        self.unwatch()
        self.writer.transport.abort()  # no goodbye owed: an HTTP/1.1 connection may close at any time


class _Pool:
    def __init__(self) -> None:
        self.idle: dict[tuple, list[_Conn]] = {}
        # (scheme, host, port) -> its proxy and Proxy-Authorization line, or None: read from the
        # environment at the first connection (reading it scans all of os.environ: ~0.1 ms)
        self.routes: dict[tuple, tuple[URL, str] | None] = {}

    def take(self, key: tuple) -> _Conn | None:
        conns = self.idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()  # the most recently used: the least likely to have been closed
            if conn.alive(now):
                return conn
            conn.close()
        return None

    def give(self, conn: _Conn) -> None:
        conn.unwatch()
        conns = self.idle.setdefault(conn.key, [])
        if len(conns) >= IDLE_MAX:
            conns.pop(0).close()
        conn.idle_since = time.monotonic()
        conns.append(conn)

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _Pool()
    return pool


async def aclose_pool() -> None:
    """Close this event loop's idle connections (a test's, or a program's before its loop ends) and
    forget the proxies it read from the environment."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        pool.close()


_TLS: tuple[tuple[str | None, str | None], ssl.SSLContext] | None = None


def tls_context() -> ssl.SSLContext:
    """The system's default verifying context, made once (it costs ~20 ms) and again only when
    SSL_CERT_FILE or SSL_CERT_DIR changes."""
    global _TLS
    env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if _TLS is None or _TLS[0] != env:
        _TLS = (env, ssl.create_default_context())
    return _TLS[1]


def proxy_for(url: URL) -> tuple[URL, str] | None:
    """The proxy the environment names for `url` (unless NO_PROXY exempts its host), with the
    Proxy-Authorization header line its URL's credentials make ("" without them)."""
    from urllib.request import getproxies_environment, proxy_bypass_environment  # type: ignore[attr-defined]

    proxies = getproxies_environment()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy or proxy_bypass_environment(f"{url.host}:{url.port}", proxies):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    parts = urlsplit(proxy)
    if parts.scheme.lower() != "http":
        raise ConnectError(f"proxy {proxy}: only http:// proxies are supported")
    auth = ""
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        auth = f"proxy-authorization: Basic {base64.b64encode(pair).decode()}\r\n"
    return URL.parse(proxy), auth


async def _connect(pool: _Pool, url: URL, key: tuple, timeout: float) -> _Conn:
    try:
        if key in pool.routes:
            route = pool.routes[key]
        else:
            route = pool.routes[key] = proxy_for(url)
        async with asyncio.timeout(timeout):
            if route is None:
                tls = tls_context() if url.scheme == "https" else None
                reader, writer = await asyncio.open_connection(
                    url.host, url.port, ssl=tls, server_hostname=url.host if tls else None, limit=_HEAD_MAX
                )
                return _Conn(reader, writer, key)
            proxy, conn_auth = route
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port, limit=_HEAD_MAX)
            conn = _Conn(reader, writer, key)
            conn.proxy_auth = conn_auth
            if url.scheme == "http":
                conn.absolute = True
                return conn
            try:
                await _tunnel(conn, url, proxy)
            except BaseException:
                conn.close()
                raise
            return conn
    except TimeoutError:
        raise ConnectError(f"cannot connect to {url.authority} within {timeout:g} s") from None
    except ssl.SSLError as e:
        raise ConnectError(f"TLS with {url.authority} failed: {e.reason or e}") from None
    except OSError as e:
        raise ConnectError(f"cannot connect to {url.authority}: {e.strerror or e}") from None


async def _tunnel(conn: _Conn, url: URL, proxy: URL) -> None:
    """Ask the proxy for a tunnel to url's host and port, then speak TLS with that host through it."""
    where = f"{url.host}:{url.port}" if ":" not in url.host else f"[{url.host}]:{url.port}"
    conn.writer.write(f"CONNECT {where} HTTP/1.1\r\nhost: {where}\r\n{conn.proxy_auth}\r\n".encode())
    try:
        head = await conn.reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise ConnectError(f"proxy {proxy.authority} closed the connection when asked for {where}") from None
    status, reason, _, _ = _parse_head(head)
    if not 200 <= status < 300:
        raise ConnectError(f"proxy {proxy.authority} refused a tunnel to {where}: HTTP {status} {reason}".rstrip())
    conn.proxy_auth = ""  # inside the tunnel the requests are the origin's
    await conn.writer.start_tls(tls_context(), server_hostname=url.host)


# ---- requests and responses -------------------------------------------------------------------


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str], bool]:
    """(status, reason, headers with lower-case names, HTTP/1.0?) of a response head."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"malformed header line: {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return int(code), reason, headers, version == "HTTP/1.0"


def _head(method: str, url: URL, conn: _Conn, headers: Mapping[str, str], length: int) -> bytes:
    target = str(url) if conn.absolute else url.target
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {url.authority}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r}: a line break in a header")
        lines.append(f"{name}: {value}\r\n")
    if length or method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {length}\r\n")
    lines.append(conn.proxy_auth)
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


async def request(
    method: str,
    url: URL | str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
) -> Response:
    """Send a request and read the answer's head; the body is the Response's to read."""
    if isinstance(url, str):
        url = URL.parse(url)
    pool = _pool()
    key = (url.scheme, url.host, url.port)
    headers = headers or {}
    for attempt in (1, 2):
        conn = pool.take(key)
        reused = conn is not None
        if conn is None:
            conn = await _connect(pool, url, key, connect_timeout)
        try:
            conn.writer.write(_head(method, url, conn, headers, len(body)) + body)
            conn.timeout, conn.timed_out = read_timeout, False
            conn.wait()
            head = await conn.reader.readuntil(b"\r\n\r\n")
            while head[9:10] == b"1" and not head.startswith(b"HTTP/1.1 101"):  # 100 Continue and its kind
                head = await conn.reader.readuntil(b"\r\n\r\n")
            conn.waiting = False
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            conn.close()
            if conn.timed_out:
                raise ReadTimeout(f"{url.authority} sent no answer within {read_timeout:g} s") from None
            received = isinstance(e, asyncio.IncompleteReadError) and e.partial
            if reused and attempt == 1 and not received:
                continue  # the server had closed this idle connection: it never saw the request
            raise ProtocolError(f"{url.authority} closed the connection before answering") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise ProtocolError(f"{url.authority} sent an answer head over {_HEAD_MAX // 1024} KiB") from None
        except BaseException:  # cancelled, or a header we would not send
            conn.close()
            raise
        try:
            status, reason, resp_headers, http10 = _parse_head(head)
        except ProtocolError as e:
            conn.close()
            raise ProtocolError(f"{url.authority}: {e}") from None
        return Response(conn, pool, url, method, status, reason, resp_headers, http10, read_timeout)
    raise AssertionError("unreachable")


class Response:
    """An answer whose head is read. Read its body once, whole (`read`), in pieces (`pieces`) or as
    server-sent events (`events`); then `aclose` it (reading it to its end does as much)."""

    __slots__ = ("status", "reason", "headers", "url", "_conn", "_pool", "_timeout", "_left", "_chunked", "_keep")

    def __init__(
        self,
        conn: _Conn,
        pool: _Pool,
        url: URL,
        method: str,
        status: int,
        reason: str,
        headers: dict[str, str],
        http10: bool,
        timeout: float,
    ) -> None:
        self.status, self.reason, self.headers, self.url = status, reason, headers, url
        self._conn: _Conn | None = conn
        self._pool, self._timeout = pool, timeout
        connection = headers.get("connection", "").lower()
        self._keep = "keep-alive" in connection if http10 else "close" not in connection
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left: int | None = 0  # body bytes still to read (of the current chunk, if chunked); None: to EOF
        if self._chunked:
            pass
        elif method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._left = 0
        elif (length := headers.get("content-length")) is not None:
            try:
                self._left = int(length.partition(",")[0])
            except ValueError:
                self._abandon()
                raise ProtocolError(f"{url.authority}: a Content-Length that is no number: {length!r}") from None
        else:
            self._left, self._keep = None, False
        if not self._chunked and self._left == 0:
            self._finish()

    @property
    def complete(self) -> bool:
        return self._conn is None

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep:
                self._pool.give(conn)
            else:
                conn.close()

    def _abandon(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """Give the connection back if the body was read to its end, else close it."""
        self._abandon()

    async def _piece(self) -> bytes:
        """The body's next piece; b"" at its end (then the connection is back in the pool)."""
        conn = self._conn
        if conn is None:
            return b""
        conn.wait()
        try:
            data = await (self._chunk(conn.reader) if self._chunked else self._plain(conn.reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            self._abandon()
            if conn.timed_out:
                raise self._timed_out() from None
            raise ProtocolError(f"{self.url.authority} closed the connection before the answer ended") from None
        except asyncio.LimitOverrunError:
            self._abandon()
            raise ProtocolError(f"{self.url.authority}: a chunk size line that does not end") from None
        except BaseException:
            self._abandon()
            raise
        conn.waiting = False
        if conn.timed_out:  # a body to the connection's end, ended by the timer
            self._abandon()
            raise self._timed_out()
        return data

    def _timed_out(self) -> ReadTimeout:
        return ReadTimeout(f"{self.url.authority} sent nothing for {self._timeout:g} s")

    async def _plain(self, reader: asyncio.StreamReader) -> bytes:
        """A piece of a body framed by Content-Length or by the connection's end."""
        if self._left is None:
            data = await reader.read(_PIECE)
            if not data:
                self._finish()
            return data
        data = await reader.read(min(self._left, _PIECE))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._left)
        self._left -= len(data)
        if not self._left:
            self._finish()
        return data

    async def _chunk(self, reader: asyncio.StreamReader) -> bytes:
        """A piece of a chunked body: a whole chunk when it is small, else a part of it."""
        if not self._left:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.partition(b";")[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"{self.url.authority}: a malformed chunk size {line[:40]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, unused
                    pass
                self._finish()
                return b""
            if size <= _PIECE:  # the chunk and its CRLF in one read
                data = await reader.readexactly(size + 2)
                if data[-2:] != b"\r\n":
                    raise ProtocolError(f"{self.url.authority}: a chunk not ended by CRLF")
                return data[:-2]
            self._left = size
        left = self._left or 0
        data = await reader.read(min(left, _PIECE))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        self._left = left - len(data)
        if not self._left and await reader.readexactly(2) != b"\r\n":
            raise ProtocolError(f"{self.url.authority}: a chunk not ended by CRLF")
        return data

    async def pieces(self) -> AsyncIterator[bytes]:
        while data := await self._piece():
            yield data

    async def read(self, limit: int = 16 * 1024 * 1024) -> bytes:
        """The whole body (at most `limit` bytes; past it, ProtocolError)."""
        parts: list[bytes] = []
        size = 0
        while data := await self._piece():
            parts.append(data)
            size += len(data)
            if size > limit:
                self._abandon()
                raise ProtocolError(f"{self.url.authority}: an answer over {limit} bytes")
        return b"".join(parts)

    async def events(self) -> AsyncIterator[tuple[str | None, str]]:
        """The body as server-sent events: (event name or None, data), the data lines joined by
        newlines. Events without data are skipped; the last event is kept even if the body ends
        without the blank line after it."""
        buf = b""
        while True:
            data = await self._piece()
            if data:
                buf = _lf(buf + data, final=False)
                if b"\n\n" not in buf:
                    continue
                blocks = buf.split(b"\n\n")
                buf = blocks.pop()
            else:
                blocks = _lf(buf, final=True).split(b"\n\n")
            for block in blocks:
                event = _event(block)
                if event is not None:
                    yield event
            if not data:
                return


def _lf(buf: bytes, final: bool) -> bytes:
    """CRLF and CR line ends made LF; a CR at the end is kept (it may be half of a CRLF) unless final."""
    if b"\r" not in buf:
        return buf
    keep = not final and buf.endswith(b"\r")
    if keep:
        buf = buf[:-1]
    buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return buf + b"\r" if keep else buf


def _event(block: bytes) -> tuple[str | None, str] | None:
    if block.startswith(b"data: ") and b"\n" not in block:  # the usual event: one data line, no name
        return None, block[6:].decode("utf-8", "replace")
    name: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):  # a comment (a keep-alive ping, say)
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace") or None
    if not data:
        return None
    return name, b"\n".join(data).decode("utf-8", "replace")


def json_headers(extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The headers a JSON API request carries, `extra` (lower-cased names) overriding them."""
    from .. import __version__

    out: dict[str, Any] = {
        "user-agent": f"ollie/{__version__}",
        "accept": "application/json",
        "accept-encoding": "identity",
        "content-type": "application/json",
    }
    out.update({k.lower(): v for k, v in (extra or {}).items()})
    return out
