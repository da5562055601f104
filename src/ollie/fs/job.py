"""One batch job: its spec, its record (`job.json`), its states and the rule for its outcome; and
the `Executor` protocol, what runs it (`local_jobs.LocalExecutor`, `ray_jobs.RayExecutor`).

A job is `queued`, then `running`, then `done`, `failed: <why>` or `cancelled`. Its files live in
`$OLLIE_DATA_PATH/jobs/<id>/`: `job.json` (its spec, status and result, replaced atomically at each
change) and, once it has run, its session's files (`chat` is the job's `log`).
"""

from __future__ import annotations

import asyncio
import errno as E
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import config
from ..agent.session import check_session_id
from ..types import Cost, InvalidValue, Usage
from ..vfs.namespace import FsError
from . import worktrees

if TYPE_CHECKING:
    from ..vfs.stores import Held
    from .sessions import Session, Sessions

SPEC_KEYS = ("name", "cwd", "agent", "backend", "model", "output", "worktree", "parallel")
TEMPLATE = "".join(f"{k}=\n" for k in SPEC_KEYS[:-1]) + "parallel=1\n---\n"
PARALLEL_MAX = 64  # jobs one spec makes
JSON_ANSWER = (
    "\n\nAnswer with one JSON value and nothing else: no prose before or after it, no code fence. "
    "Your answer is parsed as JSON."
)
UNFINISHED = ("queued", "running")


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
                check_session_id(f"{value}-{PARALLEL_MAX}")  # as its jobs' ids will be (`<name>-<i>`)
            except InvalidValue:
                raise FsError(
                    E.EINVAL, f"line {number}: name {value!r}: use letters, digits, '.', '_' and '-' (no '/')"
                ) from None
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
    """A finished turn's (status, result): its answer, or why there is none or it is not JSON.
    Every executor's rule, wherever the turn ran."""
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


# ---- the job -------------------------------------------------------------------------------------


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
        self.session: Session | None = None  # its session on this server while it runs (the local executor's)
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

    def spent(self, usage: dict[str, Any], cost: Cost, model: str) -> None:
        """What it has spent so far, as its executor reports it, into its record."""
        self.record.usage = usage
        self.record.cost, self.record.cost_last, self.record.price_known = cost.session, cost.last, cost.price_known
        self.record.model = model

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


# ---- what runs it --------------------------------------------------------------------------------


class Executor(Protocol):
    """What runs jobs (OLLIE_BATCH_EXECUTOR), chosen once, when `Jobs` is made. `Jobs` keeps the
    queue, the bounds and the records; the executor runs one job at a time it is handed."""

    slots: int  # how many of its jobs run at once, unless OLLIE_JOBS says

    def check(self, spec: Spec, settings: dict[str, str], parent: Session | None, job_id: str) -> None:
        """What can be known wrong before any job of `spec` is made (FsError): `settings` are its
        session's (a sub-agent's bounded by its parent's already), `job_id` its first job's."""

    async def ready(self) -> None:
        """Whether jobs can be run now (OllieError naming why not: a cluster that cannot be reached)."""

    async def run(self, job: Job, parent: Session | None) -> tuple[str, str]:
        """Run the job to its end and return its (status, result) by `outcome`'s rules; `job.set
        ("running")` once it runs. Its log is appended to `job.log_path` as it grows, what it spent
        kept in its record (`job.spent`) and counted in its parent's. Cancelled, it stops the job."""

    async def close(self) -> None:
        """The server stops (its jobs were cancelled first)."""


def live_parent(sessions: Sessions, parent: Session | None) -> Session | None:
    """`parent` while it is a session of the server still (not ended, nor ended and made again)."""
    return parent if parent is not None and sessions.find(parent.id) is parent else None


def session_settings(sessions: Sessions, spec: Spec, parent: Session | None) -> dict[str, str]:
    """The settings of a job's session; a sub-agent's bounded by its parent's (FsError beyond
    them), with the parent's cwd and agent where not given, its cwd proved a real directory."""
    return sessions.check_child(parent, spec.session, jobs=True) if parent is not None else spec.session
