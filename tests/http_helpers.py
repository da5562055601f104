"""What real endpoints do, played on loopback: an origin server that answers raw bytes, an http(s)
forward proxy, a SOCKS5 proxy, a CA of its own, and a mount namespace with its own /etc files (a
hosts file that gives a name two addresses, a resolver that knows no name, a Python whose OpenSSL
finds no CA bundle). No byte leaves this machine: the proxies stand for machines that know
`origin.test` and connect every name to 127.0.0.1, and namespaces resolve from files only.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ollie.backends import _http

# ---- an origin server -----------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[["Origin", Seen, asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection?


class Origin:
    """An HTTP/1.1 server on 127.0.0.1 (and TLS with `ssl_context`) in the test's event loop;
    `routes` maps a path to a handler that writes raw bytes; every request is in `seen`."""

    def __init__(self, routes: dict[str, Handler], ssl_context: ssl.SSLContext | None = None, port: int = 0) -> None:
        self.routes, self.ssl, self.port = routes, ssl_context, port
        self.seen: list[Seen] = []
        self.connections = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> Origin:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for w in self._writers:
            w.transport.abort()
        for t in self._tasks:
            t.cancel()
        await _http.aclose_pool()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"{'https' if self.ssl else 'http'}://{host}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, _, v = line.partition(":")
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                seen = Seen(method, target, headers, body)
                self.seen.append(seen)
                handler = self.routes.get(target.split("?")[0])
                if handler is None:
                    writer.write(raw(404, b'{"error": "no such route"}', {"content-type": "application/json"}))
                    keep = True
                else:
                    keep = await handler(self, seen, writer)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.transport.abort()


def raw(status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None, reason: str = "X") -> bytes:
    """A whole answer framed by Content-Length."""
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return head.encode() + b"\r\n" + body


def chunked_head(headers: dict[str, str]) -> bytes:
    return (
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    ).encode() + b"\r\n"


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def answer_with(data: bytes) -> Handler:
    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        return True

    return handler


# ---- proxies --------------------------------------------------------------------------------------


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, edit: Callable[[bytes], bytes] | None = None
) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(edit(data) if edit else data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class _Relay:
    def __init__(self) -> None:
        self.seen: list[str] = []  # what each client asked for
        self._tasks: set[asyncio.Task] = set()

    def _splice(
        self, a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[Any, Any], edit: Any = None
    ) -> None:
        """Relay a's bytes to b (through `edit`) and b's to a."""
        for r, w, e in ((a[0], b[1], edit), (b[0], a[1], None)):
            task = asyncio.ensure_future(_pipe(r, w, e))
            self._tasks.add(task)

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for t in self._tasks:
            t.cancel()
        await _http.aclose_pool()


class HttpProxy(_Relay):
    """A forward proxy (over TLS with `ssl_context`): CONNECT tunnels, and absolute-form requests
    relayed; every name it is asked for is 127.0.0.1. `seen`: the request lines."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, need_auth: str | None = None) -> None:
        super().__init__()
        self.ssl, self.need_auth = ssl_context, need_auth
        self.heads: list[bytes] = []

    async def __aenter__(self) -> HttpProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.heads.append(head)
        method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
        self.seen.append(f"{method} {target}")
        if self.need_auth and f"proxy-authorization: Basic {self.need_auth}" not in head.decode():
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        if method == "CONNECT":
            port = int(target.rsplit(":", 1)[1])
            upstream = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self._splice((reader, writer), upstream)
        else:  # requests relayed in origin form, as proxies do (the later ones on the connection too)
            origin = target.split("/", 3)[:3]
            prefix = f" {'/'.join(origin)}/".encode()
            upstream = await asyncio.open_connection("127.0.0.1", int(origin[2].rsplit(":", 1)[1]))

            def origin_form(data: bytes) -> bytes:
                return data.replace(prefix, b" /")

            upstream[1].write(origin_form(head))
            self._splice((reader, writer), upstream, origin_form)


class Socks5Proxy(_Relay):
    """A SOCKS5 proxy (RFC 1928, and RFC 1929's user and password when `user` is given): CONNECT
    to a name, IPv4 or IPv6 address; every name is 127.0.0.1. `seen`: "host:port" asked for."""

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        super().__init__()
        self.user, self.password = user, password

    async def __aenter__(self) -> Socks5Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            version, n = await reader.readexactly(2)
            methods = await reader.readexactly(n)
            want = 2 if self.user is not None else 0
            if version != 5 or want not in methods:
                writer.write(b"\x05\xff")
                return
            writer.write(bytes([5, want]))
            if want == 2:
                _, ulen = await reader.readexactly(2)
                user = (await reader.readexactly(ulen)).decode()
                (plen,) = await reader.readexactly(1)
                password = (await reader.readexactly(plen)).decode()
                ok = (user, password) == (self.user, self.password)
                writer.write(b"\x01\x00" if ok else b"\x01\x01")
                if not ok:
                    return
            _, cmd, _, atyp = await reader.readexactly(4)
            if atyp == 3:
                (length,) = await reader.readexactly(1)
                host = (await reader.readexactly(length)).decode()
            else:
                host = socket.inet_ntop(
                    socket.AF_INET if atyp == 1 else socket.AF_INET6, await reader.readexactly(4 if atyp == 1 else 16)
                )
            port = int.from_bytes(await reader.readexactly(2), "big")
            self.seen.append(f"{host}:{port}")
            try:
                upstream = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.write(b"\x05\x05\x00\x01\x00\x00\x00\x00\x00\x00")  # connection refused
                return
            writer.write(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")
            self._splice((reader, writer), upstream)
            writer = None  # type: ignore[assignment]  # the relay owns it now
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if writer is not None:
                writer.close()


# ---- a CA of its own ------------------------------------------------------------------------------


@dataclass
class CA:
    """A CA certificate (`cert`, PEM) and server certificates it signed (certificate and key): for
    localhost, origin.test and 127.0.0.1 (`server_pem`), and for elsewhere.test only (`other_pem`)."""

    cert: Path
    server_pem: Path
    other_pem: Path

    def server_context(self, other: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.other_pem if other else self.server_pem)
        return ctx


def make_ca(where: Path) -> CA:
    """With the openssl command (the tests skip without it)."""
    where.mkdir(parents=True, exist_ok=True)
    key, cert, skey, csr, scert = (where / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.crt"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", *ec, "-days", "2", "-subj", "/CN=ollie test CA", "-keyout", str(key), "-out", str(cert),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash")  # fmt: skip
    pems = []
    for name, names in (("server", "DNS:localhost,DNS:origin.test,IP:127.0.0.1"), ("other", "DNS:elsewhere.test")):
        run("req", *ec, "-subj", f"/CN={name}", "-keyout", str(skey), "-out", str(csr))
        ext = where / "ext.cnf"
        ext.write_text(
            f"subjectAltName={names}\n"
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        run("x509", "-req", "-in", str(csr), "-CA", str(cert), "-CAkey", str(key), "-CAcreateserial", "-days", "2",
            "-out", str(scert), "-extfile", str(ext))  # fmt: skip
        pem = where / f"{name}.pem"
        pem.write_bytes(scert.read_bytes() + skey.read_bytes())
        pems.append(pem)
    return CA(cert, *pems)


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


# ---- a mount namespace with /etc files of its own --------------------------------------------------


def namespaces_work() -> bool:
    """`unshare -rm` can make a user and mount namespace and bind-mount a file in it."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount --bind /etc/hostname /etc/hostname"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


STREAM_ONCE = """
import asyncio, json, sys, time
from ollie import backends
from ollie.types import GenerationParams, Message, TextDelta, TransientError

async def main():
    name, model, options = json.loads(sys.argv[1])
    be = backends.create(name, model, **options)
    t = time.monotonic()
    try:
        chunks = [c async for c in be.stream([Message("user", "hi")], [], GenerationParams())]
        out = {"text": "".join(c.text for c in chunks if isinstance(c, TextDelta))}
    except Exception as e:
        out = {"error": str(e), "type": type(e).__name__, "transient": isinstance(e, TransientError)}
    out["seconds"] = time.monotonic() - t
    import ssl
    out["cafile"] = ssl.get_default_verify_paths().cafile
    print(json.dumps(out))

asyncio.run(main())
"""


async def stream_in_namespace(
    backend: tuple[str, str, dict[str, Any]], mounts: dict[str, Path], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one stream of `backend` (name, model, options) in a fresh process, in a user and mount
    namespace where each of `mounts` (a path there: the file or directory shown at it) is bound;
    returns what came of it: {"text"} or {"error", "type", "transient"}, and "seconds"."""
    binds = " && ".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for dst, src in mounts.items())
    command = f'{binds} && exec {shlex.quote(sys.executable)} -c {shlex.quote(STREAM_ONCE)} "$0"'
    proc = await asyncio.create_subprocess_exec(
        "unshare", "-rm", "sh", "-c", command, json.dumps(backend),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ) if env is None else env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)
