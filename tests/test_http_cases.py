"""What real endpoints do, against every HTTP backend (OpenAI-compatible, Anthropic, Ollama) on the
one client they share: redirects, compressed bodies, an HTML page or a JSON error where a stream
was asked for, a dropped stream, a slow first byte, refused connections and unknown hosts, an IPv6
address that never answers beside an IPv4 one that does, a TLS server with a CA of its own (and a
Python whose OpenSSL finds no CA bundle), http, https and SOCKS proxies. Each case either works or
fails at once, in the same words whichever backend met it (issue 29).

Everything runs on loopback: the servers and proxies are real sockets in the test's event loop,
and what needs its own /etc files (a name with two addresses, a name no resolver knows, a Python
without CA bundle) runs in a process of its own in a user and mount namespace (http_helpers).
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
import zlib
from dataclasses import dataclass
from typing import Any

import pytest

from http_helpers import (
    HttpProxy,
    Origin,
    Seen,
    Socks5Proxy,
    answer_with,
    chunk,
    chunked_head,
    have_openssl,
    make_ca,
    namespaces_work,
    raw,
    stream_in_namespace,
)
from ollie import backends
from ollie.types import BackendError, GenerationParams, Message, TextDelta, TransientError
from wire import anthropic as anthropic_wire
from wire import ndjson, sse
from wire import ollama as ollama_wire
from wire import openai as openai_wire

# ---- the three wires ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    name: str
    path: str  # the streaming endpoint under the server's root
    content_type: str
    pieces: tuple[bytes, ...]  # a whole streamed answer whose text is "hello"
    key_header: str  # "" if the backend sends no key
    asked: str  # how a message names the stream asked for

    def options(self, root: str, **kw: Any) -> dict[str, Any]:
        if self.name == "openai":
            return {"base_url": root + "/v1", "api_key": "sk-test", **kw}
        if self.name == "anthropic":
            return {"base_url": root, "api_key": "sk-test", **kw}
        return {"base_url": root, "num_ctx": 4096, **kw}  # num_ctx: no /api/show first

    def backend(self, root: str, **kw: Any) -> Any:
        return backends.create(self.name, "m", **self.options(root, **kw))

    def spec(self, root: str, **kw: Any) -> tuple[str, str, dict[str, Any]]:
        return self.name, "m", self.options(root, **kw)


OPENAI = Wire(
    "openai",
    "/v1/chat/completions",
    "text/event-stream",
    tuple(
        sse(
            [
                (None, openai_wire.chunk({"role": "assistant", "content": "hel"})),
                (None, openai_wire.chunk({"content": "lo"})),
                (None, openai_wire.chunk({}, "stop")),
                (None, openai_wire.chunk(usage=openai_wire.usage())),
                (None, "[DONE]"),
            ]
        )
    ),
    "authorization",
    "server-sent events",
)
ANTHROPIC = Wire(
    "anthropic",
    "/v1/messages",
    "text/event-stream",
    tuple(sse(anthropic_wire.message_events([{"type": "text", "text": "hello"}]))),
    "x-api-key",
    "server-sent events",
)
OLLAMA = Wire(
    "ollama",
    "/api/chat",
    "application/x-ndjson",
    tuple(ndjson([ollama_wire.chat_line(content="hel"), ollama_wire.chat_line(content="lo"), ollama_wire.done_line()])),
    "",
    "JSON lines",
)


@pytest.fixture(params=[OPENAI, ANTHROPIC, OLLAMA], ids=lambda w: w.name)
def wire(request, monkeypatch) -> Wire:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    return request.param


@pytest.fixture(scope="session")
def ca(tmp_path_factory):
    if not have_openssl():
        pytest.skip("no openssl command")
    return make_ca(tmp_path_factory.mktemp("ca"))


needs_namespaces = pytest.mark.skipif(not namespaces_work(), reason="no user and mount namespaces (unshare -rm)")


async def collect(backend: Any) -> list[Any]:
    try:
        return [c async for c in backend.stream([Message("user", "hi")], [], GenerationParams())]
    finally:
        await backend.aclose()


def text(chunks: list[Any]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


async def fails_at_once(backend: Any) -> BackendError:
    """The stream's error, which must not be one the Core retries, and must come at once."""
    t = time.monotonic()
    with pytest.raises(BackendError) as e:
        await collect(backend)
    assert not isinstance(e.value, TransientError), e.value
    assert time.monotonic() - t < 2.0
    return e.value


def stream(wire: Wire, *, encoding: str = "", content_type: str | None = None, pieces: Any = None) -> Any:
    """A handler that streams wire's answer, chunk by chunk (each compressed and flushed on its
    own with `encoding`, as a server that compresses a stream does)."""

    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        headers = {"content-type": content_type if content_type is not None else wire.content_type}
        compress = None
        if encoding:
            headers["content-encoding"] = "gzip" if encoding == "gzip" else "deflate"
            wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding]
            compress = zlib.compressobj(wbits=wbits)
        writer.write(chunked_head(headers))
        for piece in pieces if pieces is not None else wire.pieces:
            if compress is not None:
                piece = compress.compress(piece) + compress.flush(zlib.Z_SYNC_FLUSH)
            writer.write(chunk(piece))
            await writer.drain()
        if compress is not None:
            writer.write(chunk(compress.flush()))
        writer.write(b"0\r\n\r\n")
        return True

    return handler


def redirect(status: int, location: str) -> Any:
    return answer_with(raw(status, b"moved", {"location": location, "content-type": "text/plain"}))


async def test_one_connection_serves_request_after_request(wire):
    """A stream read to its end gives its connection back: the next request goes out on it."""
    async with Origin({wire.path: stream(wire)}) as origin:
        for _ in range(3):
            assert text(await collect(wire.backend(origin.url()))) == "hello"
        assert origin.connections == 1 and len(origin.seen) == 3


# ---- redirects ------------------------------------------------------------------------------------


async def test_307_and_308_keep_the_method_the_body_and_the_key(wire):
    async with Origin({}) as origin:
        origin.routes.update(
            {
                wire.path: redirect(307, "/moved"),
                "/moved": redirect(308, f"{origin.url()}/final"),
                "/final": stream(wire),
            }
        )
        chunks = await collect(wire.backend(origin.url()))
        assert text(chunks) == "hello"
        assert [s.method for s in origin.seen] == ["POST"] * 3
        assert len({s.body for s in origin.seen}) == 1 and origin.seen[0].body
        if wire.key_header:
            assert all("sk-test" in s.headers[wire.key_header] for s in origin.seen)


async def test_a_redirect_to_another_host_carries_no_credentials(wire):
    async with Origin({}) as other, Origin({}) as origin:
        other.routes["/api"] = stream(wire)
        origin.routes[wire.path] = redirect(308, f"http://localhost:{other.port}/api")
        assert text(await collect(wire.backend(origin.url()))) == "hello"
        [there] = other.seen
        assert there.method == "POST" and there.body == origin.seen[0].body
        assert not {"authorization", "x-api-key"} & set(there.headers)


async def test_a_post_moved_for_good_fails_at_once_naming_the_new_address(wire):
    async with Origin({}) as origin:
        origin.routes[wire.path] = redirect(301, "https://api.example/v2/stream")
        error = await fails_at_once(wire.backend(origin.url()))
        assert str(error) == (
            f"{wire.name}: {origin.url()}{wire.path} redirected the POST to https://api.example/v2/stream with "
            "HTTP 301, which would make it a GET; check the URL: the server points to https://api.example/v2/stream"
        )


async def test_a_redirect_loop_ends(wire):
    async with Origin({}) as origin:
        origin.routes[wire.path] = redirect(307, wire.path)
        error = await fails_at_once(wire.backend(origin.url()))
        assert f"{origin.url()}{wire.path}: more than 5 redirects" in str(error)
        assert len(origin.seen) == 6


# ---- compressed bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_a_compressed_stream_is_decoded_as_it_comes(wire, encoding):
    async with Origin({wire.path: stream(wire, encoding=encoding)}) as origin:
        assert text(await collect(wire.backend(origin.url()))) == "hello"
        assert "gzip" in origin.seen[0].headers["accept-encoding"]


async def test_an_encoding_ollie_cannot_decode_fails_at_once_naming_it(wire):
    async def handler(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            raw(200, b"\x1f\x9d\x90garbage", {"content-type": wire.content_type, "content-encoding": "compress"})
        )
        return True

    async with Origin({wire.path: handler}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert f"{origin.url()}{wire.path} answered in the 'compress' content encoding" in str(error)


# ---- an answer that is not the stream asked for -----------------------------------------------------

LOGIN_PAGE = b"<!DOCTYPE html>\n<html><head><title>Sign in &middot; Example SSO</title></head><body>...</body></html>"


async def test_an_html_page_fails_at_once_naming_the_url_and_its_title(wire):
    page = raw(200, LOGIN_PAGE, {"content-type": "text/html; charset=utf-8"})
    async with Origin({wire.path: answer_with(page)}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert str(error) == (
            f"{wire.name}: {origin.url()}{wire.path} answered with an HTML page ('Sign in · Example SSO'), "
            f"not a stream of {wire.asked}; check the URL: it does not lead to the API"
        )


async def test_an_html_page_after_a_redirect_names_both_urls(wire):
    async with Origin({}) as origin:
        origin.routes[wire.path] = redirect(307, "/login")
        origin.routes["/login"] = answer_with(raw(200, LOGIN_PAGE, {"content-type": "text/html"}))
        error = await fails_at_once(wire.backend(origin.url()))
        assert f"{origin.url()}/login (redirected from {origin.url()}{wire.path}) answered with an HTML page" in str(
            error
        )


async def test_an_html_error_page_says_what_it_is_and_where(wire):
    page = raw(404, b"<html><title>404 Not Found</title></html>", {"content-type": "text/html"})
    async with Origin({wire.path: answer_with(page)}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert str(error) == (
            f"{wire.name} (HTTP 404): Error code: 404: an HTML page ('404 Not Found') from {origin.url()}{wire.path}"
        )


JSON_ERRORS = {
    "openai": {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": None}},
    "anthropic": {"type": "error", "error": {"type": "authentication_error", "message": "Incorrect API key provided"}},
    "ollama": {"error": "Incorrect API key provided"},
}


async def test_a_json_error_with_a_200_is_reported_as_the_error_it_is(wire):
    body = raw(200, str.encode(__import__("json").dumps(JSON_ERRORS[wire.name])), {"content-type": "application/json"})
    async with Origin({wire.path: answer_with(body)}) as origin:
        if wire.name == "ollama":  # Ollama reports its errors as a line of its stream: as when it fails mid-answer
            with pytest.raises(TransientError, match="ollama: Incorrect API key provided"):
                await collect(wire.backend(origin.url()))
            return
        error = await fails_at_once(wire.backend(origin.url()))
        assert str(error) == (
            f"{wire.name}: {origin.url()}{wire.path} answered with an error instead of a stream: "
            "Incorrect API key provided"
        )


async def test_json_that_is_no_stream_fails_at_once_quoting_it(wire):
    if wire.name == "ollama":
        pytest.skip("Ollama's stream is JSON: one object is a stream of one line")
    body = raw(200, b'{"id": "x", "object": "chat.completion"}', {"content-type": "application/json"})
    async with Origin({wire.path: answer_with(body)}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert (
            f"{origin.url()}{wire.path} answered with JSON, not a stream of server-sent events: "
            '\'{"id": "x", "object": "chat.completion"}\'' in str(error)
        )


async def test_a_stream_under_another_content_type_is_taken_for_what_it_is(wire):
    async with Origin({wire.path: stream(wire, content_type="text/plain")}) as origin:
        assert text(await collect(wire.backend(origin.url()))) == "hello"


async def test_plain_text_fails_at_once_quoting_it(wire):
    body = raw(200, b"Welcome to nginx!\n\nIf you see this page...", {"content-type": "text/plain"})
    async with Origin({wire.path: answer_with(body)}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert str(error) == (
            f"{wire.name}: {origin.url()}{wire.path} answered with text/plain, not a stream of {wire.asked}: "
            "'Welcome to nginx! If you see this page...'; check the URL"
        )


async def test_an_empty_answer_fails_at_once(wire):
    async with Origin({wire.path: answer_with(raw(200))}) as origin:
        error = await fails_at_once(wire.backend(origin.url()))
        assert f"{origin.url()}{wire.path} answered with an empty body, not a stream of {wire.asked}" in str(error)


# ---- a dropped stream, a slow one -------------------------------------------------------------------


async def test_a_dropped_stream_is_transient_and_keeps_what_came(wire):
    async def drop(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(chunked_head({"content-type": wire.content_type}))
        for piece in wire.pieces[:-2]:
            writer.write(chunk(piece))
        await writer.drain()
        return False  # gone, mid-answer

    async with Origin({wire.path: drop}) as origin:
        got: list[Any] = []
        with pytest.raises(TransientError) as e:
            async for c in wire.backend(origin.url()).stream([Message("user", "hi")], [], GenerationParams()):
                got.append(c)
        assert str(e.value) == (f"{wire.name}: {origin.url()}{wire.path} closed the connection before the answer ended")
        assert text(got).startswith("hel")


async def test_a_slow_first_byte_is_waited_for(wire):
    async def slow(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(1.0)  # a model thinking before its first token
        return await stream(wire)(origin, seen, writer)

    async with Origin({wire.path: slow}) as origin:
        assert text(await collect(wire.backend(origin.url()))) == "hello"


async def test_silence_past_the_read_timeout_is_transient(wire):
    async def silent(origin: Origin, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(10)
        return False

    async with Origin({wire.path: silent}) as origin:
        t = time.monotonic()
        with pytest.raises(TransientError) as e:
            await collect(wire.backend(origin.url(), timeout=0.3))
        assert str(e.value) == f"{wire.name}: {origin.url()}{wire.path} sent no answer within 0.3 s"
        assert time.monotonic() - t < 2


# ---- no connection: at once, one wording ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_refused_connection_fails_at_once_in_one_wording(wire):
    port = free_port()
    error = await fails_at_once(wire.backend(f"http://127.0.0.1:{port}"))
    assert str(error) == (
        f"{wire.name}: cannot reach http://127.0.0.1:{port}{wire.path}: connection refused; "
        "check that the server is running and listens on that port"
    )


async def test_the_core_does_not_retry_a_refused_connection(wire):
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.config import AgentConfig
    from ollie.tools import dispatcher_factory

    nd = dispatcher_factory({})
    backend = wire.backend(f"http://127.0.0.1:{free_port()}")
    core = Core(CoreConfig(backend, await build_agent_env(AgentConfig(), nd(), os.getcwd()), nd))
    events: list[Any] = []
    core.subscribe(events.append)
    t = time.monotonic()
    with pytest.raises(BackendError, match="connection refused"):
        await core.submit("hi")
    assert time.monotonic() - t < 2
    kinds = [e.kind for e in events]
    assert "retry" not in kinds and "error" in kinds
    assert "connection refused" in next(e.text for e in events if e.kind == "error")
    await core.close()


HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"


@needs_namespaces
async def test_an_unknown_host_fails_at_once_in_one_wording(wire, tmp_path):
    (tmp_path / "hosts").write_text(HOSTS)
    (tmp_path / "nsswitch.conf").write_text("hosts: files\n")  # no DNS server is asked
    mounts = {"/etc/hosts": tmp_path / "hosts", "/etc/nsswitch.conf": tmp_path / "nsswitch.conf"}
    out = await stream_in_namespace(wire.spec("http://no-such-host.test:8080"), mounts)
    assert out["type"] == "BackendError" and not out["transient"] and out["seconds"] < 2
    assert out["error"].startswith(
        f"{wire.name}: cannot reach http://no-such-host.test:8080{wire.path}: there is no host no-such-host.test ("
    )
    assert out["error"].endswith("; check the host name")


@needs_namespaces
async def test_an_ipv6_address_that_never_answers_does_not_hold_up_the_ipv4_one(wire, tmp_path):
    """dual.test is ::1 and 127.0.0.1; on ::1 the port's listener has a full backlog, so a SYN there
    is never answered (as with a dead IPv6 route). The IPv4 address, tried 0.25 s later, answers."""
    async with Origin({wire.path: stream(wire)}) as origin:
        v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        filler = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            v6.bind(("::1", origin.port))
            v6.listen(0)
            filler.connect(("::1", origin.port))  # fills the backlog: the next SYN goes unanswered
            (tmp_path / "hosts").write_text("::1 dual.test\n127.0.0.1 dual.test\n" + HOSTS)
            (tmp_path / "nsswitch.conf").write_text("hosts: files\n")
            mounts = {"/etc/hosts": tmp_path / "hosts", "/etc/nsswitch.conf": tmp_path / "nsswitch.conf"}
            out = await stream_in_namespace(wire.spec(f"http://dual.test:{origin.port}"), mounts)
        finally:
            filler.close()
            v6.close()
    assert out.get("text") == "hello", out
    assert out["seconds"] < 2  # not the 5 s connect timeout


# ---- TLS ------------------------------------------------------------------------------------------


async def test_a_server_with_a_ca_of_its_own_is_refused_then_trusted_with_ssl_cert_file(wire, ca, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    async with Origin({wire.path: stream(wire)}, ssl_context=ca.server_context()) as origin:
        error = await fails_at_once(wire.backend(origin.url("localhost")))
        assert str(error).startswith(
            f"{wire.name}: cannot reach https://localhost:{origin.port}{wire.path}: its TLS certificate is not "
            "trusted (unable to get local issuer certificate; trusted: "
        )
        assert str(error).endswith(
            "; if the server's certificate comes from a CA of its own, set SSL_CERT_FILE to that CA's certificate"
        )
        monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
        assert text(await collect(wire.backend(origin.url("localhost")))) == "hello"


async def test_a_certificate_for_another_name_is_named(wire, ca, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
    async with Origin({wire.path: stream(wire)}, ssl_context=ca.server_context(other=True)) as origin:
        error = await fails_at_once(wire.backend(origin.url("localhost")))
        assert str(error).startswith(
            f"{wire.name}: cannot reach https://localhost:{origin.port}{wire.path}: its TLS certificate is for "
            "another host (Hostname mismatch, certificate is not valid for 'localhost'.); check the host name"
        )


async def test_https_to_a_plain_http_server_names_the_scheme(wire):
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)  # a TLS hello: a plain http server answers it with a 400, as nginx does
        writer.write(raw(400, b"Bad Request", {"connection": "close"}))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(plain, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        error = await fails_at_once(wire.backend(f"https://127.0.0.1:{port}"))
    finally:
        server.close()
    assert str(error) == (
        f"{wire.name}: cannot reach https://127.0.0.1:{port}{wire.path}: TLS failed (WRONG_VERSION_NUMBER); "
        "the server may speak plain http there: check the URL's scheme"
    )


async def test_ssl_cert_file_that_is_no_file_is_named(wire, monkeypatch, tmp_path):
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "nope.pem"))
    error = await fails_at_once(wire.backend("https://localhost:9"))
    assert f"SSL_CERT_FILE is {tmp_path / 'nope.pem'}, which is no file" in str(error)


@needs_namespaces
async def test_a_python_whose_openssl_finds_no_ca_bundle_uses_the_systems(wire, ca, tmp_path):
    """As some uv-managed Pythons on RHEL and NixOS: OpenSSL's own directory holds no CA bundle.
    The bundle where the distribution keeps it (here our CA, at Debian's place) is used instead."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR", "NIX_SSL_CERT_FILE")}
    openssl_dir = os.path.dirname(__import__("ssl").get_default_verify_paths().openssl_cafile)
    if not os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        pytest.skip("no /etc/ssl/certs/ca-certificates.crt to stand in for")
    async with Origin({wire.path: stream(wire)}, ssl_context=ca.server_context()) as origin:
        mounts = {openssl_dir: empty, "/etc/ssl/certs/ca-certificates.crt": ca.cert}
        out = await stream_in_namespace(wire.spec(origin.url("localhost")), mounts, env)
    if out["cafile"] is not None:
        pytest.skip(f"this Python's OpenSSL still finds {out['cafile']}")
    assert out.get("text") == "hello", out


# ---- proxies --------------------------------------------------------------------------------------

PROXIES = [
    "http-proxy-to-http",
    "http-proxy-tunnel-to-https",
    "https-proxy-tunnel-to-https",
    "socks5h",
    "socks5h-auth-https",
]


@pytest.mark.parametrize("kind", PROXIES)
async def test_through_a_proxy(wire, ca, kind, monkeypatch):
    """origin.test is known to the proxy only; the client never looks it up."""
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
    https = kind.endswith("https")
    tls = ca.server_context() if https else None
    async with Origin({wire.path: stream(wire)}, ssl_context=tls) as origin:
        if kind.startswith("socks"):
            proxy: Any = Socks5Proxy(*(("me", "p@ss") if "auth" in kind else ()))
        else:
            proxy = HttpProxy(ssl_context=ca.server_context() if kind.startswith("https") else None)
        async with proxy:
            if kind.startswith("socks"):
                creds = "me:p%40ss@" if "auth" in kind else ""
                monkeypatch.setenv("ALL_PROXY", f"socks5h://{creds}127.0.0.1:{proxy.port}")
            else:
                monkeypatch.setenv("HTTPS_PROXY" if https else "HTTP_PROXY", proxy.url)
            root = f"{'https' if https else 'http'}://origin.test:{origin.port}"
            for _ in range(2):
                assert text(await collect(wire.backend(root))) == "hello"
            if kind.startswith("socks"):
                assert proxy.seen[0] == f"origin.test:{origin.port}"
            elif https:
                assert proxy.seen[0] == f"CONNECT origin.test:{origin.port}"
            else:
                assert proxy.seen[0] == f"POST http://origin.test:{origin.port}{wire.path}"
            assert origin.seen[0].path == wire.path and origin.seen[0].method == "POST"


async def test_a_local_server_is_never_asked_for_through_a_proxy(wire, monkeypatch):
    async with Origin({wire.path: stream(wire)}) as origin, HttpProxy() as proxy:
        monkeypatch.setenv("ALL_PROXY", proxy.url)
        monkeypatch.setenv("HTTP_PROXY", "socks5h://127.0.0.1:9")
        assert text(await collect(wire.backend(origin.url()))) == "hello"
        assert text(await collect(wire.backend(origin.url("localhost")))) == "hello"
        assert proxy.seen == []


async def test_a_proxy_that_cannot_be_reached_fails_at_once_naming_it(wire, monkeypatch):
    port = free_port()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    error = await fails_at_once(wire.backend("https://origin.test"))
    assert str(error) == (
        f"{wire.name}: cannot reach https://origin.test{wire.path}: cannot reach the proxy http://127.0.0.1:{port} "
        "(HTTPS_PROXY): connection refused; check HTTPS_PROXY, or list origin.test in NO_PROXY"
    )


async def test_a_proxy_that_refuses_fails_at_once_saying_so(wire, monkeypatch):
    async with HttpProxy(need_auth=base64.b64encode(b"u:right").decode()) as http_proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://u:wrong@127.0.0.1:{http_proxy.port}")
        error = await fails_at_once(wire.backend("https://origin.test"))
        assert str(error) == (
            f"{wire.name}: cannot reach https://origin.test{wire.path} through the proxy "
            f"http://127.0.0.1:{http_proxy.port} (HTTPS_PROXY): the proxy refused a tunnel to origin.test:443: "
            "HTTP 407 Proxy Authentication Required; check HTTPS_PROXY, or list origin.test in NO_PROXY"
        )
    async with Socks5Proxy("me", "right") as socks:
        monkeypatch.setenv("HTTPS_PROXY", f"socks5h://me:wrong@127.0.0.1:{socks.port}")
        error = await fails_at_once(wire.backend("https://origin.test"))
        assert f"through the proxy socks5h://127.0.0.1:{socks.port} (HTTPS_PROXY): " in str(error)
        assert "authentication failure" in str(error)


async def test_a_proxy_of_a_scheme_ollie_does_not_speak_is_named(wire, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "ftp://user:secret@proxy.example:21")
    error = await fails_at_once(wire.backend("https://origin.test"))
    assert "the proxy ftp://user:***@proxy.example:21 (HTTPS_PROXY) is not one ollie can use" in str(error)
    assert "secret" not in str(error)


async def test_a_url_that_is_no_http_url_is_named_in_one_wording(wire):
    from ollie.types import ConfigError

    with pytest.raises(ConfigError, match=rf"^{wire.name}: URL 'ftp://x[^']*': not an http\(s\) URL"):
        async for _ in wire.backend("ftp://x").stream([Message("user", "hi")], [], GenerationParams()):
            pass
