"""A session's own view of ollie's files: what its sandboxed code finds at $OLLIE.

Each jail of a session's execute server mounts a FUSE file system at $OLLIE in its own mount
namespace and hands its /dev/fuse descriptor to the server, which serves on it a tree built for
that one session (`serve`). Which session asks is known by the connection, never from a caller's
pid: nothing else reaches that mount, and it dies with its jail.

See HELP for the tree.

Nothing else has a node: other sessions, a/ (agent configs carry hooks, which run unsandboxed),
u/, tr/, tmp/ and the user's own b/ scripts answer ENOENT. Symlinks in the directories are never followed
(code may plant them where it can write, and the server reads unconfined).
"""

from __future__ import annotations

import asyncio
import contextvars
import errno as E
import os
from pathlib import Path

from .. import config
from ..agent import commands
from ..tools.scripts import index_text
from ..types import Event
from ..vfs.fuse import serve_connection
from ..vfs.namespace import Dir, File, FsError, Handle, Namespace, OpenMode, Stat, StaticDir
from ..vfs.stores import HELD, DiskDir, OnCloseFile, TextFile, text_size
from .job_files import JobsDir
from .jobs import Jobs, tree_held
from .session_files import (
    ACTIVE_FILES,
    PROMPT_MAX,
    SESSION_FILES,
    CfgFile,
    NewFile,
    _checked,
    _ctl,
    _ctl_help,
    root_ctl,
)
from .sessions import Session, Sessions, check_child_agent, check_child_backend, check_child_cwd, child_name
from .tree import scripts_of, skills_index

THOUGHT_MAX = 64 << 10
HELP = """ollie: this session's view of the files ($OLLIE)

    ctl           `new [agent=A] [cwd=DIR] [backend=B] [model=M] [name=N] [worktree=1]` starts a
                  sub-session (read the same open file back for its id; worktree=1: in a git worktree
                  of its own, on a branch ollie/<id>); `kill <id>` ends one of them
    help          this text
    s/<own id>/   the session itself, read only (no `prompt` or `fifo.in`), but for `plan` (read
                  and write) and `think` (write: records a thought in its chat)
    s/new         the same: write k=v lines, one per key
    b/            its batch jobs: b/new (a spec: cat it; worktree=1: each in a git worktree of its
                  own), b/<id>/status result log worktree …, rm -r cancels (and drops the worktree);
                  b/q, b/sched, b/job: scripts to run with sh
    s/<sub id>/   its sub-sessions, and theirs: prompt, chat, reply, state, statewait, ctl, cfg, …
                  bounded: cwd inside the parent's, agent the parent's or one its config lists
                  under "subagents", no rename or save; `rm -r` or `kill` ends one (and its own);
                  worktree (by name): commits a worktree=1 one's work on its branch, names it
    m/ pl/        the memory and the plans, shared by the user's sessions (read and write)
    t/ sk/ p/     tool scripts (t/idx), skills, prompts: read only
"""

# Commands a session's code may give its sub-sessions (through ctl, or /name in prompt). Not
# `agents` or `sessions` (they list beyond the view), nor rn and save (the server's names and tr/),
# nor checkpoints, undo and rewind (ollie writes the cwd for those, unsandboxed: the user's to give).
CHILD_COMMANDS = {
    "stop", "inject", "irw", "queue", "backend", "model", "agent", "cwd", "set", "compact", "clear",
    "history", "help", "context", "cost", "usage", "models", "skills", "tools", "mcp", "sp",
}  # fmt: skip


def serve(sessions: Sessions, jobs: Jobs, session: Session, fd: int) -> None:
    """Serve `session`'s view on the /dev/fuse descriptor `fd` of a jail's mount. What its open files
    hold written counts in the budget of the session's tree (`stores.HELD`), with its jobs' specs:
    the connection's requests run in the context it is made in."""
    context = contextvars.copy_context()
    context.run(HELD.set, tree_held(sessions, session))
    context.run(serve_connection, build(sessions, jobs, session), fd, session.id)


def build(sessions: Sessions, jobs: Jobs, session: Session) -> Namespace:
    cfg, data = config.cfg_path(), config.data_path()
    tools = config.tools_path()[0]
    return Namespace(
        StaticDir(
            {
                "ctl": root_ctl(ChildMaker(sessions, session)),
                "help": TextFile(lambda: HELP, text_size(lambda: HELP)),
                "s": ViewSessionsDir(sessions, session),
                "b": JobsDir(jobs, scripts_of("b"), owner=session),
                "m": DiskDir(data / "memory", shared=True),
                "pl": DiskDir(data / "plans", shared=True),
                "t": _tools_dir(tools, TextFile(lambda: index_text(config.tools_path()))),
                "sk": DiskDir(
                    config.skills_path()[0],
                    writable=False,
                    shared=True,
                    nested=True,
                    synthetic={"idx": TextFile(lambda: asyncio.to_thread(skills_index, session.settings()["cwd"]))},
                ),
                "p": DiskDir(cfg / "prompts", writable=False, shared=True),
            }
        )
    )


def _tools_dir(tools: Path, index: File) -> Dir:
    """t/: the first tool directory, read-only, if it lies in ollie's configuration (hidden from the
    sandbox, whose directories cannot be renamed in a jail); one elsewhere (a project's, in a cwd
    the code writes) could be swapped for a link to anywhere, which the server would serve. The
    code reads such a directory where it is anyway. t/idx is always there."""
    real, cfg = os.path.realpath(tools), os.path.realpath(config.cfg_path())
    if real.startswith(cfg.rstrip("/") + "/"):
        return DiskDir(Path(real), writable=False, shared=True, synthetic={"idx": index})
    return StaticDir({"idx": index})


class ViewSessionsDir(Dir):
    """s/ of a view: the session itself and its sub-sessions; any other id is ENOENT."""

    mode = 0o755

    def __init__(self, sessions: Sessions, owner: Session):
        self.sessions = sessions
        self.owner = owner

    def lookup(self, name: str) -> File | Dir:
        if name == "new":
            return NewFile(ChildMaker(self.sessions, self.owner))
        session = self._mine(name)
        if session is self.owner:
            return OwnSessionDir(session, self.sessions)
        return ChildSessionDir(session, self.sessions)

    def _mine(self, name: str) -> Session:
        session = _named(self.sessions, self.owner, name)
        if session is None or not (session is self.owner or self.sessions.descends(session, self.owner)):
            raise FsError(E.ENOENT, f"{name}: no such session in this view")
        return session

    async def list(self) -> list[tuple[str, File | Dir]]:
        mine = [s for s in self.sessions.listed() if s is self.owner or self.sessions.descends(s, self.owner)]
        return [(s.id, self.lookup(s.id)) for s in mine]

    async def mkdir(self, name: str, mode: int) -> None:
        raise FsError(E.EACCES, "make a sub-session by writing s/new")

    async def remove(self, name: str) -> None:
        session = self._mine(name)
        if session is self.owner:
            raise FsError(E.EACCES, "a session cannot end itself from its own code")
        await self.sessions.kill(session.id)

    async def rename(self, old: str, new: str) -> None:
        raise FsError(E.EACCES, "sessions are renamed outside the sandbox")


def _named(sessions: Sessions, owner: Session, name: str) -> Session | None:
    """The session `name` is in `owner`'s view: by its id, or a sub-session's name without its
    owner's id in front (`review` for `<owner>.review`)."""
    return sessions.find(name) or sessions.find(child_name(owner, name))


class ChildMaker:
    """The view's ctl and s/new: make and end sub-sessions of its owner, bounded by it. A refusal
    fails the write with its errno, and its reason goes to the owner's chat (a shell shows only
    the errno's words)."""

    def __init__(self, sessions: Sessions, owner: Session):
        self.sessions = sessions
        self.owner = owner

    def check_spec(self, spec: dict[str, str]) -> None:
        try:
            checked = self.sessions.check_child(self.owner, spec)  # first: nothing outside its bounds is looked at
            self.sessions.check_spec(checked, cwd_here=False)  # its cwd proved a directory, by descriptor
        except FsError as e:
            self.owner.error(f"sub-session refused: {e}")
            raise

    async def new(self, spec: dict[str, str]) -> Session:
        try:
            return await self.sessions.new(spec, parent=self.owner)
        except FsError as e:
            self.owner.error(f"sub-session refused: {e}")
            raise

    async def kill(self, sid: str) -> None:
        """End a sub-session, by its id or its name (`review` for `<owner>.review`, as s/ finds it)."""
        session = _named(self.sessions, self.owner, sid)
        if session is None or not self.sessions.descends(session, self.owner):
            raise FsError(E.ENOENT, f"no session {sid!r} in this view")
        await self.sessions.kill(session.id)


class ReadOnly(File):
    """A session file that the view shows but does not let be written."""

    def __init__(self, inner: File):
        self.inner = inner
        self.mode = inner.mode & 0o444

    def stat(self, name: str) -> Stat:
        st = self.inner.stat(name)
        st.mode &= 0o444
        return st

    async def open(self, mode: OpenMode) -> Handle:
        if mode & (OpenMode.WRITE | OpenMode.TRUNC):
            raise FsError(E.EACCES, "read-only in this view")
        return await self.inner.open(mode)

    async def truncate(self, size: int) -> None:
        raise FsError(E.EACCES, "read-only in this view")


async def _think(session: Session, text: str) -> None:
    if text.strip():
        (await session.wake()).emit(Event("info", f"thought: {text.strip()}"))


class OwnSessionDir(Dir):
    """The session's own directory in its view: read only but for `plan` and `think`."""

    mode = 0o555
    WRITABLE = ("plan",)
    HIDDEN = ("prompt", "fifo.in")  # write-only files: nothing to read, nothing to write here

    def __init__(self, session: Session, sessions: Sessions):
        self.session = session
        self.sessions = sessions

    def lookup(self, name: str) -> File | Dir:
        if name == "think":
            return OnCloseFile(lambda: "", lambda text: _think(self.session, text), THOUGHT_MAX, mode=0o222)
        if name == "statewait":
            return ACTIVE_FILES[name](self.session, self.sessions)
        make = SESSION_FILES.get(name)
        if make is None or name in self.HIDDEN:
            raise FsError(E.ENOENT, f"{name}: no such file in this view of the session")
        file = make(self.session, self.sessions)
        return file if name in self.WRITABLE else ReadOnly(file)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(name, self.lookup(name)) for name in SESSION_FILES if name not in self.HIDDEN]


class ChildSessionDir(Dir):
    """A sub-session's directory in its ancestor's view: driven like any session, within bounds."""

    mode = 0o755

    def __init__(self, session: Session, sessions: Sessions):
        self.session = session
        self.sessions = sessions

    def _parent(self) -> Session:
        return self.sessions.get(self.session.meta.parent)

    def check(self, verb: str, arg: str) -> None:
        """A command for the sub-session, refused (EACCES) beyond what the view allows."""
        cmd = commands.COMMANDS.get(verb)
        if cmd is None or cmd.name not in CHILD_COMMANDS:
            allowed = ", ".join(sorted(CHILD_COMMANDS))
            raise FsError(E.EACCES, f"{verb!r} is not for sub-sessions; they take: {allowed}, kill")
        settings = self.session.settings()
        if cmd.name == "cwd" and arg:
            check_child_cwd(self._parent(), arg)
        elif cmd.name == "agent" and arg:
            check_child_agent(self._parent(), arg)
        elif cmd.name == "backend" and arg:
            backend, _, model = arg.partition(" ")
            check_child_backend(self._parent(), settings["agent"], backend, model.strip(), switch=True)
        elif cmd.name == "model" and arg:
            check_child_backend(self._parent(), settings["agent"], "", arg)

    async def _ctl(self, line: str) -> str | None:
        verb, _, arg = line.strip().partition(" ")
        if verb != "kill":
            self.check(verb, arg.strip())
        return await _ctl(self.session, self.sessions, line)

    async def _submit(self, text: str) -> None:
        line = text.strip()
        if line.startswith("/"):
            name, _, arg = line[1:].partition(" ")
            if name in commands.COMMANDS:
                self.check(name, arg.strip())
        await self.session.submit(text)

    def _check_setting(self, key: str, value: str) -> None:
        if key in ("cwd", "agent", "backend", "model"):
            self.check(key, value)

    def lookup(self, name: str) -> File | Dir:
        s = self.session
        match name:
            case "prompt":
                return OnCloseFile(lambda: "", self._submit, PROMPT_MAX, mode=0o622)
            case "ctl":
                return _checked(s, self._ctl, get=lambda: _ctl_help() + "\n")
            case "cfg":
                return CfgFile(s, self._check_setting)
            case "env":
                return ReadOnly(SESSION_FILES[name](s, self.sessions))
        make = SESSION_FILES.get(name) or ACTIVE_FILES.get(name)
        if make is None:
            raise FsError(E.ENOENT, f"{name}: no such file in a session directory")
        return make(s, self.sessions)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(name, self.lookup(name)) for name in SESSION_FILES]

    async def remove(self, name: str) -> None:
        """As in s/<id>/: removing a file does nothing, so that `rm -r` reaches the rmdir."""
