"""The sessions as files: `s/`, one directory per session, and the root `ctl`.

`ls s/` shows only the directories of sessions that have ids, so scripts can count and diff them,
and the sessions made after a count sort after every one counted (IDEAS.md picks them by offset in
`ls s/ | sort`). The fixed files `new`, `idx`, `sh`, `ls`, `kill`, your own scripts beside them,
and the sessions you named resolve by name but are not listed: a name sorts anywhere (letters after
digits), and one listed after the ids would shift every offset. `s/idx` lists every session,
named or not. Likewise in a session's
directory, the files whose reading does something (`statewait` and `idlewait` block, `fifo.out` pops a prompt,
`models` and `mcp` make requests) resolve by name but are not listed, and every listed file of a
sleeping session reads from what is stored, so `grep -r`, `find` and `ls -l` over the tree block on
nothing, pop nothing and wake no session. The listing (readdir order, `ls -U`) is creation order.

Commands written to `ctl` and settings written to `cfg` run the session commands
(`ollie.agent.commands`), the same ones slash commands run, with the same refusals.
"""

from __future__ import annotations

import errno as E
import json
import os
import random
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .. import config
from ..agent import commands
from ..chatfmt import context_text, cost_text, usage_text
from ..types import GENERATION_PARAM_TYPES, OllieError
from ..vfs.namespace import Dir, File, FsError, Handle, OpenMode, Stat, check_name
from ..vfs.stores import (
    CtlFile,
    CtlHandle,
    Getter,
    LineBuffer,
    MiB,
    OnCloseFile,
    SnapshotHandle,
    TextFile,
    TextHandle,
    text_size,
)
from . import worktrees
from .sessions import FIXED, MADE_ID, NEW_KEYS, Session, Sessions, check_cwd, errno_of, parse_kv

if TYPE_CHECKING:
    from ..agent import Core
    from ..tools import Tool

PROMPT_MAX = 1 * MiB  # a prompt written to `prompt` or `fifo.in`
PLAN_MAX = 1 * MiB
STATEWAIT_TIMEOUT = 5.0  # as the Go server: a reader that missed a change is not stuck forever
# Each wait times out somewhere in the last STATEWAIT_JITTER of it: readers started together
# (a script's loop of 2,000) would otherwise time out together every 5 s, a burst that holds up
# every other request on the server for a while (issue 15; bench/blocked_readers.py).
STATEWAIT_JITTER = 0.2


# ---- root ctl and s/ ---------------------------------------------------------------------------------


class SessionMaker(Protocol):
    """What the root ctl and s/new make and end sessions with: the server's Sessions, or a
    session's view of them (which makes and ends its sub-sessions only)."""

    def check_spec(self, spec: dict[str, str]) -> None: ...

    async def new(self, spec: dict[str, str]) -> Session: ...

    async def kill(self, sid: str) -> None: ...


def root_ctl(sessions: SessionMaker) -> CtlFile:
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
        raise FsError(
            E.EINVAL,
            f"unknown command {verb[:40]!r}; commands: new [agent=] [cwd=] [backend=] [model=] [name=] [worktree=1], "
            "kill <id>",
        )

    return CtlFile(act)


NEW_TEMPLATE = "".join(f"{k}=\n" for k in ("name", "cwd", "backend", "model", "agent", "worktree"))


class NewHandle(SnapshotHandle):
    """s/new: `k=v` lines (the template, filled in) create a session when closed; each line is
    checked as it is written, so an unknown key, a bad name, cwd, backend or agent fails the write.
    A line longer than LINE_MAX fails too, and then nothing is created at close.
    Reading gives the template, or the new session's id once one was created."""

    def __init__(self, sessions: SessionMaker):
        super().__init__(lambda: self._answer or NEW_TEMPLATE)
        self._sessions = sessions
        self._answer = ""
        self._spec: dict[str, str] = {}
        self._lines = LineBuffer()
        self._dirty = False

    async def write(self, offset: int, data: bytes) -> int:
        try:
            for line in self._lines.feed(data):
                self._take(line)
        except FsError as e:  # the write fails with the errno; reading the file back says why
            self._dirty, self._spec, self._answer = False, {}, f"error: {e}\n"
            raise
        self._dirty = True
        self._wrote(offset, len(data))
        return len(data)

    async def read(self, offset: int, count: int) -> bytes:
        try:  # written and not yet closed: create now, so the id can be read back
            await self.flush()
        except FsError as e:
            self._answer = f"error: {e}\n"
        return await self._read_answer(offset, count)

    def _take(self, raw: bytes) -> None:
        spec = _new_line(raw.decode(errors="replace").strip())
        self._sessions.check_spec(spec)
        self._spec.update(spec)

    async def release(self) -> None:
        self._lines.clear()

    async def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False  # (a refused last line makes nothing, at this close or a later one)
        try:
            self._take(self._lines.rest())
        finally:
            spec, self._spec = self._spec, {}
        self._answer = (await self._sessions.new(spec)).id + "\n"


def _new_line(line: str) -> dict[str, str]:
    """A line of s/new: `key=value`, the value the rest of the line (a cwd with spaces, as in b/new
    and cfg), or several `k=v` words as the root ctl's `new` takes them (shell quoting allowed)."""
    key, sep, value = line.partition("=")
    if sep and key in NEW_KEYS and not value.startswith(("'", '"')) and not _MORE_KEYS.search(value):
        return {key: value}
    return parse_kv(line)


_MORE_KEYS = re.compile(rf"\s(?:{'|'.join(NEW_KEYS)})=")


class NewFile(File):
    mode = 0o644

    def __init__(self, sessions: SessionMaker):
        self._sessions = sessions

    def size(self) -> int:
        return len(NEW_TEMPLATE)

    async def open(self, mode: OpenMode) -> Handle:
        return NewHandle(self._sessions)


def script_file(text: str) -> TextFile:
    return TextFile(lambda: text, lambda: len(text.encode()), mode=0o555)


class SessionsDir(Dir):
    """s/: a directory per session that has an id (listed, creation order), and by name the fixed
    files, your own scripts and the sessions you named (not listed: see the module's doc)."""

    mode = 0o755

    def __init__(self, sessions: Sessions, scripts: dict[str, str]):
        self.sessions = sessions
        self.fixed: dict[str, File] = {
            "new": NewFile(sessions),
            "idx": TextFile(sessions.index, text_size(sessions.index)),
            **{name: script_file(text) for name, text in scripts.items() if name in FIXED},
        }
        # Yours: found after the sessions (a session restored with a script's name keeps it);
        # no new session may take one of their names.
        self.yours = {name: script_file(text) for name, text in scripts.items() if name not in FIXED}
        sessions.scripts = set(self.yours)

    def lookup(self, name: str) -> File | Dir:
        if name in self.fixed:
            return self.fixed[name]
        session = self.sessions.find(name)
        if session is None and name in self.yours:
            return self.yours[name]
        return SessionDir(session or self.sessions.get(name), self.sessions)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(s.id, SessionDir(s, self.sessions)) for s in self.sessions.listed() if MADE_ID.fullmatch(s.id)]

    async def mkdir(self, name: str, mode: int) -> None:
        await self.sessions.new({"name": name})

    async def remove(self, name: str) -> None:
        if name in self.fixed or (name in self.yours and self.sessions.find(name) is None):
            raise FsError(E.EACCES, f"{name}: a fixed file of s/")
        await self.sessions.kill(name)

    async def rename(self, old: str, new: str) -> None:
        if old in self.fixed or (old in self.yours and self.sessions.find(old) is None):
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
        make = SESSION_FILES.get(name) or ACTIVE_FILES.get(name)
        if make is None:
            raise FsError(E.ENOENT, f"{name}: no such file in a session directory")
        return make(self.session, self.sessions)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(name, make(self.session, self.sessions)) for name, make in SESSION_FILES.items()]

    async def remove(self, name: str) -> None:
        """Removing a session's file does nothing, so that `rm -r s/<id>` reaches the rmdir."""


class ChatFile(File):
    """A chat log (a session's `chat`, a job's `log`), read from disk: its size is the file's, so
    `tail -f` follows it. Each open and read is `looked` (a session's text then streams as it
    comes: `Core.looked`)."""

    def __init__(
        self,
        path: Callable[[], Path],
        refusal: str = "chat is read-only; write to prompt",
        looked: Callable[[], None] = lambda: None,
    ):
        self.path = path
        self.refusal = refusal
        self.looked = looked

    def stat(self, name: str) -> Stat:
        try:
            st = os.stat(self.path())
        except FileNotFoundError:
            return Stat(name, mode=0o444)
        return Stat(name, mode=0o444, size=st.st_size, mtime=st.st_mtime, version=st.st_size & 0xFFFFFFFF)

    async def open(self, mode: OpenMode) -> Handle:
        return self.open_now(mode)

    def open_now(self, mode: OpenMode) -> Handle:
        if mode & OpenMode.WRITE:
            raise FsError(E.EACCES, self.refusal)
        self.looked()
        try:
            return ChatHandle(os.open(self.path(), os.O_RDONLY | os.O_NOFOLLOW), self.looked)
        except FileNotFoundError:
            return TextHandle(lambda: "")


class ChatHandle(Handle):
    def __init__(self, fd: int, looked: Callable[[], None]):
        self._fd = fd
        self._looked = looked

    async def read(self, offset: int, count: int) -> bytes:
        return self.read_now(offset, count)

    def read_now(self, offset: int, count: int) -> bytes:
        self._looked()
        return os.pread(self._fd, count, offset)

    async def release(self) -> None:
        os.close(self._fd)


class WaitHandle(Handle):
    """`statewait`: each read from the start blocks until the word (a session's state, a job's
    status) differs from the one last seen (the one at open, for the first read), or for
    STATEWAIT_TIMEOUT seconds, then gives it. `wait(seen, timeout)` does the waiting."""

    def __init__(self, current: str, wait: Callable[[str, float], Awaitable[str]]):
        self._seen = current
        self._wait = wait
        self._data = b""

    async def read(self, offset: int, count: int) -> bytes:
        if offset == 0:
            timeout = STATEWAIT_TIMEOUT * (1 - STATEWAIT_JITTER * random.random())
            self._seen = await self._wait(self._seen, timeout)
            self._data = (self._seen + "\n").encode()
        return self._data[offset : offset + count]


class StateWaitFile(File):
    def __init__(self, session: Session):
        self.session = session

    async def open(self, mode: OpenMode) -> Handle:
        core = await self.session.wake()
        return WaitHandle(core.state, lambda seen, timeout: core.wait_change("state", seen, timeout))


class IdleWaitHandle(Handle):
    """`idlewait`: each read from the start blocks until the session is idle (at once when it
    is: nothing runs and nothing waits), then gives `idle`. What a script that wrote `prompt`
    waits on, with no window between looking at `state` and waiting, as `statewait` has."""

    def __init__(self, core: Core):
        self._core = core
        self._data = b""

    async def read(self, offset: int, count: int) -> bytes:
        if offset == 0:
            state = self._core.state
            while state != "idle":
                state = await self._core.wait_change("state", state)
            self._data = b"idle\n"
        return self._data[offset : offset + count]


class IdleWaitFile(File):
    def __init__(self, session: Session):
        self.session = session

    async def open(self, mode: OpenMode) -> Handle:
        return IdleWaitHandle(await self.session.wake())


# ---- control files: ctl, cfg, env ---------------------------------------------------------------------


Act = Callable[[str], Awaitable[str | None]]


def _reporting(session: Session, act: Act) -> Act:
    """`act`, whose failure fails the write with the error's errno and lands in the chat as
    `error: …`."""

    async def reported(line: str) -> str | None:
        try:
            return await act(line)
        except (OllieError, OSError) as e:
            session.error(str(e))
            raise FsError(errno_of(e) if isinstance(e, OllieError) else E.EINVAL, str(e)) from None

    return reported


def _checked(session: Session, act: Act, get: Getter) -> CtlFile:
    """A control file: one line, one act, reported (see `_reporting`)."""
    return CtlFile(_reporting(session, act), get)


class CfgFile(File):
    """`cfg`: a line that gives a key the value the file showed when it was opened changes
    nothing, so an editor that writes the whole file back changes only what was edited, even
    when an edit above (agent=) changed what the file shows now."""

    mode = 0o644

    def __init__(self, session: Session, check: Callable[[str, str], None] | None = None):
        self.session = session
        self.check = check  # of a key and its new value, before it is set (a sub-session's bounds)

    async def open(self, mode: OpenMode) -> Handle:
        shown = _cfg_values(self.session)
        act = _reporting(self.session, lambda line: _cfg_set(self.session, line, shown, self.check))
        return CtlHandle(act, lambda: _cfg_text(self.session))


CTL_OWN = "kill, rn <name>, save [name]"  # what only the file interface has


async def _ctl(session: Session, sessions: Sessions, line: str) -> str | None:
    """A line written to `ctl`: a session command (`commands`), or kill, rn, save."""

    core = await session.wake()  # awake, so that a refusal lands in its chat too
    verb, _, arg = line.partition(" ")
    arg = arg.strip()
    match verb:
        case "kill":
            if arg:  # `kill <id>` is the root ctl's: here it would end this session, not that one
                raise FsError(
                    E.EINVAL, f"kill takes no id here (it ends this session); write `kill {arg}` to the root ctl"
                )
            await sessions.kill(session.id)
            return None
        case "rn" | "rename":
            await sessions.rename(session.id, arg)
            return None
        case "save":
            return _save_transcript(session, arg)
        case "cwd" if arg:
            check_cwd(arg)
    if verb not in commands.COMMANDS:
        raise FsError(E.EINVAL, f"unknown command {verb[:40]!r}; commands: {_ctl_help()}")
    return await commands.run_noted(core, verb, arg)


def _ctl_help() -> str:
    return f"{', '.join(commands.names())}, {CTL_OWN}"


def _save_transcript(session: Session, name: str) -> str:
    """ctl `save [name]`: copy the chat to tr/<name or id>."""
    target = config.data_path() / "transcripts" / check_name(name or session.id)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(session.chat_path.read_bytes())
    return f"saved tr/{target.name}"


CFG_COMMANDS = ("backend", "model", "agent", "cwd")  # keys that are commands of their own; the rest: `set`


def _cfg_values(session: Session) -> dict[str, str]:
    """What `cfg` shows, in the form a write takes back (lists comma-separated, objects as JSON)."""
    settings = session.settings()
    values = {"state": session.state, **{k: settings[k] for k in ("backend", "model", "agent", "cwd")}}
    for key in GENERATION_PARAM_TYPES:
        values[key] = _param_text(getattr(settings["params"], key))
    return values


def _param_text(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(v)
    return json.dumps(v) if isinstance(v, dict) else str(v)


def _cfg_text(session: Session) -> str:
    return "".join(f"{k}={v}\n" for k, v in _cfg_values(session).items())


async def _cfg_set(
    session: Session, line: str, shown: dict[str, str], check: Callable[[str, str], None] | None = None
) -> None:
    """One `key=value` line, the value being the rest of the line (so an object in JSON fits),
    run as the session command of that setting. A value equal to what cfg shows, or showed when it
    was opened, changes nothing: an editor writes the whole file back."""

    core = await session.wake()
    key, sep, value = line.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise FsError(E.EINVAL, f"expected key=value, got {line!r}")
    current = _cfg_values(session)
    if key not in current:
        raise FsError(E.EINVAL, f"unknown key {key!r}; keys: {', '.join(k for k in current if k != 'state')}")
    if value in (current[key], shown.get(key)):
        return
    if key == "state":
        raise FsError(E.EINVAL, "state is read-only")
    if key == "cwd":
        check_cwd(value)
    if check is not None:
        check(key, value)
    if key in CFG_COMMANDS:
        if not value:  # the command would only show the setting: an empty write must not pass silently
            raise FsError(E.EINVAL, f"{key}= needs a value")
        await commands.run(core, key, value)
    else:
        await commands.run(core, "set", f"{key} {value}")


async def _env_set(session: Session, line: str) -> None:
    key, sep, value = line.partition("=")
    (await session.wake()).session.set_env(key.strip(), value if sep else None)


def _env_text(session: Session) -> str:
    return "".join(f"{k}={v}\n" for k, v in session.env().items())


# ---- the other files --------------------------------------------------------------------------------


def _line(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


def _mcp_text(servers: dict[str, list[Tool]]) -> str:
    out = []
    for name, tools in servers.items():
        out.append(f"{name}\n")
        out.extend(f"\t{t.name}\t{(t.description or '').splitlines()[0] if t.description else ''}\n" for t in tools)
    return "".join(out)


def _context_jsonl(session: Session) -> str:
    return "".join(json.dumps(m.to_dict(), ensure_ascii=False) + "\n" for m in session.messages())


async def _set_plan(session: Session, text: str) -> None:
    (await session.wake()).session.set_plan(text)


def _children_usage(session: Session) -> str:
    """The `usage` file's line for what ended sub-agents used, when there were any."""
    c = session.meta.children
    if not c:
        return ""
    return (
        f"subagents: {int(c.get('input_tokens', 0))} in, {int(c.get('output_tokens', 0))} out, "
        f"{int(c.get('requests', 0))} requests ({int(c.get('agents', 0))} sub-agents)\n"
    )


def _children_cost(session: Session) -> str:
    """The `cost` file's lines for what ended sub-agents spent, and the total with them."""
    c = session.meta.children
    if not c:
        return ""
    spent = c.get("cost", 0.0)
    return f"costSubagents=${spent:.6f}\ncostTotal=${session.cost().session + spent:.6f}\n"


SessionFileMaker = Callable[[Session, Sessions], File]


def _text(get: Callable[[Session], str], sized: bool = True) -> SessionFileMaker:
    """A file of text the session has at hand, awake or not."""

    def make(s: Session, _: Sessions) -> File:
        return TextFile(lambda: get(s), text_size(lambda: get(s)) if sized else None)

    return make


def _core_text(get: Callable[[Core], str | Awaitable[str]]) -> SessionFileMaker:
    """A file of text only the Core has: reading it wakes the session."""

    def make(s: Session, _: Sessions) -> File:
        async def read() -> str:
            v = get(await s.wake())
            return v if isinstance(v, str) else await v

        return TextFile(read)

    return make


async def _pop(core: Core) -> str:
    return _line(core.pop_queue() or "")


async def _models(core: Core) -> str:
    return "".join(m + "\n" for m in await core.models())


async def _mcp(core: Core) -> str:
    return _mcp_text(await core.list_servers())


def _checkpoints(s: Session, _: Sessions) -> File:
    """The session's checkpoints, from what is stored: reading them wakes no session."""
    return TextFile(lambda: s.checkpoints().listing())


def _worktree(s: Session, sessions: Sessions) -> File:
    """`worktree` of a session made with worktree=1: reading it commits what the session left in
    its worktree onto its branch (git in its parent's sandbox, as worktrees.finish does), then gives
    the branch, path, base and diffstat; refused while a turn runs (its work is half done)."""

    async def read() -> str:
        trees = worktrees.of_owner("session", s.id)
        if not trees:
            raise FsError(E.ENOENT, f"session {s.id} has no worktree (it was made without worktree=1)")
        if s.state != "idle":
            raise FsError(E.EBUSY, f"session {s.id} is {s.state}: read its worktree once it is idle")
        parent = sessions.find(s.meta.parent) if s.meta.parent else None
        tree = await worktrees.finish(trees[0], parent)
        return tree.section().replace(f"rm -r b/{tree.owner}", f"kill {s.id}")

    return TextFile(read)


SESSION_FILES: dict[str, SessionFileMaker] = {
    "prompt": lambda s, _: OnCloseFile(lambda: "", s.submit, PROMPT_MAX, mode=0o622),
    "chat": lambda s, _: ChatFile(lambda: s.chat_path, looked=s.looked),
    "state": _text(lambda s: s.state + "\n"),
    "reply": _text(lambda s: s.reply),
    "ctl": lambda s, ss: _checked(s, lambda line: _ctl(s, ss, line), get=lambda: _ctl_help() + "\n"),
    "cfg": lambda s, _: CfgFile(s),
    "fifo.in": lambda s, _: OnCloseFile(lambda: "", s.enqueue, PROMPT_MAX, mode=0o622),
    "usage": _text(lambda s: usage_text(s.usage()) + "\n" + _children_usage(s), sized=False),
    "cost": _text(lambda s: cost_text(s.cost(), s.meta.model) + "\n" + _children_cost(s), sized=False),
    "ctxsz": _text(lambda s: context_text(s.context_size()) + "\n", sized=False),
    "systemprompt": _text(lambda s: _line(s.system_prompt()), sized=False),
    "env": lambda s, _: _checked(s, lambda line: _env_set(s, line), get=lambda: _env_text(s)),
    "context": _text(_context_jsonl, sized=False),
    "offset": _text(lambda s: f"{s.prompt_offset()}\n", sized=False),
    "plan": lambda s, _: OnCloseFile(
        lambda: s.plan, lambda text: _set_plan(s, text), PLAN_MAX, text_size(lambda: s.plan)
    ),
    "prompt.prev": _text(lambda s: s.last_prompt),
    "checkpoints": _checkpoints,
}

# Files whose reading does something: found by name, never listed (see the module's doc).
ACTIVE_FILES: dict[str, SessionFileMaker] = {
    "statewait": lambda s, _: StateWaitFile(s),
    "idlewait": lambda s, _: IdleWaitFile(s),
    "fifo.out": _core_text(_pop),
    "models": _core_text(_models),
    "mcp": _core_text(_mcp),
    "worktree": _worktree,
}
