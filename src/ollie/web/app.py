"""The web page's server: a starlette app on the file server's loop, served by uvicorn.

Every request passes `Guard` first:
  - its `Host` must be one this server answers to (the address it listens on, the loopback names,
    this machine's names, and `OLLIE_WEB_HOSTS`): a page of another site that rebinds its own name
    to our address (DNS rebinding) sends its own name, and is refused;
  - an `Origin`, when sent, must be this server's own, and a request that changes something must
    send one (browsers do): another site's page cannot post to us, nor read us (no CORS headers);
  - it must carry the token: in the URL the first time (`?token=`, the address `ollie web`
    prints), which sets a cookie (HttpOnly, SameSite=Strict) and redirects to the same address
    without it, so it stays in no history and no Referer; after that the cookie.
Every answer carries a strict Content-Security-Policy (scripts, styles and requests to this
origin only, no inline script or style, no frames), nosniff and no-referrer.

What changes a session is written to its files (`s/<id>/prompt`, `s/<id>/ctl`, `ctl`, `b/new`,
`rm` of `b/<id>` and `m/<name>`): the answers, and the refusals during a turn, are the files'.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as E
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from .. import config
from ..vfs.namespace import FsError, Namespace, OpenMode
from .feed import Feed, Messages, sse

if TYPE_CHECKING:
    from ..fs.jobs import Jobs
    from ..fs.sessions import Sessions

log = logging.getLogger("ollie.web")

STATIC = Path(__file__).resolve().parent / "static"
COOKIE = "ollie_web"
BODY_MAX = (1 << 20) + (64 << 10)  # a prompt's cap (1 MiB) and room for the JSON around it
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
SAFE_METHODS = ("GET", "HEAD")
MEMORY_RESULTS = 20

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, port: int) -> set[str]:
    """The `Host` values a request may carry: `name:port` for each name this server answers to."""
    names = {"localhost", "127.0.0.1", "[::1]"}
    if not is_loopback(host):
        names |= {socket.gethostname(), socket.getfqdn()}
        if host not in ("0.0.0.0", "::", ""):
            names.add(f"[{host}]" if ":" in host else host)
    names |= {n.strip() for n in os.environ.get("OLLIE_WEB_HOSTS", "").split(",") if n.strip()}
    return {f"{n.lower()}:{port}" for n in names} | ({n.lower() for n in names} if port == 80 else set())


def cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"ollie web cookie", hashlib.sha256).hexdigest()


class Guard:
    """The checks every request passes (module docstring), and the headers every answer gets."""

    def __init__(self, app: ASGIApp, token: str, hosts: set[str], port: int = 0):
        self.app = app
        self.token = token
        self.cookie = cookie_value(token)
        self.hosts = hosts
        # A browser keeps one cookie jar per host, whatever the port: two servers on one machine
        # must not take each other's cookie.
        self.cookie_name = f"{COOKIE}_{port}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return  # no lifespan
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        websocket = scope["type"] == "websocket"

        async def send_headed(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        # A WebSocket is refused by a close before its handshake is accepted: the browser sees 403.
        refuse = _refuse_websocket if websocket else _refuse_http

        host = headers.get("host", "").lower()
        if host not in self.hosts:
            return await refuse(send_headed, 403, f"refused: this server does not answer to Host {host!r}")
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in (f"http://{host}", f"https://{host}"):  # https: a TLS proxy
            return await refuse(send_headed, 403, f"refused: a request from another origin ({origin})")
        if (websocket or scope["method"] not in SAFE_METHODS) and origin is None:
            return await refuse(send_headed, 403, "refused: a request that changes something must say its Origin")
        if headers.get("sec-fetch-site") == "cross-site" and headers.get("sec-fetch-mode") != "navigate":
            return await refuse(send_headed, 403, "refused: a request from another site")
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given and not websocket:
            if not hmac.compare_digest(given[0].encode(), self.token.encode()) or scope["method"] not in SAFE_METHODS:
                return await refuse(send_headed, 401, "refused: wrong token")
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = "/" + scope["path"].lstrip("/") + (f"?{rest}" if rest else "")  # never //elsewhere
            cookie = f"{self.cookie_name}={self.cookie}; Path=/; HttpOnly; SameSite=Strict"
            await send_headed(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
                }
            )
            return await send_headed({"type": "http.response.body", "body": b""})
        if not hmac.compare_digest(_cookie(headers.get("cookie", ""), self.cookie_name).encode(), self.cookie.encode()):
            return await refuse(
                send_headed, 401, "refused: no token. Open the address `ollie web` prints (it carries the token) once."
            )
        await self.app(scope, receive, send_headed)


def _cookie(header: str, wanted: str) -> str:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == wanted:
            return value
    return ""


async def _refuse_websocket(send: Send, status: int, text: str) -> None:
    await send({"type": "websocket.close", "code": 1008, "reason": text[:120]})


async def _refuse_http(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ---- the namespace, as a script uses it ------------------------------------------------------------
async def write_file(ns: Namespace, path: str, text: str, read_back: bool = False) -> str:
    """Write `text` to `path` as `echo text > path` does (one open, one write, the close), reading
    the same open file back first when asked (a new session's id, new jobs' ids)."""
    handle = await ns.open(path, OpenMode.WRITE | (OpenMode.READ if read_back else OpenMode(0)))
    try:
        await handle.write(0, text.encode())
        answer = (await handle.read(0, 1 << 16)).decode(errors="replace") if read_back else ""
        await handle.flush()
        return answer
    finally:
        await handle.release()


async def read_file(ns: Namespace, path: str, limit: int = 4 << 20) -> str:
    handle = await ns.open(path, OpenMode.READ)
    try:
        out = bytearray()
        while len(out) < limit and (data := await handle.read(len(out), min(1 << 16, limit - len(out)))):
            out += data
        return out.decode(errors="replace")
    finally:
        await handle.release()


def _failed(e: FsError) -> JSONResponse:
    status = {E.EBUSY: 409, E.ENOENT: 404, E.EACCES: 403, E.EEXIST: 409}.get(e.errno, 400)
    return JSONResponse({"error": e.message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > BODY_MAX:
            raise FsError(E.EFBIG, "too large")
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise FsError(E.EINVAL, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise FsError(E.EINVAL, "the body is not a JSON object")
    return body


def _name(value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\0" in value or len(value) > 255:
        raise FsError(E.EINVAL, f"{value!r}: not a name")
    return value


def _field(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise FsError(E.EINVAL, f"{key}: give a string")
    return value


def build(  # noqa: C901 (one small handler a route)
    ns: Namespace, sessions: Sessions, jobs: Jobs, token: str, hosts: set[str], port: int = 0
) -> tuple[ASGIApp, Feed]:
    feed = Feed(sessions, jobs)

    def stream(messages: Messages) -> StreamingResponse:
        async def events() -> Any:
            async for m in messages:
                yield sse(m)

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"x-accel-buffering": "no", "cache-control": "no-store"}
        )

    async def pump(websocket: WebSocket, messages: Messages) -> None:
        """Send the stream's messages until either side ends; a page sends nothing but its close."""
        await websocket.accept()

        async def send_all() -> None:
            async for m in messages:
                event, data, eid = m if m is not None else ("keepalive", None, None)
                await websocket.send_text(json.dumps({"event": event, "data": data, "id": eid}, ensure_ascii=False))
            await websocket.close()

        async def until_closed() -> None:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass

        tasks = [asyncio.ensure_future(send_all()), asyncio.ensure_future(until_closed())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await messages.aclose()  # type: ignore[attr-defined]

    async def ws_sessions(websocket: WebSocket) -> None:
        await pump(websocket, feed.table())

    async def ws_jobs(websocket: WebSocket) -> None:
        await pump(websocket, feed.job_table())

    async def ws_page(websocket: WebSocket) -> None:
        key = websocket.path_params["sid"]
        raw = websocket.query_params.get("from") or "0"
        try:
            _name(key)
        except FsError:
            await websocket.close(1008)
            return
        await pump(websocket, feed.page(key, int(raw) if raw.isdigit() else 0))

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except FsError as e:
                return _failed(e)

        return run

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        path = STATIC / name
        if name not in ("app.js", "app.css") or not path.is_file():
            return Response("no such file\n", status_code=404, media_type="text/plain")
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return FileResponse(path, media_type=f"{kind}; charset=utf-8")

    async def events_sessions(request: Request) -> Response:
        return stream(feed.table())

    async def events_jobs(request: Request) -> Response:
        return stream(feed.job_table())

    async def events_page(request: Request) -> Response:
        key = _name(request.path_params["sid"])
        raw = request.headers.get("last-event-id") or request.query_params.get("from") or "0"
        offset = int(raw) if raw.isdigit() else 0
        return stream(feed.page(key, offset))

    async def meta(request: Request) -> Response:
        agents = sorted(st.name[:-5] for st in await ns.list("/a") if st.name.endswith(".json"))
        backends = (await read_file(ns, "/backends")).split("\n")
        job_template = await read_file(ns, "/b/new")  # the page fills in what the file offers
        found = {"agents": agents, "backends": [b for b in backends if b], "cwd": sessions.default_cwd}
        return JSONResponse({**found, "jobTemplate": job_template})

    async def new_session(request: Request) -> Response:
        body = await _body(request)
        words = ["new"]
        for key in ("agent", "cwd", "backend", "model", "name"):
            if value := _field(body, key).strip():
                if any(c.isspace() for c in value) or '"' in value or "'" in value:
                    raise FsError(E.EINVAL, f"{key}: no spaces or quotes here")
                words.append(f"{key}={value}")
        sid = (await write_file(ns, "/ctl", " ".join(words) + "\n", read_back=True)).strip()
        return JSONResponse({"id": sid})

    async def prompt(request: Request) -> Response:
        sid = _name(request.path_params["sid"])
        text = _field(await _body(request), "text")
        if not text.strip():
            raise FsError(E.EINVAL, "an empty prompt")
        await write_file(ns, f"/s/{sid}/prompt", text)
        return JSONResponse({"ok": True})

    async def ctl(request: Request) -> Response:
        sid = _name(request.path_params["sid"])
        line = _field(await _body(request), "line").strip()
        if not line or "\n" in line:
            raise FsError(E.EINVAL, "one command, one line")
        answer = await write_file(ns, f"/s/{sid}/ctl", line + "\n")
        return JSONResponse({"ok": True, "answer": answer})

    async def commands(request: Request) -> Response:
        sid = _name(request.path_params["sid"])
        return JSONResponse({"text": await read_file(ns, f"/s/{sid}/ctl")})

    async def session_file(request: Request) -> Response:
        sid, name = _name(request.path_params["sid"]), request.path_params["name"]
        if name not in ("mcp", "models", "systemprompt", "env", "usage", "cost", "cfg"):
            raise FsError(E.ENOENT, f"{name}: not shown here")
        return JSONResponse({"text": await read_file(ns, f"/s/{sid}/{name}")})

    async def new_jobs(request: Request) -> Response:
        spec = _field(await _body(request), "spec")
        answer = await write_file(ns, "/b/new", spec, read_back=True)
        if answer.startswith("error: "):
            raise FsError(E.EINVAL, answer[len("error: ") :].strip())
        return JSONResponse({"ids": answer.split()})

    async def job(request: Request) -> Response:
        found = jobs.find(_name(request.path_params["jid"]))
        if found is None:
            raise FsError(E.ENOENT, "no such job")
        return JSONResponse(feed.job_info(found))

    async def remove_job(request: Request) -> Response:
        await ns.remove(f"/b/{_name(request.path_params['jid'])}")
        return JSONResponse({"ok": True})

    async def memory_list(request: Request) -> Response:
        query = request.query_params.get("q", "")
        return JSONResponse({"results": await recall(query)})

    async def memory_read(request: Request) -> Response:
        name = _name(request.path_params["name"])
        return JSONResponse({"text": await read_file(ns, f"/m/{name}")})

    async def memory_remove(request: Request) -> Response:
        await ns.remove(f"/m/{_name(request.path_params['name'])}")
        return JSONResponse({"ok": True})

    async def tools(request: Request) -> Response:
        agents = {}
        for st in await ns.list("/a"):
            if st.name.endswith(".json"):
                agents[st.name[:-5]] = await read_file(ns, f"/a/{st.name}", 1 << 20)
        return JSONResponse(
            {"tools": await read_file(ns, "/t/idx"), "skills": await read_file(ns, "/sk/idx"), "agents": agents}
        )

    routes = [
        Route("/", index),
        Route("/static/{name}", static),
        Route("/events/sessions", events_sessions),
        Route("/events/jobs", events_jobs),
        Route("/events/page/{sid}", guarded(events_page)),
        WebSocketRoute("/ws/sessions", ws_sessions),
        WebSocketRoute("/ws/jobs", ws_jobs),
        WebSocketRoute("/ws/page/{sid}", ws_page),
        Route("/api/meta", guarded(meta)),
        Route("/api/tools", guarded(tools)),
        Route("/api/s/new", guarded(new_session), methods=["POST"]),
        Route("/api/s/{sid}/prompt", guarded(prompt), methods=["POST"]),
        Route("/api/s/{sid}/ctl", guarded(ctl), methods=["POST"]),
        Route("/api/s/{sid}/commands", guarded(commands)),
        Route("/api/s/{sid}/file/{name}", guarded(session_file)),
        Route("/api/b/new", guarded(new_jobs), methods=["POST"]),
        Route("/api/b/{jid}", guarded(job)),
        Route("/api/b/{jid}/rm", guarded(remove_job), methods=["POST"]),
        Route("/api/m", guarded(memory_list)),
        Route("/api/m/{name}", guarded(memory_read)),
        Route("/api/m/{name}/rm", guarded(memory_remove), methods=["POST"]),
    ]
    return Guard(Starlette(routes=routes), token, hosts, port), feed


async def recall(query: str) -> list[dict[str, str]]:
    """The memories that best match `query`, ranked as the `memory_recall` tool ranks them (it is
    that tool, run on the memory directory): [{id, text}]."""
    script = Path(__file__).resolve().parent.parent / "defaults" / "tools" / "memory_recall"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OLLIE_MEMORY_DIR": str(config.data_path() / "memory")}
    (config.data_path() / "memory").mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(script),
        query,
        str(MEMORY_RESULTS),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode:
        raise FsError(E.EIO, err.decode(errors="replace").strip() or "memory_recall failed")
    results = []
    for part in re.split(r"^## ", out.decode(errors="replace"), flags=re.M)[1:]:
        first, _, rest = part.partition("\n")
        results.append({"id": first.strip(), "text": rest.strip()})
    return results


class Web:
    """The web page's listener on the server's loop."""

    def __init__(self, ns: Namespace, sessions: Sessions, jobs: Jobs, host: str, port: int, token: str = ""):
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, reuse_port=False
        )
        self.port = self.sock.getsockname()[1]
        self.app, self.feed = build(ns, sessions, jobs, self.token, allowed_hosts(host, self.port), self.port)
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/?token={self.token}"

    async def start(self) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            def capture_signals(self) -> Any:  # the file server handles them

                return contextlib.nullcontext()

        cfg = uvicorn.Config(
            self.app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            ws="wsproto",
            ws_max_size=1 << 16,  # a page sends nothing but its close
            timeout_graceful_shutdown=1,
            server_header=False,
        )
        self._server = Server(cfg)
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()

    async def stop(self) -> None:
        self.feed.close()  # every stream ends
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except Exception:
                self._server.force_exit = True
                self._task.cancel()
        self.sock.close()
