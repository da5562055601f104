"""Batch jobs: every job of the server (`b/`, whose files are `job_files`).

A job (`job.Job`) is one prompt run to its end. `Jobs` makes jobs from a spec, bounds what a
session's code may make, queues them, runs each when one of its slots is free (OLLIE_JOBS) on the
executor chosen once, when `Jobs` is made (OLLIE_BATCH_EXECUTOR: `local`, a session of this server,
`local_jobs`; or `ray`, a task on a Ray cluster, `ray_jobs`; `b/` shows both alike), and cancels
and removes them. After a restart finished jobs keep their results; jobs that were queued or
running are `failed: interrupted by restart` (after a crash) or `failed: interrupted by a server
stop`, never run again behind the user's back.

A job that a session's code submits (through its view) is that session's: its cwd and agent are
bounded as a sub-session's are, and interrupting or ending the session cancels it. What its spec
holds in memory, until the job is removed, is charged to the budget of the session's tree (the
top-level session with every sub-session and job under it: `tree_held`), which the tree's open
files share: a bound per session would let a tree of 64 sub-sessions hold 64 times as much.
"""

from __future__ import annotations

import asyncio
import errno as E
import json
import logging
import os
import shutil
import sys
import weakref
from collections.abc import Callable

from ..agent.session import check_session_id, new_session_id
from ..types import ConfigError, OllieError
from ..vfs import stores
from ..vfs.namespace import FsError
from ..vfs.stores import Held
from . import worktrees
from .job import UNFINISHED, Executor, Job, Record, Spec, jobs_dir, live_parent, parse_spec, session_settings
from .local_jobs import LocalExecutor
from .sessions import Session, Sessions, child_name

log = logging.getLogger("ollie.fs.jobs")

JOBS_PER_PARENT = 64  # queued and running jobs of one session's code at once
# Jobs of one session's code kept, finished ones included: past it the oldest finished one without a
# worktree (whose branch waits to be merged) is removed to make room, as a log rotates
JOBS_KEPT_PER_PARENT = 256
EXECUTORS = ("local", "ray")
JOB_HELD = 4096  # bytes a job holds besides its spec (record, task, event), as charged to its tree


def job_slots(default: int) -> int:
    """How many jobs run at once: OLLIE_JOBS, else the executor's `default`."""
    raw = os.environ.get("OLLIE_JOBS", str(default))
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise OllieError(f"OLLIE_JOBS={raw!r}: give how many jobs may run at once, a whole number of at least 1")
    return slots


def configured_executor(sessions: Sessions) -> Executor:
    """The executor OLLIE_BATCH_EXECUTOR names."""
    name = os.environ.get("OLLIE_BATCH_EXECUTOR", "local") or "local"
    if name not in EXECUTORS:
        raise OllieError(f"OLLIE_BATCH_EXECUTOR={name!r}: give {' or '.join(EXECUTORS)}")
    if name == "ray":
        from .ray_jobs import RayExecutor  # only when chosen: the module that imports Ray

        return RayExecutor(sessions)
    return LocalExecutor(sessions)


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

    def __init__(self, sessions: Sessions, slots: int | None = None, executor: Executor | None = None):
        """`executor`: the one OLLIE_BATCH_EXECUTOR names unless given; `slots`: how many jobs it
        runs at once, OLLIE_JOBS or the executor's own number unless given."""
        self.sessions = sessions
        self.executor = executor or configured_executor(sessions)
        self._by_id: dict[str, Job] = {}
        # By parent session id, in creation order: a view's b/ and its bounds look at its own jobs
        # only, however many every other session made.
        self._by_parent: dict[str, list[Job]] = {}
        self._slots = asyncio.Semaphore(slots or job_slots(self.executor.slots))
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
        settings = session_settings(self.sessions, spec, parent)
        if parent is not None:
            self._check_bounds(spec, parent)
        base = self._base(spec, parent)
        self.executor.check(spec, settings, parent, f"{base}-0")
        if spec.settings.get("name"):
            for i in range(spec.parallel):
                jid = f"{base}-{i}"
                if jid in self._by_id or self.sessions.find(jid) is not None:
                    raise FsError(E.EEXIST, f"the name {base!r} is taken ({jid}); choose another")

    def _check_bounds(self, spec: Spec, parent: Session) -> None:
        """How many jobs a session's code may have: unfinished at once, and kept."""
        mine = self.of(parent)
        unfinished = sum(1 for j in mine if j.status in UNFINISHED)
        if unfinished + spec.parallel > JOBS_PER_PARENT:
            raise FsError(E.EACCES, f"{JOBS_PER_PARENT} unfinished jobs a session at most; wait for some")
        if len(mine) - len(self._removable(mine)) + spec.parallel > JOBS_KEPT_PER_PARENT:
            raise FsError(
                E.EACCES,
                f"{JOBS_KEPT_PER_PARENT} jobs a session at most, unfinished or with a worktree; "
                "rm -r b/<id> the worktrees merged",
            )

    @staticmethod
    def _removable(mine: list[Job]) -> list[Job]:
        """A session's jobs that may go to make room for new ones, oldest first: finished, and
        with no worktree."""
        done = [j for j in mine if j.status not in UNFINISHED and not j.record.worktree]
        return sorted(done, key=lambda j: (j.record.created, j.id))

    async def _make_room(self, parent: Session, n: int) -> None:
        mine = self.of(parent)
        for job in self._removable(mine)[: max(0, len(mine) + n - JOBS_KEPT_PER_PARENT)]:
            log.info("job %s of %s removed to make room (%d kept)", job.id, parent.id, JOBS_KEPT_PER_PARENT)
            await self.cancel(job.id)

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
        if parent is not None:
            await self._make_room(parent, spec.parallel)
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
        try:
            await self.executor.ready()
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
        """Run the job, holding its slot until the executor is done with it. Its last status is set
        then, so whoever sees `done` (or `failed`, `cancelled`) sees what it spent counted in its
        parent's, and the next job starts after it has finished."""
        if job.status != "queued":
            return
        status, result = "", None
        try:
            if parent is not None and live_parent(self.sessions, parent) is None:
                status, result = "cancelled", "its session ended"
                return
            status, result = await self.executor.run(job, parent)
        except asyncio.CancelledError:
            if job.status in UNFINISHED:
                status = self._cancelled()
        except (OllieError, OSError) as e:
            status, result = f"failed: {e}", str(e)
        finally:
            if status:
                job.set(status, result)

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
                await worktrees.remove(tree, self.sessions.find(job.record.parent))
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
        await self.executor.close()
