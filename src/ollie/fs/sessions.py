"""The live sessions as files: `s/`, one directory per session, and the root `ctl`.

Sessions stored on disk come back when the server starts, asleep: their metadata is in memory,
their chat is read from disk, and nothing else is built until a file that needs the Core is
opened (prompt, ctl, cfg, …), so listing and reading chat never touch a backend.

`ls s/` shows only session directories, so scripts can count and diff them (IDEAS.md). The fixed
files `new`, `idx`, `sh`, `ls`, `kill` resolve by name but are not listed, and no session may take
their names. Ids are `<unix-ns>-<6 hex>`, so sorting by name is creation order; a renamed session
sorts by its new name (letters after digits: after every unnamed session). The listing itself
(readdir order, `ls -U`) is always creation order.
"""

from __future__ import annotations

import asyncio
import errno as E
import json
import logging
import os
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config
from ..types import GENERATION_PARAM_TYPES, ConfigError, Event, OllieError
from . import transcripts
from .namespace import Dir, File, FsError, Handle, OpenMode, Stat
from .stores import CtlFile, LineBuffer, MiB, OnCloseFile, SnapshotHandle, TextFile, text_size

if TYPE_CHECKING:
    from ..agent import Core
    from ..agent.session import SessionMeta

log = logging.getLogger("ollie.fs")

NEW_KEYS = ("agent", "cwd", "backend", "model", "name")
PROMPT_MAX = 1 * MiB  # a prompt written to `prompt` or `fifo.in`
PLAN_MAX = 1 * MiB


class Session:
    """One session as the server holds it: its metadata always, its Core once awake.

    It adds what the file interface promises beyond the Core: a write to `prompt` empties `reply`
    and leaves `idle` at once (the Core starts the turn a moment later), `offset`, `prompt.prev`.
    """

    def __init__(self, meta: SessionMeta, core: Core | None = None):
        self.meta = meta
        self.core: Core | None = None
        self._waking: asyncio.Future | None = None
        self._pending = False  # a prompt was accepted and its turn has not completed
        self._changed = asyncio.Event()
        self.offset: int | None = None
        self.prompt_prev = ""
        self._stored: tuple[str, str] | None = None  # (reply, last prompt) while asleep, read once
        if core is not None:
            self._attach(core)

    @property
    def id(self) -> str:
        return self.core.session_id if self.core else self.meta.id

    @property
    def created(self) -> float:
        return self.meta.created

    @property
    def chat_path(self) -> Path:
        from ..agent.session import sessions_dir

        return self.core.chat_path if self.core else sessions_dir() / self.id / "chat"

    # ---- waking -----------------------------------------------------------------------------
    async def wake(self) -> Core:
        """The Core, restored from disk on first need (one restore, however many ask)."""
        if self.core is not None:
            return self.core
        if self._waking is None:
            self._waking = asyncio.ensure_future(self._restore())
        try:
            return await asyncio.shield(self._waking)
        except BaseException:
            if self._waking.done():
                self._waking = None
            raise

    async def _restore(self) -> Core:
        from ..agent import open_session

        try:
            core = await open_session(session_id=self.meta.id)
        except (ConfigError, OllieError) as e:
            raise FsError(E.EIO, f"session {self.meta.id}: cannot restore: {e}") from None
        self._attach(core)
        return core

    def _attach(self, core: Core) -> None:
        self.core = core
        self.meta = core.meta
        core.subscribe(self._on_event)

    def _on_event(self, ev: Event) -> None:
        if ev.kind == "user":
            size = _file_size(self.chat_path)
            self.offset = max(0, size - len(f"user: {ev.text}\n".encode()))
        elif ev.kind == "done" and self.core and not self.core.queued():
            self._pending = False
        if ev.kind in ("state", "done", "user"):
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- what the files show ----------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.core is None:
            return "idle"
        state = self.core.state
        return "thinking" if state == "idle" and self._pending else state

    @property
    def reply(self) -> str:
        if self.core is None:
            return self.stored()[0]
        return "" if self._pending else self.core.reply

    def stored(self) -> tuple[str, str]:
        """The reply and the last prompt of a session that has not woken, from its stored history:
        a restart must not empty `reply` (scripts poll its size), and reading it must not wake."""
        if self._stored is None:
            from ..agent.core import last_reply
            from ..agent.session import SessionStore

            try:
                messages = SessionStore(self.id).load_history()
            except OllieError:
                messages = []  # a corrupt history is reported when the session wakes, not by `ls`
            users = [m.content for m in messages if m.role == "user"]
            self._stored = (last_reply(messages), users[-1] if users else "")
        return self._stored

    @property
    def running(self) -> bool:
        return self.core is not None and (self.core.running or self._pending)

    async def wait_state(self, current: str, timeout: float) -> str:
        """The state once it differs from `current`, or after `timeout` seconds whatever it is."""
        try:
            async with asyncio.timeout(timeout):
                while self.state == current:
                    await self._changed.wait()
        except TimeoutError:
            pass
        return self.state

    async def submit(self, text: str) -> None:
        """A prompt written to `prompt`: runs now, or queues behind the running turn."""
        core = await self.wake()
        if not text.strip():
            return
        self.prompt_prev = text
        if text.lstrip()[:1] not in ("/", "!"):
            self._pending = True
            self._notify()
        task = core.start(text)
        task.add_done_callback(self._submitted)

    def _submitted(self, task: asyncio.Future) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("session %s: submit failed: %s", self.id, task.exception())
        if self.core is not None and not self.core.running:
            self._pending = False
            self._notify()

    async def enqueue(self, text: str) -> None:
        """`fifo.in`: queue the prompt; when idle, start the oldest queued one."""
        core = await self.wake()
        text = text.strip()  # as `prompt` does: the newline echo adds is not part of the prompt
        if not text:
            return
        core.queue(text)
        if not self.running:
            await self.submit(core.pop_queue() or "")

    def error(self, message: str) -> None:
        """Put `error: message` into the chat (a control write that failed)."""
        if self.core is not None:
            self.core.emit(Event("error", message))

    async def close(self) -> None:
        if self._waking is not None and not self._waking.done():
            await asyncio.gather(self._waking, return_exceptions=True)
        if self.core is not None:
            await self.core.close()


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


# ---- the registry of sessions ---------------------------------------------------------------------


class Sessions:
    """Every session of this server, in creation order."""

    FIXED = ("new", "idx", "sh", "ls", "kill")

    def __init__(self, default_cwd: str | None = None):
        self._by_id: dict[str, Session] = {}
        self.default_cwd = default_cwd or os.getcwd()
        self._lock = asyncio.Lock()  # creation, kill and rename, one at a time

    def restore(self) -> int:
        """Register every stored session, asleep. Returns how many."""
        from ..agent.session import list_stored

        for meta in list_stored():
            self._by_id.setdefault(meta.id, Session(meta))
        return len(self._by_id)

    def get(self, sid: str) -> Session:
        try:
            return self._by_id[sid]
        except KeyError:
            raise FsError(E.ENOENT, f"no session {sid!r}") from None

    def all(self) -> list[Session]:
        return sorted(self._by_id.values(), key=lambda s: (s.created, s.id))

    def check_name(self, name: str) -> str:
        from ..agent.session import check_session_id

        if name in self.FIXED:
            raise FsError(E.EINVAL, f"{name!r} is a fixed file of s/; choose another name")
        try:
            check_session_id(name)
        except ValueError as e:
            raise FsError(E.EINVAL, str(e)) from None
        if name in self._by_id:
            raise FsError(E.EEXIST, f"session {name!r} already exists")
        return name

    def check_spec(self, spec: dict[str, str]) -> None:
        """What can be known wrong in a new session's spec before making it: the writer of `s/new`
        hears of it at its write (the session is made at close, whose error shells ignore)."""
        from .. import backends

        if unknown := sorted(set(spec) - set(NEW_KEYS)):
            raise FsError(E.EINVAL, f"unknown key {unknown[0]!r}; keys: {', '.join(NEW_KEYS)}")
        if spec.get("name"):
            self.check_name(spec["name"])
        if spec.get("cwd"):
            check_cwd(spec["cwd"])
            if not os.path.isdir(self._cwd(spec)):
                raise FsError(E.ENOENT, f"cwd {self._cwd(spec)!r} is not a directory")
        if spec.get("backend") and spec["backend"] not in backends.names():
            known = ", ".join(backends.names())
            raise FsError(E.EINVAL, f"unknown backend {spec['backend']!r}; backends: {known}")
        if spec.get("agent"):
            try:
                config.load_agent(spec["agent"])
            except ConfigError as e:
                raise FsError(E.EINVAL, str(e)) from None

    def _cwd(self, spec: dict[str, str]) -> str:
        return os.path.expanduser(spec["cwd"]) if spec.get("cwd") else self.default_cwd

    async def new(self, spec: dict[str, str]) -> Session:
        """Create a session: keys agent, cwd, backend, model, name (empty values mean default)."""
        from ..agent import open_session

        async with self._lock:
            self.check_spec(spec)
            name = spec.get("name") or ""
            cwd = self._cwd(spec)
            try:
                core = await open_session(agent=spec.get("agent") or None, cwd=cwd,
                                          backend=spec.get("backend") or None, model=spec.get("model") or None)
            except (ConfigError, OllieError, ValueError) as e:
                raise FsError(E.EINVAL, str(e)) from None
            if name:
                core.set_session_id(name)
            session = Session(core.meta, core)
            self._by_id[session.id] = session
            return session

    async def kill(self, sid: str) -> None:
        """Stop the session and move its files to the transcripts (tr/)."""
        from ..agent.session import sessions_dir

        async with self._lock:
            session = self.get(sid)
            del self._by_id[sid]
        await session.close()
        transcripts.keep(sessions_dir() / sid)

    async def rename(self, old: str, new: str) -> None:
        async with self._lock:
            session = self.get(old)
            self.check_name(new)
            if session.running:
                raise FsError(E.EBUSY, f"session {old} is running; interrupt it (echo stop > ctl) first")
            core = await session.wake()
            try:
                core.set_session_id(new)
            except (ValueError, OSError) as e:
                raise FsError(E.EBUSY if core.running else E.EINVAL, str(e)) from None
            self._by_id = {(new if k == old else k): v for k, v in self._by_id.items()}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._by_id.values()), return_exceptions=True)

    def index(self) -> str:
        lines = []
        for s in self.all():
            m = s.meta
            lines.append(f"{s.id}\t{s.state}\t{m.cwd}\t{m.backend}\t{m.model}\n")
        return "".join(lines)


def check_cwd(path: str) -> str:
    """A session's working directory must be absolute: a relative one would be taken from the
    server's directory (or the session's), which the writer cannot see."""
    if not os.path.isabs(os.path.expanduser(path)):
        raise FsError(E.EINVAL, f"cwd {path!r} is relative: give an absolute path")
    return path


def parse_kv(line: str) -> dict[str, str]:
    """`k=v k2="v 2"` tokens (shell quoting allowed) into a dict; a token without '=' fails."""
    try:
        tokens = shlex.split(line)
    except ValueError as e:
        raise FsError(E.EINVAL, f"cannot parse {line!r}: {e}") from None
    out = {}
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep or not key:
            raise FsError(E.EINVAL, f"expected key=value, got {tok!r}")
        out[key] = value
    return out


# ---- root ctl and s/ ---------------------------------------------------------------------------------


def root_ctl(sessions: Sessions) -> CtlFile:
    async def act(line: str) -> str | None:
        verb, _, rest = line.partition(" ")
        if verb == "new":
            return (await sessions.new(parse_kv(rest))).id
        if verb == "kill":
            ids = rest.split()
            if not ids:
                raise FsError(E.EINVAL, "usage: kill <id>...")
            for sid in ids:
                await sessions.kill(sid)
            return None
        raise FsError(E.EINVAL, f"unknown command {verb!r}; commands: new [agent=] [cwd=] [backend=] [model=] "
                                "[name=], kill <id>")

    return CtlFile(act)


NEW_TEMPLATE = "".join(f"{k}=\n" for k in ("name", "cwd", "backend", "model", "agent"))


class NewHandle(SnapshotHandle):
    """s/new: `k=v` lines (the template, filled in) create a session when closed; each line is
    checked as it is written, so an unknown key, a bad name, cwd, backend or agent fails the write.
    A line longer than LINE_MAX fails too, and then nothing is created at close.
    Reading gives the template, or the new session's id once one was created."""

    def __init__(self, sessions: Sessions):
        super().__init__(lambda: self._answer or NEW_TEMPLATE)
        self._sessions = sessions
        self._answer = ""
        self._spec: dict[str, str] = {}
        self._lines = LineBuffer()
        self._dirty = False

    async def write(self, offset: int, data: bytes) -> int:
        try:
            lines = self._lines.feed(data)
        except FsError:
            self._dirty = False
            raise
        for line in lines:
            self._take(line)
        self._dirty = True
        return len(data)

    async def read(self, offset: int, count: int) -> bytes:
        await self.flush()  # written and not yet closed: create now, so the id can be read back
        return await super().read(offset, count)

    def _take(self, raw: bytes) -> None:
        spec = parse_kv(raw.decode(errors="replace"))
        self._sessions.check_spec(spec)
        self._spec.update(spec)

    async def flush(self) -> None:
        if not self._dirty:
            return
        self._take(self._lines.rest())
        spec, self._spec, self._dirty = self._spec, {}, False
        self._answer = (await self._sessions.new(spec)).id + "\n"


class NewFile(File):
    mode = 0o644

    def __init__(self, sessions: Sessions):
        self._sessions = sessions

    def size(self) -> int:
        return len(NEW_TEMPLATE)

    async def open(self, mode: OpenMode) -> Handle:
        return NewHandle(self._sessions)


class SessionsDir(Dir):
    """s/: a directory per session (listed, creation order) and the fixed files (not listed)."""

    mode = 0o755

    def __init__(self, sessions: Sessions, scripts: dict[str, str]):
        self.sessions = sessions
        self.fixed: dict[str, File] = {
            "new": NewFile(sessions),
            "idx": TextFile(sessions.index, text_size(sessions.index)),
            **{name: TextFile(lambda t=text: t, lambda t=text: len(t.encode()), mode=0o555)
               for name, text in scripts.items()},
        }

    def lookup(self, name: str) -> File | Dir:
        if name in self.fixed:
            return self.fixed[name]
        return SessionDir(self.sessions.get(name), self.sessions)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(s.id, SessionDir(s, self.sessions)) for s in self.sessions.all()]

    async def mkdir(self, name: str, mode: int) -> None:
        await self.sessions.new({"name": name})

    async def remove(self, name: str) -> None:
        if name in self.fixed:
            raise FsError(E.EACCES, f"{name}: a fixed file of s/")
        await self.sessions.kill(name)

    async def rename(self, old: str, new: str) -> None:
        if old in self.fixed:
            raise FsError(E.EACCES, f"{old}: a fixed file of s/")
        await self.sessions.rename(old, new)


# ---- one session's directory ------------------------------------------------------------------------


class SessionDir(Dir):
    """s/<id>/: its files are made on lookup (nothing per session is kept for them)."""

    mode = 0o755

    def __init__(self, session: Session, sessions: Sessions):
        self.session = session
        self.sessions = sessions

    def mtime(self) -> float:
        return self.session.meta.updated or self.session.created

    def lookup(self, name: str) -> File | Dir:
        make = SESSION_FILES.get(name)
        if make is None:
            raise FsError(E.ENOENT, f"{name}: no such file in a session directory")
        return make(self.session, self.sessions)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(name, make(self.session, self.sessions)) for name, make in SESSION_FILES.items()]

    async def remove(self, name: str) -> None:
        """Removing a session's file does nothing, so that `rm -r s/<id>` reaches the rmdir."""


class ChatFile(File):
    """The chat log, read from disk: its size is the file's, so `tail -f` follows it."""

    def __init__(self, session: Session):
        self.session = session

    def stat(self, name: str) -> Stat:
        try:
            st = os.stat(self.session.chat_path)
        except FileNotFoundError:
            return Stat(name, mode=0o444)
        return Stat(name, mode=0o444, size=st.st_size, mtime=st.st_mtime, version=st.st_size & 0xFFFFFFFF)

    async def open(self, mode: OpenMode) -> Handle:
        if mode & OpenMode.WRITE:
            raise FsError(E.EACCES, "chat is read-only; write to prompt")
        try:
            return ChatHandle(os.open(self.session.chat_path, os.O_RDONLY))
        except FileNotFoundError:
            return SnapshotHandle(lambda: "")


class ChatHandle(Handle):
    def __init__(self, fd: int):
        self._fd = fd

    async def read(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    async def release(self) -> None:
        os.close(self._fd)


STATEWAIT_TIMEOUT = 5.0  # as the Go server: a reader that missed a change is not stuck forever


class StateWaitHandle(Handle):
    """Each read from the start blocks until the state differs from the one last seen (the state
    at open for the first read), or for STATEWAIT_TIMEOUT seconds, then gives the state."""

    def __init__(self, session: Session, seen: str):
        self._session = session
        self._seen = seen
        self._data = b""

    async def read(self, offset: int, count: int) -> bytes:
        if offset == 0:
            self._seen = await self._session.wait_state(self._seen, STATEWAIT_TIMEOUT)
            self._data = (self._seen + "\n").encode()
        return self._data[offset : offset + count]


class StateWaitFile(File):
    def __init__(self, session: Session):
        self.session = session

    async def open(self, mode: OpenMode) -> Handle:
        await self.session.wake()
        return StateWaitHandle(self.session, self.session.state)


def _awake(session: Session, get: Callable[[Core], str | Awaitable[str]]) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        v = get(await session.wake())
        return v if isinstance(v, str) else await v
    return read


def _line(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


def _cfg_values(core: Core) -> dict[str, str]:
    """What `cfg` shows, in the form a write takes back (lists comma-separated, objects as JSON)."""
    values = {"state": core.state, "backend": core.backend_name, "model": core.model, "agent": core.agent_name,
              "cwd": core.cwd}
    for key in GENERATION_PARAM_TYPES:
        values[key] = _param_text(getattr(core.params, key))
    return values


def _param_text(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(v)
    return json.dumps(v) if isinstance(v, dict) else str(v)


def _cfg_text(core: Core) -> str:
    return "".join(f"{k}={v}\n" for k, v in _cfg_values(core).items())


async def _cfg_set(session: Session, line: str) -> None:
    """One `key=value` line, the value being the rest of the line (so an object in JSON fits). A
    value equal to what cfg shows changes nothing: an editor writes the whole file back."""
    core = await session.wake()
    key, sep, value = line.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise FsError(E.EINVAL, f"expected key=value, got {line!r}")
    current = _cfg_values(core)
    if key not in current:
        raise FsError(E.EINVAL, f"unknown key {key!r}; keys: {', '.join(k for k in current if k != 'state')}")
    if current[key] == value:
        return
    if key == "state":
        raise FsError(E.EINVAL, "state is read-only")
    if core.running:
        raise FsError(E.EBUSY, f"cannot change {key} while a turn is running; echo stop > ctl first")
    match key:
        case "backend":
            await core.set_backend(value)
        case "model":
            await core.set_model(value)
        case "agent":
            await core.set_agent(value)
        case "cwd":
            core.set_cwd(check_cwd(value))
        case _:
            core.set_param(key, value)


async def _env_set(session: Session, line: str) -> None:
    core = await session.wake()
    key, sep, value = line.partition("=")
    core.set_env(key.strip(), value if sep else None)


async def _ctl(session: Session, sessions: Sessions, line: str) -> str | None:
    core = await session.wake()
    verb, _, arg = line.partition(" ")
    arg = arg.strip()
    match verb:
        case "stop" | "interrupt":
            core.interrupt()
        case "kill":
            await sessions.kill(session.id)
        case "rn" | "rename":
            await sessions.rename(session.id, arg)
        case "save":
            return _save_transcript(session, arg)
        case "compact":
            await core.compact()
        case "clear":
            core.clear()
        case "backend":
            name, _, model = arg.partition(" ")
            await core.set_backend(name, model.strip() or None)
        case "model":
            await core.set_model(arg)
        case "agent":
            await core.set_agent(arg)
        case "cwd":
            core.set_cwd(check_cwd(arg))
        case "queue":
            core.queue(arg)
        case "inject":
            core.inject(arg)
        case _:
            raise FsError(E.EINVAL, f"unknown command {verb!r}; commands: {CTL_HELP}")
    return None


CTL_HELP = "stop, kill, rn <name>, save [name], compact, clear, backend <name> [model], model <m>, agent <a>, " \
           "cwd <dir>, queue <prompt>, inject <prompt>"


def _save_transcript(session: Session, name: str) -> str:
    """ctl `save [name]`: copy the chat to tr/<name or id>."""
    from .stores import check_file_name

    target = config.data_path() / "transcripts" / check_file_name(name or session.id)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(session.chat_path.read_bytes())
    return f"saved tr/{target.name}"


def _ctl_file(session: Session, act: Callable[[str], Awaitable[str | None]], get=None) -> CtlFile:
    """A control file whose failures also land in the chat as `error: …`."""

    async def checked(line: str) -> str | None:
        try:
            return await act(line)
        except FsError as e:
            session.error(e.message)
            raise
        except (ValueError, LookupError, OSError, ConfigError) as e:
            session.error(str(e))
            code = E.EBUSY if session.core is not None and session.core.running else E.EINVAL
            raise FsError(code, str(e)) from None

    return CtlFile(checked, get)


def _mcp_text(servers: dict) -> str:
    out = []
    for name, tools in servers.items():
        out.append(f"{name}\n")
        out.extend(f"\t{t.name}\t{(t.description or '').splitlines()[0] if t.description else ''}\n"
                   for t in tools)
    return "".join(out)


def _prompt_prev(session: Session) -> str:
    if session.prompt_prev:
        return session.prompt_prev
    if session.core is None:
        return session.stored()[1]
    users = [m.content for m in session.core.messages if m.role == "user"]
    return users[-1] if users else ""


def _offset(session: Session) -> str:
    if session.offset is None:
        try:
            data = session.chat_path.read_bytes()
        except FileNotFoundError:
            data = b""
        pos = data.rfind(b"\nuser: ")
        session.offset = pos + 1 if pos >= 0 else (0 if data.startswith(b"user: ") else len(data))
    return f"{session.offset}\n"


def _plan(session: Session) -> str:
    if session.core is not None:
        return session.core.plan
    try:
        return (session.chat_path.parent / "plan").read_text()
    except FileNotFoundError:
        return ""


async def _set_plan(session: Session, text: str) -> None:
    (await session.wake()).set_plan(text)


SessionFileMaker = Callable[[Session, Sessions], File]


def _text(get: Callable[[Session], str], sized: bool = True) -> SessionFileMaker:
    def make(s: Session, _: Sessions) -> File:
        return TextFile(lambda: get(s), text_size(lambda: get(s)) if sized else None)
    return make


def _core_text(get: Callable[[Core], str | Awaitable[str]]) -> SessionFileMaker:
    return lambda s, _: TextFile(_awake(s, get))


async def _pop(core: Core) -> str:
    return _line(core.pop_queue() or "")


async def _models(core: Core) -> str:
    return "".join(m + "\n" for m in await core.models())


async def _mcp(core: Core) -> str:
    return _mcp_text(await core.list_servers())


SESSION_FILES: dict[str, SessionFileMaker] = {
    "prompt": lambda s, _: OnCloseFile(lambda: "", s.submit, PROMPT_MAX, mode=0o622),
    "chat": lambda s, _: ChatFile(s),
    "state": _text(lambda s: s.state + "\n"),
    "reply": _text(lambda s: s.reply),
    "statewait": lambda s, _: StateWaitFile(s),
    "ctl": lambda s, ss: _ctl_file(s, lambda line: _ctl(s, ss, line), get=lambda: CTL_HELP + "\n"),
    "cfg": lambda s, _: _ctl_file(s, lambda line: _cfg_set(s, line), get=_awake(s, _cfg_text)),
    "fifo.in": lambda s, _: OnCloseFile(lambda: "", s.enqueue, PROMPT_MAX, mode=0o622),
    "fifo.out": _core_text(_pop),
    "usage": _core_text(lambda c: c.usage() + "\n"),
    "cost": _core_text(lambda c: c.cost() + "\n"),
    "ctxsz": _core_text(lambda c: c.ctxsz() + "\n"),
    "models": _core_text(_models),
    "systemprompt": _core_text(lambda c: _line(c.system_prompt())),
    "env": lambda s, _: _ctl_file(s, lambda line: _env_set(s, line),
                                  get=_awake(s, lambda c: "".join(f"{k}={v}\n" for k, v in c.env.items()))),
    "context": _core_text(lambda c: c.context_jsonl()),
    "offset": _text(_offset, sized=False),
    "plan": lambda s, _: OnCloseFile(lambda: _plan(s), lambda text: _set_plan(s, text), PLAN_MAX,
                                     text_size(lambda: _plan(s))),
    "prompt.prev": _text(_prompt_prev),
    "mcp": _core_text(_mcp),
}
