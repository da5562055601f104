"""The MCP client: one connection to an MCP server, and `new_server` to offer its tools as a tool `Server`.

Servers are declared the way other MCP hosts declare them (an agent's `mcpServers`):
    {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "${TZ}"}, "cwd": "..."}   stdio
    {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}   streamable HTTP
    {"type": "sse", "url": "http://127.0.0.1:8000/sse"}                                     SSE
plus our optional "timeout" (seconds per call), "startupTimeout" (seconds to connect) and
"sandbox" (the sandbox policy a stdio server runs under: `tools` unless named; false runs it as you),
and "disabled": true (declared, listed, not started). A project's `.mcp.json` declares servers too,
started once trusted (`project_mcp`), and may not name a sandbox.

A stdio server runs in a jail of its own (`_jailed_stdio`), never in the project the model writes
(whose files it would import or run, unsandboxed): in a directory of its own, which is also its
$HOME, with the project read-only, the network, and only the variables its `env` names.

Each connection is owned by one dedicated task that enters and exits the SDK's context managers:
anyio cancel scopes must be exited by the task that entered them, so callers never touch them and
talk to the owner through a queue of jobs and futures instead.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__, sandbox
from .config import data_dir, data_path
from .tools import CallContext, Server, Tool, ToolResult
from .types import ConfigError, OllieError

DEFAULT_CALL_TIMEOUT = 120.0
DEFAULT_STARTUP_TIMEOUT = 20.0
_CLOSE_TIMEOUT = 10.0  # the SDK bounds its own shutdown at ~6 s (stdin close, SIGTERM, SIGKILL)
# A server that served and then died is started again when next asked for (its tools, a call); a
# start that fails waits this long before the next, doubled each time up to RESTART_MAX.
RESTART_WAIT = 5.0
RESTART_MAX = 300.0
# One that dies again within this many seconds of being started again waits as a failed start does:
# a server that crashes at every call must not cost a jail and a process at every request.
STABLE_FOR = 60.0

# The SDK logs transport noise (a non-JSON line from a server) at ERROR; without any handler Python
# would print it on the terminal. What matters reaches the user as the server's error instead.
logging.getLogger("mcp").addHandler(logging.NullHandler())
log = logging.getLogger("ollie.mcp")

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_POLICY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a project file's server


class Unavailable(OllieError):
    """The server cannot serve calls; the message says why."""


@dataclass(slots=True)
class ServerSpec:
    """One validated `mcpServers` entry, with `${VAR}` expanded."""

    name: str
    transport: str  # "stdio" | "http" | "sse"
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_CALL_TIMEOUT
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    sandbox: str = "tools"  # a stdio server's sandbox policy; "": none
    project: str = ""  # the session's cwd, which a sandboxed server reads ({CWD} of its policy)
    written: tuple[str, ...] = ()  # where the session's tree's code writes: no program is taken from there


def parse_spec(name: str, raw: Any, cwd: str = "", written: tuple[str, ...] = (), source: str = "") -> ServerSpec:
    """Validate an `mcpServers` entry of a session in `cwd` (whose tree's code writes `written`
    besides); a relative server cwd is taken from it. `source`: the project's `.mcp.json` that
    declares it (else an agent config), whose stdio servers run under the `tools` policy always."""
    entry = _Entry(f"{source}: mcpServers.{name}" if source else f"mcpServers.{name}", raw)
    # The name is a file's in ollie's data (its log, its cache, which its jail writes): never a path.
    if name in ("", ".", "..") or "/" in name or "\0" in name or source and not _SERVER_NAME.fullmatch(name):
        raise ConfigError(
            f"{entry.where}: the server's name must be letters, digits, '.', '_' and '-' (not starting with '.')"
        )
    kind = raw.get("type") or raw.get("transport") or ("stdio" if "command" in raw else "http")
    kind = {"streamable-http": "http", "streamableHttp": "http"}.get(kind, kind)
    if kind not in ("stdio", "http", "sse"):
        raise ConfigError(f"{entry.where}.type must be stdio, http or sse, got {kind!r}")
    spec = ServerSpec(
        name,
        kind,
        timeout=entry.seconds("timeout", DEFAULT_CALL_TIMEOUT),
        startup_timeout=entry.seconds("startupTimeout", DEFAULT_STARTUP_TIMEOUT),
    )
    if kind == "stdio":
        spec.command = entry.required("command", "the program that runs the server")
        spec.args, spec.env = entry.string_list("args"), entry.string_map("env")
        if raw.get("cwd"):  # relative to the session's cwd, like a command typed there
            spec.cwd = os.path.join(cwd, os.path.expanduser(entry.expand(raw["cwd"], "cwd")))
        spec.sandbox = entry.project_sandbox() if source else entry.sandbox()
        spec.project, spec.written = cwd, tuple(dict.fromkeys((cwd, *written)))
    else:
        spec.url = entry.required("url", "the server's HTTP endpoint")
        spec.headers = entry.string_map("headers")
    return spec


def disabled(name: str, raw: Any, source: str = "") -> bool:
    """Whether an `mcpServers` entry says `"disabled": true` (not started, listed as disabled)."""
    value = raw.get("disabled", False) if isinstance(raw, dict) else False
    if not isinstance(value, bool):
        where = f"{source}: mcpServers.{name}" if source else f"mcpServers.{name}"
        raise ConfigError(f"{where}.disabled must be true or false, got {value!r}")
    return value


class _Entry:
    """The fields of one raw `mcpServers` entry, read with `${VAR}` expanded; every error names
    the field (`where` is the entry's path in the config)."""

    def __init__(self, where: str, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f'{where} must be an object with "command" (stdio) or "url" (HTTP)')
        self.where = where
        self.raw: dict[str, Any] = raw

    def expand(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"{self.where}.{key} must be a string, got {value!r}")

        def var(m: re.Match[str]) -> str:
            if m[1] in os.environ:
                return os.environ[m[1]]
            if m[2] is not None:
                return m[2]
            raise ConfigError(f"{self.where}.{key}: ${{{m[1]}}} is not set (write ${{{m[1]}:-default}} for a default)")

        return _VAR.sub(var, value)

    def required(self, key: str, what: str) -> str:
        if not self.raw.get(key):
            raise ConfigError(f'{self.where} needs "{key}" ({what})')
        return self.expand(self.raw[key], key)

    def string_list(self, key: str) -> list[str]:
        value = self.raw.get(key, [])
        if not isinstance(value, list):
            raise ConfigError(f"{self.where}.{key} must be a list of strings")
        return [self.expand(v, f"{key}[{i}]") for i, v in enumerate(value)]

    def string_map(self, key: str) -> dict[str, str]:
        value = self.raw.get(key, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{self.where}.{key} must be an object of strings")
        return {k: self.expand(v, f"{key}.{k}") for k, v in value.items()}

    def sandbox(self) -> str:
        value = self.raw.get("sandbox", "tools")
        if value is False:
            return ""
        if not isinstance(value, str) or not _POLICY_NAME.fullmatch(value):
            raise ConfigError(
                f"{self.where}.sandbox must be a sandbox policy name (the built-in one is tools), or false to "
                f"run the server unsandboxed, as you; got {value!r}"
            )
        return value

    def project_sandbox(self) -> str:
        """A project file's server runs under `tools`: the file is the project's, which sandboxed
        code writes, and a trusted hash covers what the user read, not what a policy name (a wide
        one written for another agent) or `false` would open up."""
        if self.raw.get("sandbox", "tools") != "tools":
            raise ConfigError(
                f"{self.where}.sandbox: a project's .mcp.json cannot choose a server's sandbox (its stdio "
                f"servers run under the tools policy); declare the server in an agent config to run it under "
                f"another policy, or remove the field"
            )
        return "tools"

    def seconds(self, key: str, default: float) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{self.where}.{key} must be a positive number of seconds, got {value!r}")
        return float(value)


def log_path(name: str) -> Path:
    """Where a stdio server's stderr goes."""
    return data_path() / "logs" / f"mcp-{name}.log"


Job = Callable[[Any], Awaitable[Any]]


class Client:
    """One connection to an MCP server. `connect()` starts it and lists its tools; `error` says
    why it cannot serve ("" while healthy); `close()` ends it and its process."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.error = "not connected"
        self.tools: list[Tool] = []
        self._jobs: asyncio.Queue[tuple[Job, asyncio.Future[Any]]] = asyncio.Queue()
        self._pending: set[asyncio.Future[Any]] = set()  # calls not answered yet, queued or running
        self._owner: asyncio.Task[None] | None = None
        self._stop: Callable[[], None] = lambda: None
        self._log_start = 0
        self._closing = False
        self._noise = ""  # the first thing the server sent that is not a protocol message
        self.served = False  # it started and listed its tools once (a later failure: it died)

    async def connect(self) -> None:
        """Start the server and list its tools within `spec.startup_timeout`; raises Unavailable."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready), name=f"mcp server {self.name}")
        try:
            async with asyncio.timeout(self.spec.startup_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            ready.cancel()
            noise = f"; it wrote {self._noise}, which is not MCP" if self._noise else ""
            self._fail(f"no answer within {self.spec.startup_timeout:g} s{noise}")
            await self.close()
            raise Unavailable(self.error) from None
        except (Unavailable, asyncio.CancelledError):
            await self.close()
            raise

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        result = await self._submit(lambda c: c.call_tool(name, arguments))
        blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
        if not blocks and result.structured_content is not None:
            blocks = [{"type": "text", "text": json.dumps(result.structured_content)}]
        return ToolResult(blocks, bool(result.is_error))

    async def close(self) -> None:
        """End the connection and the server's process; safe to call more than once."""
        if self.error in ("", "not connected"):
            self.error = "shut down"
        self._closing = True
        self._stop()
        if self._owner is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._owner), _CLOSE_TIMEOUT)
            except TimeoutError:
                self._owner.cancel()
            except asyncio.CancelledError:
                self._owner.cancel()
                raise

    async def _submit(self, job: Job) -> Any:
        if self.error:
            raise Unavailable(self.error)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.add(done)
        self._jobs.put_nowait((job, done))
        try:
            return await done  # a caller's cancellation cancels `done`, which cancels the job
        finally:
            self._pending.discard(done)

    # ---- the owner task ---------------------------------------------------------------------

    async def _own(self, ready: asyncio.Future[None]) -> None:
        import anyio
        from mcp import Client as SdkClient
        from mcp import Implementation

        try:
            with anyio.CancelScope() as scope:
                self._stop = scope.cancel
                if self._closing:
                    return
                info = Implementation(name="ollie", version=__version__)
                sdk = SdkClient(self._transport(), client_info=info, cache=None, message_handler=self._on_message)
                async with sdk as client, anyio.create_task_group() as jobs:
                    self.tools = await self._list_tools(client)
                    self._log_start = self._log_size()  # a later failure's reason shows only later stderr
                    self.error = ""
                    self.served = True
                    ready.set_result(None)
                    while True:
                        job, done = await self._jobs.get()
                        jobs.start_soon(self._run, client, job, done)
        except Exception as e:  # noqa: BLE001 - any failure is the server's reason, shown to the user
            self._fail(_describe(e))
        finally:
            self.error = self.error or "shut down"
            if not ready.done():
                ready.set_exception(Unavailable(self.error))
            for done in self._pending:
                if not done.done():
                    done.set_exception(Unavailable(self.error))

    async def _run(self, client: Any, job: Job, done: asyncio.Future[Any]) -> None:
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        with anyio.CancelScope() as scope:

            def cancel_job(f: asyncio.Future[Any]) -> None:
                if f.cancelled():
                    scope.cancel()

            done.add_done_callback(cancel_job)
            try:
                result = await job(client)
                if not done.done():
                    done.set_result(result)
            except Exception as e:
                if isinstance(e, MCPError) and e.error.code == CONNECTION_CLOSED:
                    self._fail(_describe(e))
                    self._stop()  # tear the transport down: the process is reaped, not left behind
                    e = Unavailable(self.error)
                if not done.done():
                    done.set_exception(e)
            # cancelled with the whole connection: `_own` answers the call once it knows why

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception) and not self._noise:
            errors = getattr(message, "errors", None)  # pydantic: what failed to parse is the input
            seen = errors()[0].get("input") if callable(errors) and errors() else message
            self._noise = repr(str(seen)[:100])

    @staticmethod
    async def _list_tools(client: Any) -> list[Tool]:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            for t in page.tools:
                read_only = bool(t.annotations and t.annotations.read_only_hint)
                tools.append(Tool(t.name, t.description or "", dict(t.input_schema), read_only))
            cursor = page.next_cursor
            if not cursor:
                return tools

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        spec = self.spec
        if spec.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            path = log_path(self.name)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # stderr may hold secrets
            with open(path, "a") as log:
                log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {spec.command} {' '.join(spec.args)}\n")
                log.flush()
                self._log_start = self._log_size()
                if spec.sandbox:
                    async with _jailed_stdio(spec, log.fileno()) as streams:
                        yield streams
                    return
                params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd or None)
                async with stdio_client(params, errlog=log) as streams:
                    yield streams
        elif spec.transport == "sse":
            from mcp.client.sse import sse_client

            async with sse_client(spec.url, headers=spec.headers or None) as streams:
                yield streams
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(30, read=300)  # the SDK's own defaults for an HTTP server
            async with (
                httpx2.AsyncClient(headers=spec.headers, timeout=timeout) as http,
                streamable_http_client(spec.url, http_client=http) as streams,
            ):
                yield streams

    def _fail(self, reason: str) -> None:
        if self.error in ("", "not connected"):
            detail = f"stderr: {tail}" if (tail := self._stderr_tail()) else self.spec.url
            self.error = f"{reason} ({detail})" if detail else reason

    def _log_size(self) -> int:
        try:
            return log_path(self.name).stat().st_size if self.spec.transport == "stdio" else 0
        except OSError:
            return 0

    def _stderr_tail(self) -> str:
        if self.spec.transport != "stdio":
            return ""
        try:
            with open(log_path(self.name), "rb") as f:
                f.seek(self._log_start)
                lines = f.read()[-4000:].decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""


# ---- a stdio server in a jail --------------------------------------------------------------------

_STOP_GRACE = 2.0  # seconds a server has to exit once its stdin closes (the spec's shutdown); then killed
_LINE_MAX = 64 << 20  # bytes of one message from a server


@asynccontextmanager
async def _jailed_stdio(spec: ServerSpec, stderr: int) -> AsyncIterator[Any]:
    """The SDK's message streams over the stdin and stdout of the server, run in a jail under
    `spec.sandbox`: in `spec.cwd` if given, else in the jail's private /tmp, which is also its
    $HOME (so that nothing the model wrote, a `~/.npmrc` or a `package.json` up the tree, is ever
    its configuration, and nothing it writes there outlives it), with its caches in a directory of
    its own (`tool_cache`), and what its program needs readable (`_program_roots`)."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    program, box, env = await sandbox.off_loop(_jail_plan, spec)
    jails = sandbox.Jails()
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        jail = await jails.get(box.policy)
        argv = [program, *spec.args]
        stage = await jail.spawn(
            box.confinement, argv, spec.cwd or "/tmp", env, stdin=in_r, stdout=out_w, stderr=stderr
        )
    except BaseException:
        for fd in (in_w, out_r):
            os.close(fd)
        await jails.close()
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_LINE_MAX)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(out_r, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(in_w, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def server_to_session() -> None:
        async with to_session:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # a line over _LINE_MAX: the stream is out of step from here on
                    await to_session.send(ValueError(f"a message over {_LINE_MAX >> 20} MiB"))
                    return
                if not line:
                    return
                try:
                    text = line.decode(errors="replace").rstrip("\n")
                    message = mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
                except ValueError as e:
                    await to_session.send(e)
                    continue
                await to_session.send(SessionMessage(message))

    async def session_to_server() -> None:
        async with from_session:
            async for item in from_session:
                writer.write(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                try:
                    await writer.drain()
                except ConnectionError:
                    return

    async with anyio.create_task_group() as pumps:
        pumps.start_soon(server_to_session)
        pumps.start_soon(session_to_server)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                writer.close()
                await stage.wait(_STOP_GRACE)
                stage.kill()
                await jails.close()  # everything in the jail ends with it
            pumps.cancel_scope.cancel()


def tool_cache(name: str) -> Path:
    """The directory a stdio server keeps its caches in (npm's, uv's, pip's) from one start to the
    next: its own, in ollie's data, which sandboxed code never sees."""

    return data_dir("tool-cache", name)


def _jail_plan(spec: ServerSpec) -> tuple[str, sandbox.Sandbox, dict[str, str]]:
    """A jailed server's program, sandbox and environment: looked up, read and decided in the
    sandbox's builder thread (`sandbox.off_loop`), since code working in $HOME or the project can
    point what they look at (a toolchain's directory, ~/.local/bin on the PATH) into ollie's own
    mount, on which the event loop that serves it would wait."""
    program = _program(spec)
    cache = str(tool_cache(spec.name))
    # no configuration of $HOME (`copied`), where the model's code may have planted one: an
    # ~/.npmrc's node-options would run a script of its choosing, with the server's network
    policy = sandbox.load_policy(
        spec.sandbox, spec.project, "", extra_rwx=(cache,), program_rox=_program_roots(program, spec.args), copied=False
    )
    box = sandbox.Sandbox(policy)
    env = {
        **box.environ(),
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "XDG_CACHE_HOME": cache,
        "npm_config_cache": f"{cache}/npm",
        "UV_CACHE_DIR": f"{cache}/uv",
        "PIP_CACHE_DIR": f"{cache}/pip",
        "PYTHONSAFEPATH": "1",
        **spec.env,
    }
    env["PATH"] = box.search_path(env.get("PATH") or os.defpath)
    return program, box, env


def _program(spec: ServerSpec) -> str:
    """The server's program, found on the user's PATH as their shell would find it, but never one
    in the project (a virtualenv's bin/ on PATH): the model writes there, and would choose what
    runs with the server's network."""
    program = shutil.which(spec.command)
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "not found", spec.command)
    for path in (program, *_interpreter(program)):
        real = os.path.realpath(path)
        for written in filter(None, spec.written):
            if (real + "/").startswith(written.rstrip("/") + "/"):
                raise OSError(
                    errno.EACCES,
                    f"{real} lies in {written}, which the session's code writes: name a program outside it "
                    "by its absolute path",
                    spec.command,
                )
    return program


def _program_roots(program: str, args: list[str]) -> tuple[str, ...]:
    """What a server's program needs to read and run beyond the system's directories: the
    installation it lies in, the interpreter its first line names, and the files its arguments
    name (each as its installation, `_install_root`); not a directory an argument names (a server
    that works in one is granted it by a policy of its own)."""
    files = [a for a in args if os.path.isabs(a) and os.path.isfile(a)]
    return tuple(dict.fromkeys(_install_root(os.path.realpath(p)) for p in [program, *_interpreter(program), *files]))


def _interpreter(program: str) -> list[str]:
    """The interpreter a script's first line names, if it is a regular file (never waiting on a
    FIFO put in its place)."""
    try:
        fd = os.open(program, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        first = os.read(fd, 512).split(b"\n", 1)[0]
    finally:
        os.close(fd)
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(words[0]) if words else None
        return [found] if found else []
    return words[:1]


def _install_root(path: str) -> str:
    """The directory a program's installation is: the top of a node_modules tree; the prefix above
    a bin/ (a virtualenv, a Python or Node installed under $HOME), but only the program itself in a
    shared one (/usr/local/bin, ~/.local/bin); else the directory of the file."""
    if "/node_modules/" in path:
        return path[: path.index("/node_modules/") + len("/node_modules")]
    parent = os.path.dirname(path)
    if os.path.basename(parent) == "bin":
        home = os.path.expanduser("~")
        prefix = os.path.dirname(parent)
        shared = ("/", "/usr", "/usr/local", "/opt", home, os.path.join(home, ".local"))
        return path if prefix in shared else prefix
    return path if os.path.isdir(path) else parent


def _describe(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(e, MCPError) and e.error.code == CONNECTION_CLOSED:
        return "the server closed the connection"
    if isinstance(e, FileNotFoundError):
        return f"cannot run {e.filename!r}: not found"
    if isinstance(e, PermissionError) and e.filename:
        return f"cannot run {e.filename!r}: {e.strerror}"
    return str(e) or type(e).__name__


class _ClientServer:
    """An MCP connection offered as a tool `Server`; one whose server died after it served is
    started again when next asked for (at most every RESTART_WAIT seconds, backing off)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._closed = False
        self._wait = RESTART_WAIT
        self._next_start = 0.0  # monotonic time before which no start is tried again
        self._restarted = -STABLE_FOR  # monotonic time it was last started again
        self._waited = False  # this death, soon after a restart, has been waited for
        self._starting = asyncio.Lock()  # calls that find it dead at once start one server

    async def list_tools(self) -> list[Tool]:
        await self._revive()
        if self.client.error:
            raise Unavailable(self.client.error)
        return list(self.client.tools)

    async def call_tool(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        await self._revive()
        return await self.client.call_tool(name, arguments)

    async def close(self) -> None:
        self._closed = True
        await self.client.close()

    async def _revive(self) -> None:
        if not (self.client.error and self.client.served):
            return
        async with self._starting:
            dead = self.client
            if dead.error and not self._closed and time.monotonic() >= self._next_start:
                await self._start_again(dead)

    async def _start_again(self, dead: Client) -> None:
        if time.monotonic() - self._restarted >= STABLE_FOR:
            self._wait = RESTART_WAIT  # it had run a while: started again at once
        elif not self._waited:
            self._waited = True
            log.warning("mcp server %s died soon after its restart; started again in %g s", dead.name, self._wait)
            self._back_off()
            return
        fresh = Client(dead.spec)
        try:
            await fresh.connect()
        except Unavailable as e:
            self._back_off()
            log.warning("mcp server %s died and did not start again: %s", dead.name, e)
            return
        log.info("mcp server %s died (%s) and was started again", dead.name, dead.error)
        self.client, self._restarted, self._waited = fresh, time.monotonic(), False
        await dead.close()

    def _back_off(self) -> None:
        """No start before the wait is over; the wait doubles (up to RESTART_MAX)."""
        self._next_start = time.monotonic() + self._wait
        self._wait = min(self._wait * 2, RESTART_MAX)


def new_server(client: Client) -> Server:
    """Wrap an MCP client as a tool server (the dispatcher routes to it like to any other)."""
    return _ClientServer(client)


def failed_server(name: str, reason: str) -> Server:
    """A declared server that cannot even start (a bad `mcpServers` entry): it stays listed, and
    answers calls, with its reason."""
    client = Client(ServerSpec(name, "stdio"))
    client.error = reason
    return _ClientServer(client)
