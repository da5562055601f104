"""`b/` as files: a directory per job (its spec, status, result, usage, cost, log and, with
worktree=1, its worktree), `new` (write a spec, read the new jobs' ids), `idx` and the scripts. The
jobs themselves are `jobs.Jobs`'.
"""

from __future__ import annotations

import contextlib
import errno as E
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..chatfmt import cost_text, usage_text
from ..types import OllieError
from ..vfs.namespace import Dir, File, FsError, Handle, OpenMode
from ..vfs.stores import OnCloseHandle, TextFile, text_size
from . import worktrees
from .job import TEMPLATE, Job, Spec, parse_header_line
from .jobs import Jobs
from .session_files import ChatFile, WaitHandle, script_file
from .sessions import Session, child_name, errno_of

SPEC_MAX = 1 << 20


def index(jobs: list[Job]) -> str:
    """b/idx: a line per job: its id, status, agent and the first line of its prompt."""
    return "".join(
        f"{j.id}\t{j.status}\t{j.spec.settings.get('agent') or 'default'}\t{_first_line(j.spec.prompt)}\n" for j in jobs
    )


def _first_line(text: str, width: int = 60) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"


class NewJobHandle(OnCloseHandle):
    """b/new: the spec's header lines are checked as they are written, each alone and what they
    ask together (an agent, a backend, a cwd that is there; a bad one fails its write, and then
    nothing is made at close, whose error a shell ignores); at close the jobs are made. Reading
    gives the template, or the new jobs' ids, one a line (reading after writing makes them at
    once), or why it failed."""

    def __init__(
        self, submit: Callable[[str], Any], ready: Callable[[], Awaitable[None]], check: Callable[[Spec], None]
    ):
        super().__init__(lambda: self._answer or TEMPLATE, self._make, SPEC_MAX)
        self._submit = submit
        self._ready = ready
        self._check = check
        self._answer = ""
        self._error: FsError | None = None

    async def write(self, offset: int, data: bytes) -> int:
        if self._error is not None:  # every later write of this open file fails alike
            raise self._error
        if offset == 0:
            try:  # a cluster that cannot be reached fails the first write, which a shell reports
                await self._ready()
            except FsError as e:
                self._refuse(e)
                raise
        n = await super().write(offset, data)
        header = bytes(self._buf).decode(errors="replace").split("\n")[:-1]  # complete lines
        spec = Spec({})
        try:
            for number, line in enumerate(header, 1):
                if line.strip() == "---":
                    break
                parse_header_line(number, line, spec)
            self._check(spec)
        except FsError as e:
            self._refuse(e)
            raise
        self._wrote(offset, n)
        return n

    def _refuse(self, e: FsError) -> None:
        self._refused, self._dirty, self._answer, self._error = True, False, f"error: {e}\n", e
        self.clear()

    async def read(self, offset: int, count: int) -> bytes:
        if offset in (0, self._written_to):  # the start of the answer, maybe: make the jobs first
            await self.flush()
        return await self._read_answer(offset, count)

    async def _make(self, text: str) -> None:
        try:
            jobs = await self._submit(text)
        except OllieError as e:
            self._answer = f"error: {e}\n"
            raise FsError(errno_of(e), str(e)) from None
        self._answer = "".join(j.id + "\n" for j in jobs)


class NewJobFile(File):
    mode = 0o644

    def __init__(
        self, submit: Callable[[str], Any], ready: Callable[[], Awaitable[None]], check: Callable[[Spec], None]
    ):
        self._submit = submit
        self._ready = ready
        self._check = check

    def size(self) -> int:
        return len(TEMPLATE)

    async def open(self, mode: OpenMode) -> Handle:
        return NewJobHandle(self._submit, self._ready, self._check)


class StatusWaitFile(File):
    def __init__(self, job: Job):
        self.job = job

    async def open(self, mode: OpenMode) -> Handle:
        return WaitHandle(self.job.status, self.job.wait_change)


def _line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _text(get: Callable[[], str], sized: bool = True) -> TextFile:
    return TextFile(get, text_size(get) if sized else None)


JOB_FILES: dict[str, Callable[[Job], File]] = {
    "spec": lambda j: _text(lambda: _line(j.record.spec)),
    "status": lambda j: _text(lambda: j.status + "\n"),
    "result": lambda j: _text(lambda: _line(j.record.result)),
    "usage": lambda j: _text(lambda: usage_text(j.usage()) + "\n", sized=False),
    "cost": lambda j: _text(lambda: cost_text(j.cost(), j.record.model) + "\n", sized=False),
    "log": lambda j: ChatFile(lambda: j.log_path, "a job's log is read-only", looked=lambda: _looked(j)),
    "worktree": lambda j: _text(lambda: _worktree_text(j)),
}


def _looked(job: Job) -> None:
    """A reader looked at the job's log: its session's text then streams as it comes."""
    if job.session is not None:
        job.session.looked()


def _worktree_text(job: Job) -> str:
    """b/<id>/worktree: `key: value` lines (branch, path, base) and the diffstat once it ended."""
    tree = job.record.worktree
    if not tree:
        return ""
    lines = [f"branch: {worktrees.BRANCH.format(tree['id'])}", f"path: {tree['path']}", f"base: {tree['base']}"]
    return "\n".join(lines) + "\n" + _line(tree.get("diffstat", ""))


class JobDir(Dir):
    mode = 0o555

    def __init__(self, job: Job):
        self.job = job

    def mtime(self) -> float:
        return self.job.record.finished or self.job.record.created

    def lookup(self, name: str) -> File | Dir:
        if name == "statewait":  # blocks: found by name, never listed
            return StatusWaitFile(self.job)
        make = JOB_FILES.get(name)
        if make is None:
            raise FsError(E.ENOENT, f"{name}: no such file in a job directory")
        return make(self.job)

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [
            (name, make(self.job))
            for name, make in JOB_FILES.items()
            if name != "worktree" or self.job.spec.worktree  # only a worktree=1 job's
        ]

    async def remove(self, name: str) -> None:
        """Removing a job's file does nothing, so that `rm -r b/<id>` reaches the rmdir."""


class JobsDir(Dir):
    """b/: a directory per job (creation order), `new`, `idx` and the scripts (not listed). In a
    session's view, `owner` is that session: only its own jobs are there, and new ones are its."""

    mode = 0o755

    def __init__(self, jobs: Jobs, scripts: dict[str, str], owner: Session | None = None):
        self.jobs = jobs
        self.owner = owner
        self.fixed: dict[str, File] = {
            "new": NewJobFile(self._submit, self._ready, self._check),
            "idx": TextFile(lambda: index(self._mine())),
            **{name: script_file(text) for name, text in scripts.items()},
        }

    async def _submit(self, text: str) -> list[Job]:
        with self._owner_told():
            return await self.jobs.submit(text, self.owner)

    def _check(self, spec: Spec) -> None:
        with self._owner_told():
            self.jobs.check_spec(spec, self.owner)

    async def _ready(self) -> None:
        with self._owner_told():
            await self.jobs.ready()

    @contextlib.contextmanager
    def _owner_told(self) -> Iterator[None]:
        """A refusal of a session's code's job is said in its chat too (its code sees an errno)."""
        try:
            yield
        except FsError as e:
            if self.owner is not None:
                self.owner.error(f"job refused: {e}")
            raise

    def _mine(self) -> list[Job]:
        return self.jobs.all() if self.owner is None else self.jobs.of(self.owner)

    def _job(self, name: str) -> Job:
        """A job by id; in a view, by the name its code gave too (`child_name`)."""
        if self.owner is None:
            return self.jobs.get(name)
        job = self.jobs.find(name) or self.jobs.find(child_name(self.owner, name))
        if job is None or job.record.parent != self.owner.id:
            raise FsError(E.ENOENT, f"no job {name!r} in this view")
        return job

    def lookup(self, name: str) -> File | Dir:
        if name in self.fixed:
            return self.fixed[name]
        return JobDir(self._job(name))

    async def list(self) -> list[tuple[str, File | Dir]]:
        return [(j.id, JobDir(j)) for j in self._mine()]

    async def remove(self, name: str) -> None:
        if name in self.fixed:
            raise FsError(E.EACCES, f"{name}: a fixed file of b/")
        await self.jobs.cancel(self._job(name).id)
