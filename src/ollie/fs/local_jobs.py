"""The local executor (`OLLIE_BATCH_EXECUTOR=local`, the default): each job a headless session of
this server's `Sessions`, so its code has a view of its own and its sub-sessions and jobs are
bounded by it, let go when the job ends. With `worktree=1` the job's session runs in a git worktree
of its own (`worktrees`), made first and committed on its branch at the end, whatever the answer.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict

from ..types import OllieError
from . import worktrees
from .job import Job, Spec, jobs_dir, live_parent, outcome, session_settings
from .sessions import Session, Sessions


class LocalExecutor:
    slots = 4  # OLLIE_JOBS's default

    def __init__(self, sessions: Sessions):
        self.sessions = sessions

    def check(self, spec: Spec, settings: dict[str, str], parent: Session | None, job_id: str) -> None:
        """The session's spec (a sub-agent's cwd was proved a directory by descriptor, not looked
        up again); with worktree=1, the repository the cwd is in and `job_id` as a branch's name."""
        self.sessions.check_spec(settings, cwd_here=parent is None)
        if spec.worktree:
            self._worktree_plan("x", settings, parent)  # the repository's checks; the id's come below
            if spec.settings.get("name"):
                worktrees.check_id(job_id)

    async def ready(self) -> None:
        """Always: the server runs its jobs itself."""

    async def run(self, job: Job, parent: Session | None) -> tuple[str, str]:
        """The job as a session of this server, let go when the turn ends or is cancelled."""
        try:
            return await self._turn(job, parent)
        finally:
            await self._let_go(job)

    async def _turn(self, job: Job, parent: Session | None) -> tuple[str, str]:
        job.set("running")
        settings, tree = job.spec.session, None
        if job.spec.worktree:
            plan = self._worktree_plan(job.id, session_settings(self.sessions, job.spec, parent), parent)
            tree = await worktrees.create(plan, parent)
            job.record.worktree = asdict(tree)
            job.save()
            settings = {**settings, "cwd": tree.cwd}
        job.session = await self.sessions.new(settings, parent=parent, job_id=job.id, store_root=jobs_dir())
        core = await job.session.wake()
        errors: list[str] = []
        core.subscribe(lambda ev: errors.append(ev.text) if ev.kind == "error" else None, follows=False)
        with contextlib.suppress(OllieError):  # what ended the turn is among the error events
            await core.submit(job.prompt)
        status, result = outcome(core.reply, errors, job.spec.output)
        if tree is not None:  # its work committed on its branch, whatever the answer
            tree = await worktrees.finish(tree, live_parent(self.sessions, parent))
            job.record.worktree = asdict(tree)
            if job.spec.output != "json":  # a JSON answer stays one: b/<id>/worktree has it
                result = f"{result.rstrip()}\n\n{tree.section()}"
        return status, result

    async def _let_go(self, job: Job) -> None:
        """The job's session: what it spent into the record, and out of the registry (which counts
        it in its parent's). Its last status is set after this, so whoever sees `done` (or
        `failed`, `cancelled`) sees what it spent counted in its parent's."""
        session, job.session = job.session, None
        if session is None:
            return
        core = session.core
        if core is not None:
            job.spent(asdict(core.usage()), core.cost(), core.backend.model)
            job.save()
        await self.sessions.forget(session)

    def _worktree_plan(self, jid: str, settings: dict[str, str], parent: Session | None) -> worktrees.Worktree:
        cwd = settings.get("cwd") if parent is not None else None  # a sub-agent's: a real path, checked
        cwd = cwd or os.path.realpath(self.sessions.cwd_of(settings))
        bound = parent.settings()["cwd"] if parent is not None else None
        return worktrees.plan(jid, cwd, bound, "job", parent.id if parent is not None else "")

    async def close(self) -> None:
        """Nothing to stop: its jobs' sessions were let go as they were cancelled."""
