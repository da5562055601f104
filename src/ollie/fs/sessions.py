"""The file server's sessions: each one asleep (its metadata) until a file needs its Core.

Sessions stored on disk come back when the server starts, asleep: their metadata is in memory,
their chat is read from disk, and nothing else is built until a file that needs the Core is
opened (prompt, ctl, cfg, …), so listing and reading chat never touch a backend. What a session
shows is read from its Core or from what is stored (`reading`); the files that show it are in
`session_files`.

Ids are `<unix-ns>-<6 hex>`, so sorting by name is creation order. A session you named (a rename,
`name=`) would sort by its name (letters after digits: after every unnamed session), so `s/` does
not list it (see session_files).
"""

from __future__ import annotations

import asyncio
import errno as E
import logging
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import backends, config, sandbox
from ..agent import commands
from ..agent.opening import open_session
from ..agent.session import SessionMeta, check_session_id, list_stored, new_session_id, sessions_dir
from ..types import (
    Busy,
    ConfigError,
    ContextSize,
    Cost,
    Event,
    InvalidValue,
    Message,
    NotFound,
    OllieError,
    Usage,
)
from ..vfs.namespace import FsError
from . import transcripts, worktrees
from .reading import Asleep, Awake, SessionReading

if TYPE_CHECKING:
    from ..agent import Core
    from ..agent.checkpoints import Checkpoints

log = logging.getLogger("ollie.fs")

NEW_KEYS = ("agent", "cwd", "backend", "model", "name", "worktree")
FIXED = ("new", "idx", "sh", "ls", "kill")  # the fixed files of s/: no session may take their names
# An id the server made (`<unix-ns>-<6 hex>`), or a sub-session's name after its parent's id
# (`<parent id>.<name>`): what sorts by creation, and so is listed in s/. A name never looks like one.
MADE_ID = re.compile(r"[0-9]+-[0-9a-f]{6}(\..+)?")


def errno_of(e: Exception) -> int:
    """The errno a file operation fails with for one of ollie's errors (the chat has the message:
    a shell shows only the errno's words, and "No such file" would mislead about a model name)."""
    if isinstance(e, FsError):
        return e.errno
    if isinstance(e, Busy):
        return E.EBUSY
    if isinstance(e, (InvalidValue, NotFound, ConfigError)):
        return E.EINVAL
    return E.EIO


# Serves a session's own view of the files on a jail's /dev/fuse descriptor (see view.py).
ViewServer = Callable[["Session", int], None]

# Sub-sessions, which a session's sandboxed code starts through its view: bounded, so that code
# cannot start sessions without end.
CHILDREN_MAX = 16  # live sub-sessions of one session
DEPTH_DEFAULT = 3  # sub-sessions (and jobs) of sub-sessions, at most this deep: OLLIE_SUBAGENT_DEPTH
TREE_MAX = 64  # sessions under one top-level session


def depth_max() -> int:
    raw = os.environ.get("OLLIE_SUBAGENT_DEPTH", str(DEPTH_DEFAULT))
    if not raw.isdigit():
        raise FsError(E.EINVAL, f"OLLIE_SUBAGENT_DEPTH={raw!r}: give how deep sub-agents may nest, a whole number")
    return int(raw)


class Session:
    """One session as the server holds it: asleep (its metadata) until a file needs its Core. What
    the files read of it is answered by its reading (reading.py): `Asleep`, then `Awake`."""

    def __init__(
        self,
        meta: SessionMeta,
        core: Core | None = None,
        view: ViewServer | None = None,
        job: bool = False,
    ):
        self._reading: SessionReading = Asleep(meta)
        self.core: Core | None = None
        self.view = view
        self.job = job  # a batch job's session: shown in b/, not s/
        self.on_interrupt: Callable[[str], None] | None = None  # told the id when a turn is interrupted
        # Told this session and each of its events (the web page's feed); Sessions shares its list.
        self.on_event: list[Callable[[Session, Event | None], None]] = []
        self._waking: asyncio.Future[Core] | None = None
        self.prompt_prev = ""  # the last prompt written to this session since the server started
        if core is not None:
            self._attach(core)

    @property
    def meta(self) -> SessionMeta:
        return self._reading.meta

    @property
    def id(self) -> str:
        return self._reading.id

    @property
    def created(self) -> float:
        return self.meta.created

    @property
    def chat_path(self) -> Path:
        return self._reading.chat_path

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
        view = self.view
        try:
            core = await open_session(
                session_id=self.meta.id, view=(lambda fd: view(self, fd)) if view is not None else None
            )
        except OllieError as e:
            raise FsError(E.EIO, f"session {self.meta.id}: cannot restore: {e}") from None
        self._attach(core)
        return core

    def _attach(self, core: Core) -> None:
        self.core = core
        self._reading = Awake(core)
        core.subscribe(self._watch, follows=False)

    def looked(self) -> None:
        """A reader looked at the chat log (a file handle, a page): its text streams as it comes."""
        if self.core is not None:
            self.core.looked()

    def _watch(self, ev: Event) -> None:
        if ev.data and ev.data.get("interrupted") and self.on_interrupt is not None:
            self.on_interrupt(self.id)
        for listener in self.on_event:
            listener(self, ev)

    # ---- what the files show (awake or asleep: see reading.py) --------------------------------------
    @property
    def state(self) -> str:
        return self._reading.state

    @property
    def reply(self) -> str:
        return self._reading.reply

    @property
    def last_prompt(self) -> str:
        return self.prompt_prev or self._reading.last_prompt

    @property
    def plan(self) -> str:
        return self._reading.plan

    def usage(self) -> Usage:
        return self._reading.usage()

    def cost(self) -> Cost:
        return self._reading.cost()

    def context_size(self) -> ContextSize:
        return self._reading.context_size()

    def system_prompt(self) -> str:
        return self._reading.system_prompt()

    def env(self) -> dict[str, str]:
        return self._reading.env()

    def messages(self) -> list[Message]:
        return self._reading.messages()

    def settings(self) -> dict[str, Any]:
        """backend, model, agent, cwd and the generation parameters (a GenerationParams)."""
        return self._reading.settings()

    def prompt_offset(self) -> int:
        """Where the last prompt starts in the chat log."""
        return self._reading.prompt_offset()

    def checkpoints(self) -> Checkpoints:
        """What each turn changed (`rewind` is the Core's): reading them wakes nothing."""
        return self._reading.checkpoints()

    # ---- what writes do ---------------------------------------------------------------------------
    async def submit(self, text: str) -> None:
        """A line written to `prompt`: a prompt starts a turn or queues behind one; a command runs,
        and the write returns once it ran (`reply` then holds what it said)."""

        core = await self.wake()
        if not text.strip():  # a pipeline's empty input: its reader must not take the last answer for this one
            core.answered("")
            self.error("an empty prompt: nothing was sent")
            raise FsError(E.EINVAL, "an empty prompt: nothing was sent")
        self.prompt_prev = text.strip()  # as the prompt is stored
        running = commands.start(core, text)
        if commands.is_command(text):
            await asyncio.shield(running)  # a write interrupted leaves the command to end
        else:
            running.add_done_callback(self._submitted)

    def _submitted(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("session %s: submit failed: %s", self.id, task.exception())

    async def enqueue(self, text: str) -> None:
        """`fifo.in`: queue the prompt (`Core.queue` starts it when the session is idle)."""
        core = await self.wake()
        core.queue(text)  # stripped there, as `prompt` is: the newline echo adds is not part of it

    def set_parent(self, parent_id: str) -> None:
        """The session whose code started this one (its new id, after a rename), saved."""
        self.meta.set_parent(parent_id)
        self.save_meta()

    def save_meta(self) -> None:
        """Save the metadata (through the Core, if awake)."""
        self._reading.save_meta()

    def error(self, message: str) -> None:
        """Put `error: message` into the chat (a control write that failed)."""
        if self.core is not None:
            self.core.emit(Event("error", message))

    async def close(self) -> None:
        if self._waking is not None and not self._waking.done():
            await asyncio.gather(self._waking, return_exceptions=True)
        if self.core is not None:
            await self.core.close()


class Sessions:
    """Every session of this server, in creation order."""

    def __init__(self, default_cwd: str | None = None, view: ViewServer | None = None):
        self._by_id: dict[str, Session] = {}
        self.default_cwd = default_cwd or os.getcwd()
        self._lock = asyncio.Lock()  # creation, kill and rename, one at a time
        self.view = view
        # Told the id of a session that ended, or whose turn was interrupted: its jobs stop.
        self.on_end: list[Callable[[str], None]] = []
        # Told a session's old id and its new one when it is renamed: its jobs stay its own.
        self.on_rename: list[Callable[[str, str], None]] = []
        # Whether an id is a batch job's (Jobs says): sessions and jobs share one space of ids.
        self.reserved: Callable[[str], bool] = lambda sid: False
        # Your own scripts of s/ (SessionsDir says), whose names no session may take, as FIXED.
        self.scripts: set[str] = set()
        # Told each event of every session, and (session, None) when one is added or ended.
        self.on_event: list[Callable[[Session, Event | None], None]] = []

    def restore(self) -> int:
        """Register every stored session, asleep. Returns how many."""
        for meta in list_stored():
            self._register(Session(meta, view=self.view))
        return len(self._by_id)

    def _register(self, session: Session) -> Session:
        if self._by_id.setdefault(session.id, session) is not session:
            raise FsError(E.EEXIST, f"session {session.id!r} already exists")
        session.on_interrupt = self._ended
        session.on_event = self.on_event
        self._told(session)
        return session

    def _told(self, session: Session) -> None:
        for listener in self.on_event:
            listener(session, None)

    def _ended(self, sid: str) -> None:
        """`sid` ended or was interrupted: so are its sub-sessions' turns, and its jobs."""
        for listener in self.on_end:
            listener(sid)
        for child in self.children(sid):
            if child.core is not None and not child.job:
                child.core.interrupt()  # which tells us in turn, for its own children

    def get(self, sid: str) -> Session:
        try:
            return self._by_id[sid]
        except KeyError:
            raise FsError(E.ENOENT, f"no session {sid!r}") from None

    def find(self, sid: str) -> Session | None:
        return self._by_id.get(sid)

    def all(self) -> list[Session]:
        """Every session, batch jobs' included, in creation order."""
        return sorted(self._by_id.values(), key=lambda s: (s.created, s.id))

    def listed(self) -> list[Session]:
        """The sessions s/ shows: not batch jobs (b/ shows those)."""
        return [s for s in self.all() if not s.job]

    def check_name(self, name: str) -> str:
        if name in FIXED or name in self.scripts:
            raise FsError(E.EINVAL, f"{name!r} is a fixed file of s/; choose another name")
        if MADE_ID.fullmatch(name) and "." not in name:  # (listed among the made ones, out of their order)
            raise FsError(E.EINVAL, f"{name!r} looks like an id the server makes; choose another name")
        try:
            check_session_id(name)
        except InvalidValue as e:
            raise FsError(E.EINVAL, str(e)) from None
        if name in self._by_id or self.reserved(name):
            raise FsError(E.EEXIST, f"session {name!r} already exists")
        return name

    def check_spec(self, spec: dict[str, str], cwd_here: bool = True) -> None:
        """What can be known wrong in a new session's spec before making it: the writer of `s/new`
        hears of it at its write (the session is made at close, whose error shells ignore). Not
        `cwd_here`: the cwd is another machine's (a Ray worker's), which checks it itself, or a
        sub-agent's, checked by descriptor (never looked up again by a path its parent's code could
        lead through a link: into the server's own mount, say)."""

        if unknown := sorted(set(spec) - set(NEW_KEYS)):
            raise FsError(E.EINVAL, f"unknown key {unknown[0]!r}; keys: {', '.join(NEW_KEYS)}")
        if spec.get("name"):
            self.check_name(spec["name"])
        if spec.get("cwd"):
            self._check_cwd(spec, cwd_here)
        if worktrees.wanted(spec.get("worktree", "")):
            if spec.get("name"):
                worktrees.check_id(spec["name"])
            if cwd_here:  # a sub-session's repository is checked against its parent's cwd (check_child)
                worktrees.repository_root(os.path.realpath(self.cwd_of(spec)), None)
        if spec.get("backend") and spec["backend"] not in backends.names():
            known = ", ".join(backends.names())
            raise FsError(E.EINVAL, f"unknown backend {spec['backend']!r}; backends: {known}")
        if spec.get("agent"):
            try:
                config.load_agent(spec["agent"])
            except ConfigError as e:
                raise FsError(E.EINVAL, str(e)) from None

    def _check_cwd(self, spec: dict[str, str], here: bool) -> None:
        """An absolute cwd off ollie's mount, by its name; `here`, also where its links lead, and
        a directory."""
        check_cwd(spec["cwd"])
        if mount := config.ollie_mount_of(os.path.expanduser(spec["cwd"])):
            raise FsError(E.EINVAL, f"cwd {spec['cwd']!r} is on ollie's file server's mount {mount}: work elsewhere")
        if not here:
            return
        real = os.path.realpath(self.cwd_of(spec))
        if mount := config.ollie_mount_of(real):  # a link led there
            raise FsError(E.EINVAL, f"cwd {spec['cwd']!r} leads to {real}, on ollie's file server's mount {mount}")
        if own := config.own_dir_of(real):
            raise FsError(
                E.EINVAL, f"cwd {spec['cwd']!r} lies in ollie's own directory {own}, which sandboxed code never sees"
            )
        if not os.path.isdir(real):
            raise FsError(E.ENOENT, f"cwd {self.cwd_of(spec)!r} is not a directory")

    def cwd_of(self, spec: dict[str, str]) -> str:
        return os.path.expanduser(spec["cwd"]) if spec.get("cwd") else self.default_cwd

    async def new(
        self,
        spec: dict[str, str],
        parent: Session | None = None,
        job_id: str = "",
        store_root: Path | None = None,
    ) -> Session:
        """Create a session: keys agent, cwd, backend, model, name (empty values mean default).
        A sub-session of `parent` (started by its code) gets no more than `parent` has: see
        `check_child`; its cwd and agent default to the parent's. A batch job's session has the
        job's id and is stored under `store_root`. Once begun it is made whole (a reader of ctl
        interrupted meanwhile cannot leave a Core half made)."""
        return await asyncio.shield(self._new(spec, parent, job_id, store_root))

    async def _new(self, spec: dict[str, str], parent: Session | None, job_id: str, store_root: Path | None) -> Session:
        try:  # a key or backend set since the server started (`ollie keys set`) counts from now on
            config.load_env_file()
        except ConfigError as e:
            raise FsError(E.EINVAL, str(e)) from None
        async with self._lock:
            if parent is not None:  # first: nothing outside the parent's bounds is looked at
                spec = self.check_child(parent, spec, jobs=bool(job_id))
            self.check_spec(spec, cwd_here=parent is None)  # a child's cwd proved a directory, by descriptor
            if job_id and job_id in self._by_id:
                raise FsError(E.EEXIST, f"session {job_id!r} already exists")
            name = spec.get("name") or ""
            cwd = self.cwd_of(spec)
            session_id, tree = job_id, None
            if worktrees.wanted(spec.get("worktree", "")):  # in a git worktree of its own, made first
                session_id = name or job_id or new_session_id()  # its branch's name: ollie/<id>
                bound = parent.settings()["cwd"] if parent is not None else None
                kind, by = ("job", "") if job_id else ("session", parent.id if parent is not None else "")
                # (in a thread: the parent's code may have swapped a directory on the way for a
                # link, into the mount this loop serves)
                tree = await asyncio.to_thread(
                    lambda: worktrees.plan(session_id, os.path.realpath(cwd), bound, kind, by)
                )
                tree = await worktrees.create(tree, parent)
                cwd = tree.cwd
            opened: list[Session] = []  # the view serves the Session, made once the Core is
            view = self.view
            try:
                core = await open_session(
                    agent=spec.get("agent") or None,
                    cwd=cwd,
                    backend=spec.get("backend") or None,
                    model=spec.get("model") or None,
                    session_id=session_id or None,
                    create=True,
                    store_root=store_root,
                    view=(lambda fd: view(opened[0], fd)) if view is not None else None,
                    cwd_within=parent.settings()["cwd"] if parent is not None else None,
                    tree_cwd=self.top(parent).settings()["cwd"] if parent is not None else None,
                )
            except OllieError as e:
                if tree is not None:
                    await worktrees.remove(tree, parent)
                raise FsError(errno_of(e), str(e)) from None
            if name:
                core.set_session_id(name)
            session = Session(core.session.meta, core, self.view, job=bool(job_id))
            if parent is not None:
                session.set_parent(parent.id)
                core.trace_under(_traced_under(parent))
            opened.append(session)
            try:
                return self._register(session)
            except FsError:
                await core.close()
                raise

    def add_to_parent(self, parent: Session, usage: Usage, cost: float, agents: int = 1) -> None:
        """Count what an ended sub-agent of `parent` spent (with its own sub-agents') in the
        parent's `children`, kept with its metadata."""
        parent.meta.count_children(usage, cost, agents)
        if parent.core is not None or parent.id in self._by_id:  # not an asleep one that went to tr/
            parent.save_meta()

    def roll_up(self, child: Session, among: dict[str, Session] | None = None) -> None:
        """Count what `child` and its own sub-agents spent in its parent's `children`."""
        parent = (among or {}).get(child.meta.parent) or self._by_id.get(child.meta.parent)
        if parent is None:
            return
        mine, theirs = child.usage(), child.meta.children
        usage = Usage(
            input_tokens=mine.input_tokens + int(theirs.get("input_tokens", 0)),
            output_tokens=mine.output_tokens + int(theirs.get("output_tokens", 0)),
            requests=mine.requests + int(theirs.get("requests", 0)),
        )
        cost = child.cost().session + theirs.get("cost", 0.0)
        self.add_to_parent(parent, usage, cost, 1 + int(theirs.get("agents", 0)))

    async def forget(self, session: Session) -> None:
        """A batch job's session is done: end its sub-sessions and jobs as a kill would, count
        what it spent in its parent's, and let it go (its files stay with the job)."""
        await self._end(session)

    # ---- sub-sessions ---------------------------------------------------------------------------
    def children(self, sid: str) -> list[Session]:
        return [s for s in self.all() if s.meta.parent == sid]

    def descends(self, session: Session, ancestor: Session) -> bool:
        """Whether `session` is a sub-session of `ancestor`, or of one of its sub-sessions."""
        seen = {session.id}
        while session.meta.parent and session.meta.parent in self._by_id:
            session = self._by_id[session.meta.parent]
            if session is ancestor:
                return True
            if session.id in seen:  # a loop (hand-edited metadata) leads nowhere
                return False
            seen.add(session.id)
        return False

    def _depth(self, session: Session) -> int:
        depth, seen = 0, {session.id}
        while session.meta.parent in self._by_id and session.meta.parent not in seen:
            session = self._by_id[session.meta.parent]
            seen.add(session.id)
            depth += 1
        return depth

    def top(self, session: Session) -> Session:
        """The top-level session `session` is under (itself, if it has no parent)."""
        seen = {session.id}
        while session.meta.parent in self._by_id and session.meta.parent not in seen:
            session = self._by_id[session.meta.parent]
            seen.add(session.id)
        return session

    def check_child(self, parent: Session, spec: dict[str, str], jobs: bool = False) -> dict[str, str]:
        """The spec of a sub-session (or, `jobs`, a batch job) `parent`'s code asks for, refused
        (EACCES) where it would give more than the parent has, with the parent's cwd and agent
        filled in where not given. Jobs are counted by the jobs' own bound, not here."""
        if self._by_id.get(parent.id) is not parent:
            raise FsError(E.ENOENT, f"session {parent.id} has ended: it starts no sub-agents")
        settings = parent.settings()
        spec = {**spec, "cwd": check_child_cwd(parent, spec.get("cwd") or settings["cwd"])}
        if spec.get("name"):
            spec["name"] = child_name(parent, spec["name"])
        spec["agent"] = check_child_agent(parent, spec.get("agent") or settings["agent"])
        check_child_backend(parent, spec["agent"], spec.get("backend", ""), spec.get("model", ""))
        if worktrees.wanted(spec.get("worktree", "")):  # its repository's root within the parent's cwd
            worktrees.repository_root(spec["cwd"], settings["cwd"])
        if self._depth(parent) + 1 > (limit := depth_max()):
            raise FsError(
                E.EACCES, f"sub-agents nest {limit} deep at most (OLLIE_SUBAGENT_DEPTH); this one would be deeper"
            )
        if jobs:
            return spec
        if len([s for s in self.children(parent.id) if not s.job]) >= CHILDREN_MAX:
            raise FsError(E.EACCES, f"a session has {CHILDREN_MAX} live sub-sessions at most; kill one first")
        top = self.top(parent)
        if sum(1 for s in self.listed() if self.descends(s, top)) >= TREE_MAX:
            raise FsError(E.EACCES, f"{TREE_MAX} sub-sessions under one session at most; kill some first")
        return spec

    async def kill(self, sid: str) -> None:
        """Stop the session and its sub-sessions, and move their files to the transcripts (tr/).
        What each spent is counted in its parent's `children`, up to the session's parent."""
        await self._end(self.get(sid))

    async def _end(self, session: Session) -> None:
        """End `session` and everything under it, the deepest first: their jobs are cancelled,
        their turns stopped, what they spent counted up the tree; sessions of s/ go to tr/. Once
        begun it goes to its end, whoever asked being interrupted meanwhile."""
        await asyncio.shield(self._end_now(session))

    async def _end_now(self, session: Session) -> None:
        async with self._lock:
            doomed = [session] + [s for s in self.all() if self.descends(s, session)]  # creation order
            for s in doomed:
                if self._by_id.get(s.id) is s:
                    del self._by_id[s.id]
        for s in doomed:
            self._told(s)
        among = {s.id: s for s in doomed}
        for s in reversed(doomed):  # the deepest first: nothing is left to start more
            self._ended(s.id)
            if s.job and s is not session:
                continue  # its job was cancelled just now (its parent ended): the job ends it
            await s.close()
            self.roll_up(s, among)
            if not s.job:  # a sub-session's worktree and branch go with it (a job's with the job)
                for tree in worktrees.of_owner("session", s.id):
                    await worktrees.remove(tree, self._by_id.get(s.meta.parent))
            if not s.job:  # a job's files stay with the job
                if s.core is None:  # asleep: what its children spent is saved here, to go to tr/
                    s.save_meta()
                transcripts.keep(sessions_dir() / s.id)

    async def rename(self, old: str, new: str) -> None:
        async with self._lock:
            session = self.get(old)
            self.check_name(new)
            core = await session.wake()
            try:
                core.set_session_id(new)
            except (OllieError, OSError) as e:
                code = errno_of(e) if isinstance(e, OllieError) else E.EINVAL
                raise FsError(code, f"{e}" + ("; echo stop > ctl first" if isinstance(e, Busy) else "")) from None
            self._by_id = {(new if k == old else k): v for k, v in self._by_id.items()}
            for child in self.children(old):  # they stay its sub-sessions
                child.set_parent(new)
            for listener in self.on_rename:
                listener(old, new)
            worktrees.renamed(old, new)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._by_id.values()), return_exceptions=True)

    def index(self) -> str:
        lines = []
        for s in self.listed():
            m = s.meta
            lines.append(f"{s.id}\t{s.state}\t{m.cwd}\t{m.backend}\t{m.model}\n")
        return "".join(lines)


def _traced_under(parent: Session) -> Callable[[], object | None]:
    """What a sub-agent's or batch job's turns are children of in a trace: the parent's tool call
    running when the turn starts (its code prompts the child), else the one that started it."""
    started = parent.core.trace_context() if parent.core is not None else None
    return lambda: (parent.core.trace_context() if parent.core is not None else None) or started


def child_name(parent: Session, name: str) -> str:
    """The id a name a session's code asks for becomes: `<parent id>.<name>`, so that it can never
    take a name the user's own scripts make or wait for (its view finds it by `name` too)."""
    prefix = f"{parent.id}."
    return name if name.startswith(prefix) else prefix + name


def check_child_cwd(parent: Session, cwd: str) -> str:
    """`cwd`'s real path, if it is the parent's working directory or inside it, reached without a
    symlink, and none of ollie's hidden directories (EACCES if not, naming why). The sub-session
    is then made, or moved, with `cwd_within` the parent's cwd: its own resolution is the one kept."""
    check_cwd(cwd)
    try:
        return sandbox.directory_within(cwd, parent.settings()["cwd"])
    except sandbox.SandboxError as e:
        raise FsError(E.EACCES, f"session {parent.id}'s sub-agent: cwd {e}") from None


def check_child_agent(parent: Session, agent: str) -> str:
    """`agent`, if it is the parent's or one the parent's agent config lists under "subagents",
    and runs nothing outside the sandbox (the child's cwd is one the parent's code could fill)."""
    settings = parent.settings()
    allowed = [settings["agent"]]
    if parent.core is not None:
        allowed += parent.core.agent.subagents
    if agent not in allowed:
        raise FsError(
            E.EACCES,
            f"agent {agent!r} is not for sub-sessions of session {parent.id}: its agent "
            f'({settings["agent"]}) lists {", ".join(allowed[1:]) or "none"} under "subagents"',
        )
    try:
        cfg = config.load_agent(agent)
    except ConfigError as e:
        raise FsError(E.EINVAL, str(e)) from None
    if outside := config.starts_outside_sandbox(cfg):
        raise FsError(
            E.EACCES,
            f"agent {agent!r} runs {'; '.join(outside)} outside the sandbox, in its session's cwd: "
            "a session's code may not start one (start it yourself, through the mount)",
        )
    return agent


def check_child_backend(parent: Session, agent: str, backend: str, model: str, switch: bool = False) -> None:
    """A sub-agent's backend is its agent's or its parent's (no other backend's server, on some
    loopback port, is the sandbox's to reach), and its model one its agent's config allows (its
    `model` and `models`) or its parent's own: code may not start a dearer model than it was given.
    A `switch` of a running sub-session's backend names its model (else it would take the
    backend's default, whichever that is)."""

    settings = parent.settings()
    cfg = config.load_agent(agent)
    ours = {settings["backend"], cfg.backend or backends.default_name()}
    if backend and backend not in ours:
        raise FsError(E.EACCES, f"backend {backend!r}: a sub-agent uses {' or '.join(sorted(ours))}")
    allowed = [m for m in (cfg.model, *cfg.models, settings["model"]) if m]
    if switch and backend and not model:
        raise FsError(
            E.EACCES,
            f"backend {backend!r}: name the model too (`backend {backend} MODEL`), one of {', '.join(allowed)}",
        )
    if model and model not in allowed:
        where = cfg.path or f"agent {agent!r}"
        raise FsError(
            E.EACCES,
            f"model {model!r}: a sub-agent of agent {agent!r} runs on "
            f"{', '.join(dict.fromkeys(allowed)) or 'its default'}; "
            f'list more under "models" in {where}',
        )


def check_cwd(path: str) -> str:
    """A cwd written to a file must be absolute: a relative one would be taken from the server's
    directory (or the session's), which the writer cannot see."""
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
