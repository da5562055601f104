"""A small asyncio HTTP/1.1 client for the backends: what their wires need, and what real endpoints do.

    response = await request("POST", url, {"authorization": "Bearer …"}, body)
    try:
        if response.status >= 300:
            text = await response.read()
        await response.expect("events")               # the stream asked for, or UnexpectedAnswer
        async for event, data in response.events():   # server-sent events (`lines()`: NDJSON)
            ...
    finally:
        await response.aclose()   # a response read to its end goes back to the pool; else its connection closes

What it does: a keep-alive pool per (scheme, host, port), bound to the running event loop; bodies
framed by Content-Length, chunked transfer coding or the connection's end, decoded from gzip or
deflate (br and zstd too when a module for them is installed); server-sent events and JSON lines;
redirects (307 and 308 keep the method and body, 301-303 only for GET; credentials never go to
another host or over plain http); connections raced over a name's addresses, IPv6 and IPv4 alike
("happy eyeballs", RFC 8305); connect and read timeouts; TLS verified against SSL_CERT_FILE or
SSL_CERT_DIR when set, else the system's CA store, else the first CA bundle found where Linux
distributions keep one, else certifi's; HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY with
http://, https:// and SOCKS (socks5, socks5h, socks4, socks4a: python-socks) proxies, and loopback
hosts never proxied.

Failures are `HTTPError`s whose message names the URL and what went wrong, whose `check` says what
to look at, and whose `transient` says whether trying again may help: `ConnectError` (nothing
reached the server: no such host, refused, TLS, the proxy: not transient, but for a timeout),
`ReadTimeout`, `ProtocolError` (the connection closed mid-answer, or the answer is not HTTP),
`RedirectError`, and `UnexpectedAnswer` (an HTML page, JSON or anything else where a stream was
asked for). The backends turn them into one wording (`backends.transport_error`). A pooled
connection that the server closed while it was idle is noticed when the request finds it closed
with no byte of the answer read; the request is then sent again, once, on a fresh connection.
Nothing else is retried: retries with their waits are the Core's.

Why not the SDKs' transport (httpx and httpcore): a request through it cost 1-3.5 ms of the event
loop's CPU against 0.09 ms for a bare asyncio client, which capped a server of a thousand busy
sessions at ~270 requests/s (bench/scale.py); and each SDK brought its own trust store and its own
words for the same failure.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import html
import ipaddress
import json
import os
import re
import socket
import ssl
import time
import weakref
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, SupportsIndex
from urllib.parse import unquote, urljoin, urlsplit

from .. import __version__
from .hold import held_for

CONNECT_TIMEOUT = 5.0  # seconds to open a connection (names, TCP, the proxy, TLS)
READ_TIMEOUT = 600.0  # seconds without a byte of the answer: a model may think long before its first token
IDLE_MAX = 1024  # idle connections kept per (scheme, host, port)
IDLE_EXPIRY = 30.0  # seconds an idle connection is kept
HAPPY_EYEBALLS_DELAY = 0.25  # seconds before the next address is tried beside one that has not answered (RFC 8305)
MAX_REDIRECTS = 5
_HEAD_MAX = 64 * 1024  # a response's status line and headers
_PIECE = 64 * 1024
# Seconds a streamed answer's events may gather before its reader takes them (`event_batches`):
# a reader woken 20 times a second instead of at each of a model's tokens, as the event bus
# sends them on (agent/events.py); the answer's first event and its end come at once. Whoever
# runs the stream may say otherwise (`hold.stream_hold`).
STREAM_HOLD = 0.05
_REDIRECTS = frozenset((301, 302, 303, 307, 308))


class HTTPError(Exception):
    """A request failed below the API's own answers. The message names the URL and what went
    wrong; `check` says what to look at ("" if nothing); `about_url`: the fix is in the URL the
    user configured; `transient`: trying again may help (a timeout, a dropped connection)."""

    transient = True

    def __init__(
        self, message: str, check: str = "", *, transient: bool | None = None, about_url: bool = False
    ) -> None:
        super().__init__(message)
        self.check = check
        self.about_url = about_url
        if transient is not None:
            self.transient = transient


class ConnectError(HTTPError):
    """No connection (no such host, refused, TLS, the proxy): the server got nothing. Not
    transient, but for a connection that did not open in time."""

    transient = False


class ReadTimeout(HTTPError):
    """The server sent nothing for the read timeout."""


class ProtocolError(HTTPError):
    """The connection closed before the answer ended, or the answer is not HTTP/1.x."""


class RedirectError(HTTPError):
    """A redirect that is not followed: to no http(s) URL, one that would turn a POST into a GET,
    or one too many."""

    transient = False


class UnexpectedAnswer(HTTPError):
    """A 2xx answer that is not what was asked for: an HTML page, JSON (`body`: parsed, when it
    is), an encoding that cannot be decoded, or anything else. `where` names the URL."""

    transient = False

    def __init__(self, message: str, check: str = "", *, where: str, body: Any = None, about_url: bool = True):
        super().__init__(message, check, about_url=about_url)
        self.where = where
        self.body = body


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

    @property
    def display(self) -> str:
        """The URL for a message: without its query, which may hold a key."""
        return f"{self.scheme}://{self.authority}{self.target.partition('?')[0]}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"


# ---- connections and the pool -----------------------------------------------------------------


# What ends an answer's stream (`Response.hold`): patterns looked for one by one, each starting
# with a literal, which the regex engine finds by a fast scan (one pattern of alternatives is tried
# at each quote of the JSON: 1.6 us a read of a 185-byte event against 0.6, at each read).
Ends = tuple[re.Pattern[bytes], ...]


class _Reader(asyncio.StreamReader):
    """asyncio's StreamReader that a streamed answer's reader can also wait on for a while
    (`held`): it is woken when the time is up, when what arrives holds one of its `until` patterns (the
    answer's end), or at the stream's end or failure, rather than at each piece that arrives.
    (Leaving the socket unread meanwhile, so that the pieces wait in the kernel, cost more than it
    saved: two epoll changes a hold, at 300 sessions 3.04 ms of CPU a step against 2.82.)"""

    until: Ends | None = None  # set for the answer's life by whoever holds it
    _ended = False  # `until` was found in what arrived: no more holding
    _held: asyncio.Future[None] | None = None

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:  # bytes, from the protocol
        super().feed_data(data)
        if self.until is not None and not self._ended:
            for pattern in self.until:  # (a loop: a generator's any() costs a third of the searches)
                if pattern.search(data):  # type: ignore[call-overload]
                    self._ended = True
                    self._wake()
                    break

    def feed_eof(self) -> None:
        super().feed_eof()
        self._wake()

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self._held is not None:
            _resolve(self._held)

    async def held(self, seconds: float) -> None:
        """Return after `seconds`, or sooner (see the class)."""
        if self._ended or self.at_eof() or self.exception() is not None:
            return
        woken = self._held = asyncio.get_running_loop().create_future()
        _pool().wake_later(woken, seconds)
        try:
            await woken
        finally:
            if self._held is woken:
                self._held = None

    @property
    def buffered(self) -> int:
        """Bytes that came and are not read yet (the base class's buffer)."""
        return len(self._buffer)  # type: ignore[attr-defined]

    def watch(self, until: Ends | None) -> None:
        """Hold for `until` from now on (None: do not hold)."""
        self.until, self._ended = until, False


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _open_stream(
    sock: socket.socket, tls: ssl.SSLContext | None, host: str | None
) -> tuple[_Reader, asyncio.StreamWriter]:
    """asyncio.open_connection on `sock`, with a `_Reader`."""
    loop = asyncio.get_running_loop()
    reader = _Reader(limit=_HEAD_MAX, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.create_connection(lambda: protocol, sock=sock, ssl=tls, server_hostname=host)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class _Conn:
    """A connection, with its read timer: one timer per wait that outlasts the timeout's start,
    not one per read (a timer per read cost a tenth of a request's CPU). `wait()` before awaiting
    the server, `waiting = False` after; past the timeout the timer aborts the connection and marks
    it `timed_out`, which turns the failed read into a ReadTimeout."""

    __slots__ = (
        "reader", "writer", "key", "absolute", "proxy_auth", "idle_since",
        "loop", "timer", "timeout", "since", "waiting", "timed_out",
    )  # fmt: skip

    def __init__(self, reader: _Reader, writer: asyncio.StreamWriter, key: tuple) -> None:
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
    """A loop's idle connections, its routes, and the timer that ends every held reader's wait."""

    def __init__(self) -> None:
        self.idle: dict[tuple, list[_Conn]] = {}
        # Held readers' waits (`_Reader.held`), ended together by one timer: a timer each, tens a
        # second in each of hundreds of streams, would cost as much as the wakeups they save.
        self._waits: list[asyncio.Future[None]] = []
        self._tick: asyncio.TimerHandle | None = None
        # (scheme, host, port) -> its proxy, or None: read from the environment at the first
        # connection (reading it scans all of os.environ: ~0.1 ms)
        self.routes: dict[tuple, _Proxy | None] = {}

    def wake_later(self, future: asyncio.Future[None], seconds: float) -> None:
        """Resolve `future` within `seconds` (sooner if the tick that ends the waits comes sooner)."""
        self._waits.append(future)
        if self._tick is None:
            self._tick = asyncio.get_running_loop().call_later(seconds, self._wake_all)

    def _wake_all(self) -> None:
        self._tick = None
        waits, self._waits = self._waits, []
        for future in waits:
            _resolve(future)

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
        conn.reader.watch(None)
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
        if self._tick is not None:
            self._tick.cancel()
        self._wake_all()


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


# ---- TLS: whose certificates are trusted --------------------------------------------------------

# Where Linux distributions keep their CA bundle (certifi-system-store's and truststore's list, and
# Debian's first): tried when the Python's own OpenSSL points at none, as some uv-managed and
# standalone builds do on RHEL and NixOS.
CA_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Gentoo, NixOS
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # Fedora, RHEL 7 and later
    "/etc/pki/tls/certs/ca-bundle.crt",  # older Fedora and RHEL, CentOS
    "/etc/pki/tls/cert.pem",
    "/etc/ssl/cert.pem",  # Alpine, Arch
    "/etc/ssl/ca-bundle.pem",  # SUSE
)
_HASHED = re.compile(r"^[0-9a-fA-F]{8}\.[0-9]$")
_TLS: tuple[tuple[str | None, str | None], ssl.SSLContext, str] | None = None


def tls_context() -> ssl.SSLContext:
    """The verifying context, made once (it costs ~20 ms) and again only when SSL_CERT_FILE or
    SSL_CERT_DIR changes."""
    global _TLS
    env = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if _TLS is None or _TLS[0] != env:
        _TLS = (env, *_make_tls(*env))
    return _TLS[1]


def trust_store() -> str:
    """Which CA certificates the context trusts, in words for a message."""
    tls_context()
    assert _TLS is not None
    return _TLS[2]


def _make_tls(cert_file: str | None, cert_dir: str | None) -> tuple[ssl.SSLContext, str]:
    if cert_file or cert_dir:  # the user's choice, honoured as OpenSSL reads it
        if cert_file and not os.path.isfile(cert_file):
            raise ConnectError(
                f"SSL_CERT_FILE is {cert_file}, which is no file",
                "set it to a file of CA certificates (PEM), or unset it to trust the system's",
            )
        return ssl.create_default_context(), f"SSL_CERT_FILE {cert_file}" if cert_file else f"SSL_CERT_DIR {cert_dir}"
    paths = ssl.get_default_verify_paths()  # cafile and capath only if they exist
    if paths.cafile or (paths.capath and _has_certs(paths.capath)):
        return ssl.create_default_context(), f"the system's, {paths.cafile or paths.capath}"
    for path in (os.environ.get("NIX_SSL_CERT_FILE"), *CA_FILES):
        if path and os.path.isfile(path):
            return ssl.create_default_context(cafile=path), path
    try:
        import certifi
    except ImportError:  # a trust store of none: every server's certificate is refused, saying so
        return ssl.create_default_context(), "none (no CA bundle found; set SSL_CERT_FILE)"
    return ssl.create_default_context(cafile=certifi.where()), f"certifi's, {certifi.where()}"


def _has_certs(path: str) -> bool:
    try:
        return any(_HASHED.match(name) for name in os.listdir(path))
    except OSError:
        return False


# ---- proxies ------------------------------------------------------------------------------------

_PROXY_SCHEMES = ("http", "https", "socks5", "socks5h", "socks4", "socks4a")


@dataclass(frozen=True, slots=True)
class _Proxy:
    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None
    var: str  # the variable that named it
    text: str  # its URL without credentials, for messages

    @property
    def auth(self) -> str:
        """The Proxy-Authorization header line an http(s) proxy gets ("" without credentials)."""
        if self.username is None:
            return ""
        pair = f"{self.username}:{self.password or ''}".encode()
        return f"proxy-authorization: Basic {base64.b64encode(pair).decode()}\r\n"

    @property
    def where(self) -> str:
        return f"the proxy {self.text} ({self.var})"


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 and ::1: never proxied (a proxy cannot reach this machine's loopback)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_for(url: URL) -> _Proxy | None:
    """The proxy the environment names for `url`, unless its host is loopback or NO_PROXY exempts
    it. A proxy of a scheme ollie does not speak is a ConnectError."""
    from urllib.request import getproxies_environment, proxy_bypass_environment  # type: ignore[attr-defined]

    if is_loopback(url.host):
        return None
    proxies = getproxies_environment()
    proxy = proxies.get(url.scheme)
    var = f"{url.scheme.upper()}_PROXY"
    if not proxy:
        proxy, var = proxies.get("all"), "ALL_PROXY"
    if not proxy or proxy_bypass_environment(f"{url.host}:{url.port}", proxies):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    parts = urlsplit(proxy)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    if scheme not in _PROXY_SCHEMES or not parts.hostname or port == -1:
        shown = proxy.replace(f"{parts.password}@", "***@") if parts.password else proxy
        raise ConnectError(
            f"cannot reach {url.display}: the proxy {shown} ({var}) is not one ollie can use",
            f"give {var} as http://, https://, socks5://, socks5h://, socks4:// or socks4a:// and a host, "
            "or list the host in NO_PROXY",
        )
    default = {"http": 80, "https": 443}.get(scheme, 1080)
    host = parts.hostname
    text = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port or default}"
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return _Proxy(scheme, host, port or default, user, password, var, text)


# ---- connecting ---------------------------------------------------------------------------------


async def _connect(pool: _Pool, url: URL, key: tuple, timeout: float) -> _Conn:
    if key in pool.routes:
        route = pool.routes[key]
    else:
        route = pool.routes[key] = proxy_for(url)
    where = f"cannot reach {url.display}" + (f" through {route.where}" if route else "")
    if url.scheme == "https" or (route is not None and route.scheme == "https"):
        tls_context()  # a bad SSL_CERT_FILE is told before anything else
    try:
        async with asyncio.timeout(timeout):
            if route is None:
                sock = await _open_tcp(url.host, url.port)
                return await _wrap(sock, url, key)
            return await _via_proxy(route, url, key, where)
    except TimeoutError:
        raise ConnectError(
            f"{where}: no connection within {timeout:g} s",
            "check the host and the port, and that no firewall drops the traffic",
            transient=True,
            about_url=route is None,
        ) from None
    except HTTPError:
        raise
    except (OSError, ssl.SSLError) as e:
        raise _connect_failure(e, where, url.host) from None


async def _wrap(sock: socket.socket, url: URL, key: tuple) -> _Conn:
    """A connected socket as a connection: TLS with the origin for https."""
    tls = tls_context() if url.scheme == "https" else None
    try:
        reader, writer = await _open_stream(sock, tls, url.host if tls else None)
    except BaseException:
        sock.close()
        raise
    return _Conn(reader, writer, key)


def _connect_failure(e: OSError | ssl.SSLError, where: str, host: str, check_proxy: str = "") -> ConnectError:
    """One wording for one failure to connect. `check_proxy`: what to check when it was the proxy."""
    if isinstance(e, ssl.SSLCertVerificationError):
        why = e.verify_message or e.reason or str(e)
        if e.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH
            return ConnectError(f"{where}: its TLS certificate is for another host ({why})", "check the host name")
        return ConnectError(
            f"{where}: its TLS certificate is not trusted ({why}; trusted: {trust_store()})",
            "if the server's certificate comes from a CA of its own, set SSL_CERT_FILE to that CA's certificate",
        )
    if isinstance(e, ssl.SSLError):
        reason = e.reason or str(e)
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"):
            return ConnectError(
                f"{where}: TLS failed ({reason})",
                "the server may speak plain http there: check the URL's scheme",
                about_url=True,
            )
        return ConnectError(f"{where}: TLS failed ({reason})", check_proxy or "check the URL", about_url=True)
    if isinstance(e, socket.gaierror):
        what = e.strerror or str(e)
        if e.errno in (socket.EAI_AGAIN, socket.EAI_FAIL):
            return ConnectError(
                f"{where}: the name {host} could not be looked up ({what})", "check the network and DNS"
            )
        return ConnectError(
            f"{where}: there is no host {host} ({what})",
            check_proxy or "check the host name",
            about_url=not check_proxy,
        )
    if isinstance(e, ConnectionRefusedError):
        return ConnectError(
            f"{where}: connection refused",
            check_proxy or "check that the server is running and listens on that port",
            about_url=not check_proxy,
        )
    what = (e.strerror or str(e) or type(e).__name__).rstrip(".")
    if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.ENETDOWN):
        return ConnectError(
            f"{where}: {what[:1].lower()}{what[1:]}", check_proxy or "check the network and the address"
        )
    # reset while connecting, too many open files, …: maybe not the next time
    return ConnectError(f"{where}: {what[:1].lower()}{what[1:]}", check_proxy, transient=True)


async def _open_tcp(host: str, port: int) -> socket.socket:
    """A TCP connection to host: its addresses raced, one more started every HAPPY_EYEBALLS_DELAY
    seconds, or at once when the last one failed; the first to connect wins."""
    try:  # an address literal needs no lookup
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return await _race(_interleave(infos))


def _interleave(infos: list[Any]) -> list[Any]:
    """Addresses alternating between families, the first family first (RFC 8305, 4)."""
    first = [i for i in infos if i[0] == infos[0][0]]
    other = [i for i in infos if i[0] != infos[0][0]]
    out = []
    for n in range(max(len(first), len(other))):
        out += first[n : n + 1] + other[n : n + 1]
    return out


async def _race(infos: list[Any]) -> socket.socket:
    loop = asyncio.get_running_loop()
    left = list(infos)
    pending: set[asyncio.Task[socket.socket]] = set()
    errors: list[OSError] = []
    try:
        while left or pending:
            if left:
                pending.add(asyncio.ensure_future(_attempt(loop, left.pop(0))))
            done, pending = await asyncio.wait(
                pending, timeout=HAPPY_EYEBALLS_DELAY if left else None, return_when=asyncio.FIRST_COMPLETED
            )
            winner = None
            for task in done:
                exc = task.exception()
                if exc is not None:
                    errors.append(exc)  # type: ignore[arg-type]
                elif winner is None:
                    winner = task.result()
                else:
                    task.result().close()  # two at once: one is enough
            if winner is not None:
                return winner
    finally:
        for task in pending:
            task.cancel()  # its socket closes as it is cancelled
    refused = [e for e in errors if isinstance(e, ConnectionRefusedError)]
    raise (refused or errors or [OSError(errno.EADDRNOTAVAIL, "the name has no address")])[0]


async def _attempt(loop: asyncio.AbstractEventLoop, info: Any) -> socket.socket:
    family, kind, proto, _, address = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


async def _via_proxy(route: _Proxy, url: URL, key: tuple, where: str) -> _Conn:
    check = f"check {route.var}, or list {url.host} in NO_PROXY"
    if route.scheme.startswith("socks"):
        return await _wrap(await _socks(route, url, where, check), url, key)
    proxy_where = f"cannot reach {url.display}: cannot reach {route.where}"
    try:
        sock = await _open_tcp(route.host, route.port)
        tls = tls_context() if route.scheme == "https" else None
        try:
            reader, writer = await _open_stream(sock, tls, route.host if tls else None)
        except BaseException:
            sock.close()
            raise
    except (OSError, ssl.SSLError) as e:
        raise _connect_failure(e, proxy_where, route.host, check) from None
    conn = _Conn(reader, writer, key)
    conn.proxy_auth = route.auth
    if url.scheme == "http":
        conn.absolute = True
        return conn
    try:
        await _tunnel(conn, url, route, where, check)
    except BaseException:
        conn.close()
        raise
    return conn


async def _tunnel(conn: _Conn, url: URL, route: _Proxy, where: str, check: str) -> None:
    """Ask the proxy for a tunnel to url's host and port, then speak TLS with that host through it."""
    target = f"{url.host}:{url.port}" if ":" not in url.host else f"[{url.host}]:{url.port}"
    conn.writer.write(f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n{conn.proxy_auth}\r\n".encode())
    try:
        head = await conn.reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        raise ConnectError(f"{where}: the proxy closed the connection when asked for {target}", check) from None
    status, reason, _, _ = _parse_head(head)
    if not 200 <= status < 300:
        raise ConnectError(f"{where}: the proxy refused a tunnel to {target}: HTTP {status} {reason}".rstrip(), check)
    conn.proxy_auth = ""  # inside the tunnel the requests are the origin's
    await conn.writer.start_tls(tls_context(), server_hostname=url.host)


async def _socks(route: _Proxy, url: URL, where: str, check: str) -> socket.socket:
    """A socket connected to url's host and port through a SOCKS proxy (python-socks). socks5h
    and socks4a leave the name to the proxy; socks5 and socks4 look it up here."""
    try:
        from python_socks import ProxyConnectionError, ProxyError, ProxyType
        from python_socks.async_.asyncio import Proxy
    except ImportError:
        raise ConnectError(
            f"{where}: SOCKS proxies need the python-socks package", "pip install python-socks"
        ) from None
    kind = ProxyType.SOCKS5 if route.scheme.startswith("socks5") else ProxyType.SOCKS4
    proxy = Proxy(kind, route.host, route.port, route.username, route.password, rdns=route.scheme.endswith(("h", "a")))
    try:
        return await proxy.connect(url.host, url.port)  # within the caller's connect timeout
    except ProxyConnectionError as e:  # the proxy itself could not be reached
        cause = e.__cause__ if isinstance(e.__cause__, OSError) else e
        raise _connect_failure(
            cause, f"cannot reach {url.display}: cannot reach {route.where}", route.host, check
        ) from None
    except ProxyError as e:  # its answer: refused, unreachable, credentials, …
        raise ConnectError(f"{where}: {str(e).rstrip('.')}", check) from None


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
    follow_redirects: bool = True,
) -> Response:
    """Send a request and read the answer's head, following redirects; the body is the
    Response's to read."""
    if isinstance(url, str):
        url = URL.parse(url)
    headers = headers or {}
    first = url
    for _ in range(MAX_REDIRECTS + 1):
        response = await _send(method, url, headers, body, connect_timeout, read_timeout)
        if response.status not in _REDIRECTS or not follow_redirects:
            if url is not first:
                response.first_url = first
            return response
        location = response.headers.get("location")
        if not location:
            return response
        await response.discard()
        try:
            target = URL.parse(urljoin(str(url), location))
        except ValueError:
            raise RedirectError(
                f"{url.display} redirected to {location[:200]!r}, which is no http(s) URL",
                "check the URL",
                about_url=True,
            ) from None
        if response.status in (301, 302, 303) and method not in ("GET", "HEAD"):
            raise RedirectError(
                f"{url.display} redirected the {method} to {target.display} with HTTP {response.status}, "
                f"which would make it a GET",
                f"check the URL: the server points to {target.display}",
                about_url=True,
            )
        if not _same_trust(url, target):
            headers = {k: v for k, v in headers.items() if not _credential(k)}
        url = target
    raise RedirectError(f"{first.display}: more than {MAX_REDIRECTS} redirects", "check the URL", about_url=True)


def _same_trust(a: URL, b: URL) -> bool:
    """May credentials sent to a go to b? The same host and port, or the same host moved from
    http to https on their default ports; never from https to http."""
    if a.host != b.host or (a.scheme == "https" and b.scheme == "http"):
        return False
    return a.port == b.port or (a.scheme, a.port, b.scheme, b.port) == ("http", 80, "https", 443)


_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "cookie", "session", "password")


def _credential(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in _CREDENTIAL_WORDS)


async def _send(
    method: str, url: URL, headers: Mapping[str, str], body: bytes, connect_timeout: float, read_timeout: float
) -> Response:
    pool = _pool()
    key = (url.scheme, url.host, url.port)
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
                raise ReadTimeout(f"{url.display} sent no answer within {read_timeout:g} s") from None
            received = isinstance(e, asyncio.IncompleteReadError) and e.partial
            if reused and attempt == 1 and not received:
                continue  # the server had closed this idle connection: it never saw the request
            raise ProtocolError(f"{url.display} closed the connection before answering") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise ProtocolError(
                f"{url.display} sent an answer head over {_HEAD_MAX // 1024} KiB", transient=False
            ) from None
        except BaseException:  # cancelled, or a header we would not send
            conn.close()
            raise
        try:
            status, reason, resp_headers, http10 = _parse_head(head)
        except ProtocolError as e:
            conn.close()
            raise ProtocolError(
                f"{url.display}: {e}", "check the URL's scheme and port", transient=False, about_url=True
            ) from None
        return Response(conn, pool, url, method, status, reason, resp_headers, http10, read_timeout)
    raise AssertionError("unreachable")


class Response:
    """An answer whose head is read. Read its body once, whole (`read`), in pieces (`pieces`), as
    server-sent events (`events`) or as lines (`lines`); then `aclose` it (reading it to its end
    does as much). The body is decoded as its Content-Encoding says."""

    __slots__ = (
        "status", "reason", "headers", "url", "first_url", "_conn", "_pool", "_timeout", "_left",
        "_chunked", "_keep", "_next", "_decoder", "_pending", "_held",
    )  # fmt: skip

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
        self.first_url: URL | None = None  # the URL asked for, when redirects led to this one
        self._conn: _Conn | None = conn
        self._pool, self._timeout = pool, timeout
        self._pending = b""  # a piece read ahead (`peek`), read again first
        self._next: Callable[[], Any] = self._piece
        self._decoder: Any = None
        self._held: _Reader | None = None  # the reader a streamed answer is held on (`hold`)
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
                raise ProtocolError(f"{url.display}: a Content-Length that is no number: {length!r}") from None
        else:
            self._left, self._keep = None, False
        if (encoding := headers.get("content-encoding")) is not None and encoding.lower() != "identity":
            self._decoder = _decoders(encoding)
            self._next = self._refuse if isinstance(self._decoder, str) else self._decoded
        if not self._chunked and self._left == 0:
            self._finish()

    @property
    def complete(self) -> bool:
        return self._conn is None

    @property
    def where(self) -> str:
        """The URL for a message, and the one asked for when redirects led here."""
        if self.first_url is None:
            return self.url.display
        return f"{self.url.display} (redirected from {self.first_url.display})"

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

    async def discard(self, limit: int = 64 * 1024) -> None:
        """Read a body nobody wants (a redirect's) so that its connection may serve again; a
        long or slow one closes it instead."""
        try:
            async with asyncio.timeout(1.0):
                await self.read(limit)
        except (HTTPError, TimeoutError):
            pass
        self._abandon()

    async def _piece(self) -> bytes:
        """The body's next piece as it came; b"" at its end (then the connection is back in the pool)."""
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
            raise ProtocolError(f"{self.url.display} closed the connection before the answer ended") from None
        except asyncio.LimitOverrunError:
            self._abandon()
            raise ProtocolError(f"{self.url.display}: a chunk size line that does not end") from None
        except BaseException:
            self._abandon()
            raise
        conn.waiting = False
        if conn.timed_out:  # a body to the connection's end, ended by the timer
            self._abandon()
            raise self._timed_out()
        return data

    async def _decoded(self) -> bytes:
        """The body's next piece, decoded; b"" at its end."""
        while True:
            data = await self._piece()
            decoders = self._decoder
            if not decoders:  # none, or flushed at the body's end
                return data
            try:
                if data:
                    for d in decoders:
                        data = d.decompress(data)
                    if data:
                        return data
                    continue
                for d in decoders:  # the body's end: what each decoder holds, through those after it
                    data = (d.decompress(data) if data else b"") + d.flush()
                self._decoder = []
                return data
            except Exception as e:  # zlib.error, brotli.error, zstd's ZstdError
                self._abandon()
                encoding = self.headers.get("content-encoding")
                raise ProtocolError(
                    f"{self.url.display}: its {encoding}-encoded answer cannot be decoded ({e})", transient=False
                ) from None

    async def _refuse(self) -> bytes:
        """The body of an encoding ollie cannot decode: an UnexpectedAnswer naming it."""
        self._abandon()
        encoding = self._decoder
        need = {"br": " (pip install brotli)", "zstd": " (pip install zstandard)"}.get(encoding, "")
        raise UnexpectedAnswer(
            f"{self.where} answered in the {encoding!r} content encoding, which ollie cannot decode{need}",
            "check what stands between ollie and the server (a proxy, say)",
            where=self.where,
            about_url=False,
        )

    def _timed_out(self) -> ReadTimeout:
        return ReadTimeout(f"{self.url.display} sent nothing for {self._timeout:g} s")

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
                raise ProtocolError(f"{self.url.display}: a malformed chunk size {line[:40]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, unused
                    pass
                self._finish()
                return b""
            if size <= _PIECE:  # the chunk and its CRLF in one read
                data = await reader.readexactly(size + 2)
                if data[-2:] != b"\r\n":
                    raise ProtocolError(f"{self.url.display}: a chunk not ended by CRLF")
                return data[:-2]
            self._left = size
        left = self._left or 0
        data = await reader.read(min(left, _PIECE))
        if not data:
            raise asyncio.IncompleteReadError(b"", left)
        self._left = left - len(data)
        if not self._left and await reader.readexactly(2) != b"\r\n":
            raise ProtocolError(f"{self.url.display}: a chunk not ended by CRLF")
        return data

    async def peek(self) -> bytes:
        """The body's next piece, kept to be read again; b"" if the body is empty."""
        if not self._pending:
            self._pending = await self._next()
        return self._pending

    def _take_pending(self) -> bytes:
        data, self._pending = self._pending, b""
        return data

    async def pieces(self) -> AsyncIterator[bytes]:
        if data := self._take_pending():
            yield data
        while data := await self._next():
            yield data

    async def read(self, limit: int = 16 * 1024 * 1024) -> bytes:
        """The whole body (at most `limit` bytes; past it, ProtocolError)."""
        parts: list[bytes] = [self._take_pending()]
        size = len(parts[0])
        while data := await self._next():
            parts.append(data)
            size += len(data)
            if size > limit:
                self._abandon()
                raise ProtocolError(f"{self.url.display}: an answer over {limit} bytes", transient=False)
        return b"".join(parts)

    async def read_some(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body, for a message (waiting 5 s at most); the rest is left
        unread and the connection closed."""
        parts: list[bytes] = [self._take_pending()]
        size = len(parts[0])
        try:
            async with asyncio.timeout(5.0):
                while size < limit and (data := await self._next()):
                    parts.append(data)
                    size += len(data)
        except (HTTPError, TimeoutError):
            pass
        self._abandon()
        return b"".join(parts)[:limit]

    async def events(self) -> AsyncIterator[tuple[str | None, str]]:
        """The body as server-sent events: (event name or None, data), the data lines joined by
        newlines. Events without data are skipped; the last event is kept even if the body ends
        without the blank line after it."""
        async for batch in self.event_batches():
            for event in batch:
                yield event

    async def _gathered(self) -> tuple[bytes, bool]:
        """The body's next piece, with (when held) every piece that came meanwhile, and whether
        the body goes on after them (once it ended, its connection may serve another request:
        nothing more is read or held on it)."""
        more = await self._next()
        parts = [more]  # joined once: a hold may gather hundreds of small chunks
        while more and self._conn is not None and self._held is not None and self._held.buffered:
            more = await self._next()
            parts.append(more)
        return b"".join(parts) if len(parts) > 1 else parts[0], bool(more) and self._conn is not None

    def hold(self, until: Ends) -> None:
        """From now on, after each list of `event_batches` or `line_batches` the next waits up to
        STREAM_HOLD seconds (or those of `hold.stream_hold`) for more, and comes at once when
        one of `until`'s patterns (the answer's end) or the body's end comes: a model's stream of a
        token every few ms wakes its reader a few times a second, not at each token, and its end
        is not held. A backend starts holding once its answer's first content came (so that comes
        at once). Not for an encoded body, in which the pattern cannot be seen."""
        if self._held is None and self._conn is not None and self._decoder is None:
            self._held = self._conn.reader
            self._held.watch(until)

    async def event_batches(self) -> AsyncIterator[list[tuple[str | None, str]]]:
        """The events as `events` gives them, in lists: those that one read completed (what came
        meanwhile, when the reader is behind, or while it was held: `hold`), so that a reader can
        do its work once a list."""
        buf = self._take_pending()
        while True:
            data, more = await self._gathered()
            if more:
                buf = _lf(buf + data, final=False)
                if b"\n\n" not in buf:
                    continue
                blocks = buf.split(b"\n\n")
                buf = blocks.pop()
            else:
                blocks = _lf(buf + data, final=True).split(b"\n\n")
            batch = [event for event in map(_event, blocks) if event is not None]
            if batch:
                yield batch
                if self._held is not None and more:
                    await self._held.held(held_for(STREAM_HOLD))
            if not more:
                return

    async def lines(self) -> AsyncIterator[str]:
        """The body as lines (JSON lines, say), without their line ends; a last line without
        one is kept."""
        async for batch in self.line_batches():
            for line in batch:
                yield line

    async def line_batches(self) -> AsyncIterator[list[str]]:
        """The lines as `lines` gives them, in lists: those that one read completed (or that came
        while it was held, as `event_batches` says)."""
        buf = self._take_pending()
        while True:
            data, more = await self._gathered()
            buf += data
            if not more:
                break
            if b"\n" in buf:
                *lines, buf = buf.split(b"\n")
                yield [line.rstrip(b"\r").decode("utf-8", "replace") for line in lines]
                if self._held is not None:
                    await self._held.held(held_for(STREAM_HOLD))
        last = [line.rstrip(b"\r").decode("utf-8", "replace") for line in buf.split(b"\n") if line]
        if last:
            yield last

    async def expect(self, kind: str) -> None:
        """Make sure a 2xx answer is the stream asked for, `"events"` (server-sent events) or
        `"lines"` (JSON lines); else raise UnexpectedAnswer saying what it is. A stream under
        another content type is taken for what it is."""
        ctype = self.headers.get("content-type", "").lower()
        if kind == "events" and ctype.startswith("text/event-stream"):
            return
        if kind == "lines" and ctype.startswith(("application/x-ndjson", "application/json")):
            return
        try:
            first = (await self.peek()).lstrip()
        except BaseException:
            self._abandon()
            raise
        asked = "a stream of server-sent events" if kind == "events" else "a stream of JSON lines"
        where = self.where
        if "html" in ctype or first[:1] == b"<":
            title = html_title(await self.read_some(64 * 1024))
            raise UnexpectedAnswer(
                f"{where} answered with an HTML page{f' ({title!r})' if title else ''}, not {asked}",
                "check the URL: it does not lead to the API",
                where=where,
            )
        if kind == "events" and first.startswith((b"data:", b"event:", b":", b"id:", b"retry:")):
            return
        if kind == "lines" and first[:1] == b"{":
            return
        if "json" in ctype or first[:1] in (b"{", b"["):
            raw = await self.read_some(1024 * 1024)
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError):
                body = None
            raise UnexpectedAnswer(
                f"{where} answered with JSON, not {asked}: {snippet(raw)}",
                "check the URL, and that the server streams",
                where=where,
                body=body,
            )
        if not first:
            self._abandon()
            raise UnexpectedAnswer(f"{where} answered with an empty body, not {asked}", "check the URL", where=where)
        raw = await self.read_some(1024)
        raise UnexpectedAnswer(
            f"{where} answered with {ctype.partition(';')[0] or 'no content type'}, not {asked}: {snippet(raw)}",
            "check the URL",
            where=where,
        )


def snippet(raw: bytes, size: int = 200) -> str:
    """The start of a body, as one line of text for a message."""
    text = " ".join(raw[: size * 4].decode("utf-8", "replace").split())
    return repr(text[:size] + ("…" if len(text) > size else ""))


_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.I | re.S)


def html_title(raw: bytes) -> str:
    """An HTML page's title, "" if it has none."""
    m = _TITLE.search(raw)
    if not m:
        return ""
    return " ".join(html.unescape(m.group(1).decode("utf-8", "replace")).split())[:120]


# ---- Content-Encoding ---------------------------------------------------------------------------


class _Deflate:
    """HTTP's deflate: zlib-wrapped, as the RFC says, or raw, as some servers send it."""

    def __init__(self) -> None:
        self._d: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._d is None:
            self._d = zlib.decompressobj()
            try:
                return self._d.decompress(data)
            except zlib.error:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._d.decompress(data)

    def flush(self) -> bytes:
        return self._d.flush() if self._d is not None else b""


class _Streaming:
    """A decompressor whose objects have `decompress` but no `flush` (brotli's, zstd's)."""

    def __init__(self, decompress: Callable[[bytes], bytes]) -> None:
        self.decompress = decompress

    def flush(self) -> bytes:
        return b""


def _decoder(encoding: str) -> Any:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return _Deflate()
    if encoding == "br":
        try:
            import brotli  # type: ignore[import-not-found]

            return _Streaming(brotli.Decompressor().process)
        except ImportError:
            pass
        try:
            import brotlicffi  # type: ignore[import-not-found]

            return _Streaming(brotlicffi.Decompressor().decompress)
        except ImportError:
            return None
    if encoding == "zstd":
        try:
            from compression import zstd  # type: ignore[import-not-found]  # Python 3.14

            return _Streaming(zstd.ZstdDecompressor().decompress)
        except ImportError:
            pass
        try:
            import zstandard  # type: ignore[import-not-found]

            return _Streaming(zstandard.ZstdDecompressor().decompressobj().decompress)
        except ImportError:
            return None
    return None


def _decoders(header: str) -> list[Any] | str:
    """The decoders of a Content-Encoding, in the order they apply (the last encoding first), or
    the name of one that cannot be had."""
    out = []
    for encoding in reversed([e.strip().lower() for e in header.split(",") if e.strip()]):
        if encoding != "identity":
            decoder = _decoder(encoding)
            if decoder is None:
                return encoding
            out.append(decoder)
    return out


ACCEPT_ENCODING = "gzip, deflate"  # what every Python decodes; br and zstd are decoded when they come anyway


# ---- server-sent events -------------------------------------------------------------------------


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

    out: dict[str, Any] = {
        "user-agent": f"ollie/{__version__}",
        "accept": "application/json",
        "accept-encoding": ACCEPT_ENCODING,
        "content-type": "application/json",
    }
    out.update({k.lower(): v for k, v in (extra or {}).items()})
    return out
