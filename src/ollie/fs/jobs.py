"""Batch jobs: `b/`. A job is one prompt run to its end by a headless session of the server: it is
queued, runs when one of the server's job slots is free (OLLIE_JOBS, default 4 at once), and
leaves its result, usage, cost and log behind.

A job's files live in `$OLLIE_DATA_PATH/jobs/<id>/`: `job.json` (its spec, status and result,
replaced atomically at each change) and, once it has run, the session's own files (`chat` is the
job's `log`). A job runs as a session of `Sessions` (so its code has a view of its own, and its
sub-sessions and jobs are bounded by it) and leaves it when it ends. After a restart finished jobs
keep their results; jobs that were queued or running are `failed: interrupted by restart` (after a
crash) or `failed: interrupted by a server stop`, never run again behind the user's back.

A job that a session's code submits (through its view) is that session's: its cwd and agent are
bounded as a sub-session's are, and interrupting or ending the session cancels it. What its spec
holds in memory, until the job is removed, is charged to the budget of the session's tree (the
top-level session with every sub-session and job under it: `tree_held`), which the tree's open
files share: a bound per session would let a tree of 64 sub-sessions hold 64 times as much.

Where a job runs is the executor's choice (OLLIE_BATCH_EXECUTOR): `local`, a session of this
server, or `ray`, a task on a Ray cluster (`ray_jobs`); `b/` shows both alike. `b/` as files is
`job_files`.
"""

from __future__ import annotations

import asyncio
import errno as E
import json
import logging
import os
import shutil
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config, telemetry
from ..agent.session import check_session_id, new_session_id
from ..types import ConfigError, Cost, InvalidValue, OllieError, Usage
from ..vfs import stores
from ..vfs.namespace import FsError
from ..vfs.stores import Held
from . import worktrees
from .sessions import Session, Sessions, child_name

if TYPE_CHECKING:
    from .ray_jobs import RayExecutor

log = logging.getLogger("ollie.fs.jobs")

SPEC_KEYS = ("name", "cwd", "agent", "backend", "model", "output", "worktree", "parallel")
TEMPLATE = "".join(f"{k}=\n" for k in SPEC_KEYS[:-1]) + "parallel=1\n---\n"
PARALLEL_MAX = 64  # jobs one spec makes
JOBS_PER_PARENT = 64  # queued and running jobs of one session's code at once
JOBS_KEPT_PER_PARENT = 256  # jobs of one session's code, finished ones included, until removed
JSON_ANSWER = (
    "\n\nAnswer with one JSON value and nothing else: no prose before or after it, no code fence. "
    "Your answer is parsed as JSON."
)
UNFINISHED = ("queued", "running")
EXECUTORS = ("local", "ray")
RAY_IN_FLIGHT = 10_000  # jobs handed to a Ray cluster at once by default: its scheduler queues them
JOB_HELD = 4096  # bytes a job holds besides its spec (record, task, event), as charged to its tree


def job_slots() -> int:
    raw = os.environ.get("OLLIE_JOBS", "4")
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise OllieError(f"OLLIE_JOBS={raw!r}: give how many jobs may run at once, a whole number of at least 1")
    return slots


def batch_executor() -> str:
    name = os.environ.get("OLLIE_BATCH_EXECUTOR", "local") or "local"
    if name not in EXECUTORS:
        raise OllieError(f"OLLIE_BATCH_EXECUTOR={name!r}: give {' or '.join(EXECUTORS)}")
    return name


def jobs_dir() -> Path:
    return config.data_path() / "jobs"


# ---- the spec ------------------------------------------------------------------------------------


@dataclass
class Spec:
    settings: dict[str, str]  # name cwd agent backend model, as given ("" = default)
    output: str = ""  # "" or "json"
    parallel: int = 1
    worktree: bool = False  # each job in a git worktree of its own (worktrees.py)
    prompt: str = ""

    @property
    def session(self) -> dict[str, str]:
        """The settings of the job's session (the name is the job's)."""
        return {k: v for k, v in self.settings.items() if k != "name"}


def parse_header_line(number: int, line: str, spec: Spec) -> None:
    """One `key=value` line of a spec's header into `spec`; FsError(EINVAL) naming the line."""
    line = line.strip()
    if not line or line.startswith("#"):
        return
    key, sep, value = line.partition("=")
    key, value = key.strip(), value.strip()
    if not sep:
        raise FsError(E.EINVAL, f"line {number}: expected key=value or ---, got {line!r}")
    if key not in SPEC_KEYS:
        raise FsError(E.EINVAL, f"line {number}: unknown key {key!r}; keys: {', '.join(SPEC_KEYS)}")
    if key == "output":
        if value not in ("", "json", "text"):
            raise FsError(E.EINVAL, f"line {number}: output is json, or empty for text; got {value!r}")
        spec.output = "json" if value == "json" else ""
    elif key == "parallel":
        if not value.isdigit() or not 1 <= int(value) <= PARALLEL_MAX:
            raise FsError(E.EINVAL, f"line {number}: parallel is a whole number from 1 to {PARALLEL_MAX}")
        spec.parallel = int(value)
    elif key == "worktree":
        spec.worktree = worktrees.wanted(value, f"line {number}: worktree")
    else:
        if key == "name" and value:
            try:
                check_session_id(f"{value}-{PARALLEL_MAX}")
            except InvalidValue as e:
                raise FsError(E.EINVAL, f"line {number}: name: {e}") from None
        spec.settings[key] = value


def parse_spec(text: str) -> Spec:
    """`key=value` lines, a line `---`, then the prompt."""
    spec = Spec({})
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if line.strip() == "---":
            spec.prompt = "\n".join(lines[number:]).strip()
            break
        parse_header_line(number, line, spec)
    else:
        raise FsError(E.EINVAL, f"line {len(lines)}: no line '---': the prompt follows one (cat b/new)")
    if not spec.prompt:
        raise FsError(E.EINVAL, "the prompt after '---' is empty")
    return spec


def outcome(answer: str, errors: list[str], output: str) -> tuple[str, str]:
    """A finished turn's (status, result): its answer, or why there is none or it is not JSON."""
    answer = answer.strip()
    if not answer:
        reason = errors[-1] if errors else "the turn ended without an answer"
        return f"failed: {reason.splitlines()[0]}", reason
    if output == "json":
        try:
            json.loads(answer)
        except ValueError as e:
            return f"failed: the answer is not JSON ({e})", answer
    return "done", answer


# ---- jobs ------------------------------------------------------------------------------------------


@dataclass
class Record:
    """What job.json holds."""

    id: str
    spec: str
    parent: str = ""
    status: str = "queued"
    result: str = ""
    created: float = field(default_factory=time.time)
    started: float = 0.0
    finished: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    cost: float = 0.0
    cost_last: float = 0.0
    price_known: bool = True
    model: str = ""
    worktree: dict[str, Any] = field(default_factory=dict)  # worktrees.Worktree's fields, once made


class Job:
    def __init__(self, record: Record, spec: Spec, held: tuple[Held, int] | None = None):
        self.record = record
        self.spec = spec
        self.held = held  # the budget charged for it, and how much, given back when it is removed
        self.session: Session | None = None  # while it runs
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.on_change: Callable[[Job], None] | None = None  # Jobs' listeners (the web page's feed)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def dir(self) -> Path:
        return jobs_dir() / self.id

    @property
    def status(self) -> str:
        return self.record.status

    def set(self, status: str, result: str | None = None) -> None:
        self.record.status = status
        if result is not None:
            self.record.result = result
        if status == "running":
            self.record.started = time.time()
        elif status not in UNFINISHED:
            self.record.finished = time.time()
        self.save()
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_change is not None:
            self.on_change(self)

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.dir / ".job.json.tmp"
        tmp.write_text(json.dumps(asdict(self.record), ensure_ascii=False))
        os.replace(tmp, self.dir / "job.json")

    async def wait_change(self, seen: str, timeout: float) -> str:
        if self.status == seen:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass
        return self.status

    def usage(self) -> Usage:
        core = self.session.core if self.session else None
        return core.usage() if core is not None else Usage(**self.record.usage)

    def cost(self) -> Cost:
        core = self.session.core if self.session else None
        return (
            core.cost() if core is not None else Cost(self.record.cost_last, self.record.cost, self.record.price_known)
        )

    @property
    def log_path(self) -> Path:
        return self.dir / "chat"

    @property
    def prompt(self) -> str:
        """The prompt as the model gets it."""
        return self.spec.prompt + (JSON_ANSWER if self.spec.output == "json" else "")


_TREES: weakref.WeakKeyDictionary[Session, Held] = weakref.WeakKeyDictionary()


def tree_held(sessions: Sessions, session: Session) -> Held:
    """The budget of `session`'s tree: its top-level session's, shared by every session and job
    under it, for what their code makes the server hold (job specs, what its views' open files
    hold written). The user's own connections have the server's (stores.SERVER_HELD)."""
    top = sessions.top(session)
    held = _TREES.get(top)
    if held is None:
        held = _TREES[top] = Held(
            stores.TREE_HELD_MAX,
            "this tree of sessions (a top-level session, every sub-session and job under it) holds {cap} "
            "written to files not closed yet and in job specs: close some, or rm -r finished jobs of b/",
        )
    return held


def spec_held(text: str, spec: Spec, jobs: int = 1) -> int:
    """What `jobs` jobs of a spec hold in memory: its text (b/<id>/spec) and its prompt, which they
    share, and each one's record."""
    return sys.getsizeof(text) + sys.getsizeof(spec.prompt) + JOB_HELD * jobs


class Jobs:
    """Every job of the server, by id, in creation order; and by the session that made it."""

    def __init__(self, sessions: Sessions, slots: int | None = None, executor: str | None = None):
        """`executor` (OLLIE_BATCH_EXECUTOR): `local` runs OLLIE_JOBS jobs at once; `ray` hands
        every job to the cluster at once (unless OLLIE_JOBS is set), whose CPUs pace them."""
        self.sessions = sessions
        self._by_id: dict[str, Job] = {}
        # By parent session id, in creation order: a view's b/ and its bounds look at its own jobs
        # only, however many every other session made.
        self._by_parent: dict[str, list[Job]] = {}
        self._ray: RayExecutor | None = None
        if (executor or batch_executor()) == "ray":
            from .ray_jobs import RayExecutor

            self._ray = RayExecutor()
            if slots is None and "OLLIE_JOBS" not in os.environ:
                slots = RAY_IN_FLIGHT
        self._slots = asyncio.Semaphore(slots or job_slots())
        self._closing = False  # the server stops: what it cancels now is interrupted, not cancelled
        # Told a job that was added, changed status, or was removed (the web page's feed).
        self.on_change: list[Callable[[Job], None]] = []
        sessions.on_end.append(self._parent_ended)
        sessions.on_rename.append(self._parent_renamed)
        sessions.reserved = lambda sid: sid in self._by_id

    def restore(self) -> int:
        """Register the stored jobs; one left unfinished by a stop is marked so, not run again."""
        root = jobs_dir()
        for path in sorted(root.glob("*/job.json")) if root.is_dir() else []:
            try:
                record = Record(**json.loads(path.read_text()))
                if record.id != path.parent.name or check_session_id(record.id) != record.id:
                    raise ValueError(f"its id {record.id!r} is not its directory's name")
                job = Job(record, parse_spec(record.spec))
            except (OSError, ValueError, TypeError, FsError) as e:
                log.warning("%s: not a job: %s", path.parent, e)
                continue
            if job.status in UNFINISHED:
                job.set("failed: interrupted by restart")
            parent = self.sessions.find(job.record.parent) if job.record.parent else None
            if parent is not None:  # what its tree held before the restart, it holds again
                held = tree_held(self.sessions, parent)
                job.held = (held, spec_held(job.record.spec, job.spec))  # read apart: a copy each
                held.charge(job.held[1], force=True)
            self._add(job)
        for mine in self._by_parent.values():
            mine.sort(key=lambda j: (j.record.created, j.id))
        # The worktrees of jobs removed, and of sub-sessions killed, while the server was down.
        live = {("job", jid) for jid in self._by_id} | {("session", s.id) for s in self.sessions.all()}
        worktrees.sweep_soon(live)
        return len(self._by_id)

    def _add(self, job: Job) -> None:
        self._by_id[job.id] = job
        self._by_parent.setdefault(job.record.parent, []).append(job)
        job.on_change = self._told
        self._told(job)

    def _told(self, job: Job) -> None:
        for listener in self.on_change:
            listener(job)

    def get(self, jid: str) -> Job:
        try:
            return self._by_id[jid]
        except KeyError:
            raise FsError(E.ENOENT, f"no job {jid!r}") from None

    def find(self, jid: str) -> Job | None:
        return self._by_id.get(jid)

    def all(self) -> list[Job]:
        return sorted(self._by_id.values(), key=lambda j: (j.record.created, j.id))

    def of(self, parent: Session) -> list[Job]:
        return list(self._by_parent.get(parent.id, ()))

    def check_spec(self, spec: Spec, parent: Session | None) -> None:
        """What can be known wrong before any job is made (FsError). A session's bounds come
        first: nothing outside them is looked at."""
        settings = spec.session
        if parent is not None:
            settings = self.sessions.check_child(parent, settings, jobs=True)  # its cwd proved a directory
            mine = self.of(parent)
            unfinished = sum(1 for j in mine if j.status in UNFINISHED)
            if unfinished + spec.parallel > JOBS_PER_PARENT:
                raise FsError(E.EACCES, f"{JOBS_PER_PARENT} unfinished jobs a session at most; wait for some")
            if len(mine) + spec.parallel > JOBS_KEPT_PER_PARENT:
                raise FsError(
                    E.EACCES, f"{JOBS_KEPT_PER_PARENT} jobs a session at most; rm -r b/<id> the finished ones"
                )
        self.sessions.check_spec(settings, cwd_here=self._ray is None and parent is None)
        if spec.worktree:
            self._check_worktree(spec, settings, parent)
        if spec.settings.get("name"):
            name = self._base(spec, parent)
            for i in range(spec.parallel):
                jid = f"{name}-{i}"
                if jid in self._by_id or self.sessions.find(jid) is not None:
                    raise FsError(E.EEXIST, f"the name {name!r} is taken ({jid}); choose another")

    def _check_worktree(self, spec: Spec, settings: dict[str, str], parent: Session | None) -> None:
        """worktree=1: refused on Ray (a worker's node has no checkout of this repository to make
        a worktree of, and the worktree must lie in the parent's cwd on this machine), and where
        the cwd is in no git repository, or in one whose root its parent's sandbox cannot write."""
        if self._ray is not None:
            raise FsError(
                E.EINVAL,
                "worktree=1: not with OLLIE_BATCH_EXECUTOR=ray (a job runs on another node, where this "
                "repository's worktree is not); run it on a server with the local executor, or without worktree=1",
            )
        self._worktree_plan("x", settings, parent)  # the repository's checks; the id's come below
        if spec.settings.get("name"):
            worktrees.check_id(f"{self._base(spec, parent)}-0")

    def _worktree_plan(self, jid: str, settings: dict[str, str], parent: Session | None) -> worktrees.Worktree:
        cwd = settings.get("cwd") if parent is not None else None  # a sub-agent's: a real path, checked
        cwd = cwd or os.path.realpath(self.sessions.cwd_of(settings))
        bound = parent.settings()["cwd"] if parent is not None else None
        return worktrees.plan(jid, cwd, bound, "job", parent.id if parent is not None else "")

    @staticmethod
    def _base(spec: Spec, parent: Session | None) -> str:
        """What the jobs' ids start with: the spec's name (one a session's code gives is its own,
        `<id>.<name>`: it never takes the name of the user's job), or a new id."""
        name = spec.settings.get("name")
        if not name:
            return new_session_id()
        return child_name(parent, name) if parent is not None else name

    async def submit(self, text: str, parent: Session | None = None) -> list[Job]:
        """Make the jobs a spec asks for, queued; returns them."""
        spec = parse_spec(text)
        self.check_spec(spec, parent)
        await self.ready()
        held = tree_held(self.sessions, parent) if parent is not None else None
        share = -(-spec_held(text, spec, spec.parallel) // spec.parallel)  # each job's, given back at its removal
        if held is not None:
            held.charge(share * spec.parallel)
        base = self._base(spec, parent)
        made: list[Job] = []
        try:
            for i in range(spec.parallel):
                record = Record(f"{base}-{i}", text, parent.id if parent else "")
                job = Job(record, spec, (held, share) if held is not None else None)
                self._add(job)
                made.append(job)
                job.save()
                job.task = asyncio.create_task(self._run(job, parent))
        finally:
            if held is not None:
                held.charge(-share * (spec.parallel - len(made)))
        return made

    async def ready(self) -> None:
        """Whether jobs can be run: a Ray cluster that cannot be reached is ECONNREFUSED, naming it;
        a bad RAY_ADDRESS, or Ray not installed, EINVAL."""
        if self._ray is not None:
            try:
                await self._ray.connect()
            except OllieError as e:
                log.warning("%s", e)
                raise FsError(E.EINVAL if isinstance(e, ConfigError) else E.ECONNREFUSED, str(e)) from None

    async def _run(self, job: Job, parent: Session | None) -> None:
        try:
            async with self._slots:
                await self._run_in_slot(job, parent)
        except asyncio.CancelledError:  # while queued
            if job.status in UNFINISHED:
                job.set(self._cancelled())

    def _cancelled(self) -> str:
        return "failed: interrupted by a server stop" if self._closing else "cancelled"

    async def _run_in_slot(self, job: Job, parent: Session | None) -> None:
        """Run the job, holding its slot until it is let go. Its last status is set once its
        session is let go, so whoever sees `done` (or `failed`, `cancelled`) sees what it spent
        counted in its parent's, and the next job starts after it has finished."""
        if job.status != "queued":
            return
        status, result = "", None
        try:
            if parent is not None and self.sessions.find(parent.id) is not parent:
                status, result = "cancelled", "its session ended"
                return
            run = self._ray_turn if self._ray is not None else self._turn
            status, result = await run(job, parent)
        except asyncio.CancelledError:
            if job.status in UNFINISHED:
                status = self._cancelled()
        except (OllieError, OSError) as e:
            status, result = f"failed: {e}", str(e)
        finally:
            await self._let_go(job)
            if status:
                job.set(status, result)

    async def _let_go(self, job: Job) -> None:
        """A local job's session: what it spent into the record, and out of the registry (which
        counts it in its parent's)."""
        session, job.session = job.session, None
        if session is None:
            return
        core = session.core
        if core is not None:
            cost = core.cost()
            job.record.usage = asdict(core.usage())
            job.record.cost, job.record.cost_last, job.record.price_known = cost.session, cost.last, cost.price_known
            job.record.model = core.backend.model
            job.save()
        await self.sessions.forget(session)

    def _settings(self, spec: Spec, parent: Session | None) -> dict[str, str]:
        settings = spec.session
        return self.sessions.check_child(parent, settings, jobs=True) if parent is not None else settings

    async def _turn(self, job: Job, parent: Session | None) -> tuple[str, str]:
        """The job as a session of this server."""
        job.set("running")
        settings, tree = job.spec.session, None
        if job.spec.worktree:
            tree = self._worktree_plan(job.id, self._settings(job.spec, parent), parent)
            tree = await worktrees.create(tree, parent)
            job.record.worktree = asdict(tree)
            job.save()
            settings = {**settings, "cwd": tree.cwd}
        job.session = await self.sessions.new(settings, parent=parent, job_id=job.id, store_root=jobs_dir())
        core = await job.session.wake()
        errors: list[str] = []
        core.subscribe(lambda ev: errors.append(ev.text) if ev.kind == "error" else None)
        await core.submit(job.prompt)
        status, result = outcome(core.reply, errors, job.spec.output)
        if tree is not None:  # its work committed on its branch, whatever the answer
            tree = await worktrees.finish(tree, self._alive(parent))
            job.record.worktree = asdict(tree)
            if job.spec.output != "json":  # a JSON answer stays one: b/<id>/worktree has it
                result = f"{result.rstrip()}\n\n{tree.section()}"
        return status, result

    def _alive(self, parent: Session | None) -> Session | None:
        return parent if parent is not None and self.sessions.find(parent.id) is parent else None

    async def _ray_turn(self, job: Job, parent: Session | None) -> tuple[str, str]:
        """The job as a task of the Ray cluster: its log, usage and cost stream into the record."""
        from .ray_jobs import Task

        assert self._ray is not None
        settings = self._settings(job.spec, parent)
        settings["cwd"] = os.path.abspath(self.sessions.cwd_of(settings))
        job.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(job.log_path, "ab") as log_file:

            def progress(item: dict[str, Any]) -> None:
                if item.get("log"):
                    log_file.write(item["log"])
                    log_file.flush()
                if "usage" in item:
                    job.record.usage = item["usage"]
                    job.record.cost, job.record.cost_last, job.record.price_known = item["cost"]
                    job.record.model = item["model"]

            within = parent.settings()["cwd"] if parent is not None else ""
            started_by = parent.core.trace_context() if parent is not None and parent.core is not None else None
            task = Task(job.id, settings, job.prompt, job.spec.output, within, telemetry.inject(started_by))
            done = await self._ray.run(task, lambda: job.set("running"), progress)
        if parent is not None and self.sessions.find(parent.id) is parent:
            self.sessions.add_to_parent(parent, job.usage(), job.record.cost)
        return done["status"], done.get("result", "")

    async def cancel(self, jid: str) -> None:
        """Cancel the job (if unfinished) and remove it with its files."""
        job = self.get(jid)
        if job.task is not None and not job.task.done():
            job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)
        if self._by_id.pop(jid, None) is job:  # once, however many removed it at once
            self._by_parent[job.record.parent].remove(job)
            if job.held is not None:
                job.held[0].charge(-job.held[1])
            self._told(job)
            for tree in worktrees.of_owner("job", jid):  # its worktree and branch go with it
                await worktrees.remove(tree, self._alive(self.sessions.find(job.record.parent)))
        await asyncio.to_thread(shutil.rmtree, job.dir, True)

    def _parent_ended(self, sid: str) -> None:
        """A session ended or was interrupted: its unfinished jobs are cancelled (kept, to read)."""
        for job in self._by_parent.get(sid, ()):
            if job.task is not None and not job.task.done():
                job.task.cancel()

    def _parent_renamed(self, old: str, new: str) -> None:
        """A session was renamed: its jobs stay its own (bounds, cancelling, what they spent)."""
        mine = self._by_parent.pop(old, [])
        for job in mine:
            job.record.parent = new
            job.save()
        if mine:
            self._by_parent.setdefault(new, []).extend(mine)

    async def close(self) -> None:
        self._closing = True
        tasks = [j.task for j in self._by_id.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._ray is not None:
            await self._ray.close()
