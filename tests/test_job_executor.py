"""The Executor protocol (fs/job.py) with a stand-in executor: `Jobs` checks, queues, records and
cancels; the executor it is given runs each job, and nothing else is asked of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import asdict

import pytest

from ollie.fs.job import Job, Spec, outcome
from ollie.fs.jobs import Jobs, configured_executor
from ollie.fs.local_jobs import LocalExecutor
from ollie.fs.sessions import Session, Sessions
from ollie.types import Cost, OllieError, Usage


class StandIn:
    """Runs a job by answering its prompt in capitals once `release` is set."""

    slots = 1

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.ran: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.closed = False

    def check(self, spec: Spec, settings: dict[str, str], parent: Session | None, job_id: str) -> None:
        self.checked.append(job_id)

    async def ready(self) -> None:
        pass

    async def run(self, job: Job, parent: Session | None) -> tuple[str, str]:
        job.set("running")
        self.ran.append(job.id)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(job.id)
            raise
        job.spent(asdict(Usage(input_tokens=3, output_tokens=1, requests=1)), Cost(0.25, 0.25, True), "stand-in")
        return outcome(job.spec.prompt.upper(), [], job.spec.output)

    async def close(self) -> None:
        self.closed = True


async def _until(check, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_jobs_hand_the_executor_one_job_a_slot_and_keep_what_it_reports(ollie_dirs, tmp_path):
    executor = StandIn()
    jobs = Jobs(Sessions(default_cwd=str(tmp_path)), executor=executor)
    made = await jobs.submit("name=pair\nparallel=2\n---\nhello\n")
    assert executor.checked == ["pair-0"]
    await _until(lambda: executor.ran == ["pair-0"])
    assert [j.status for j in made] == ["running", "queued"]  # its one slot
    executor.release.set()
    await asyncio.gather(*(j.task for j in made if j.task is not None))
    assert [(j.status, j.record.result) for j in made] == [("done", "HELLO")] * 2
    assert made[0].usage().input_tokens == 3 and made[0].cost().session == 0.25
    assert made[0].record.model == "stand-in"
    await jobs.close()
    assert executor.closed


async def test_removing_a_running_job_cancels_it_in_its_executor(ollie_dirs, tmp_path):
    executor = StandIn()
    jobs = Jobs(Sessions(default_cwd=str(tmp_path)), executor=executor)
    (job,) = await jobs.submit("---\nwait\n")
    await _until(lambda: executor.ran == [job.id])
    await jobs.cancel(job.id)
    assert executor.cancelled == [job.id] and job.status == "cancelled"
    assert jobs.find(job.id) is None and not job.dir.exists()


def test_the_executor_is_the_one_ollie_batch_executor_names(ollie_dirs, tmp_path, monkeypatch):
    sessions = Sessions(default_cwd=str(tmp_path))
    assert isinstance(configured_executor(sessions), LocalExecutor)
    monkeypatch.setenv("OLLIE_BATCH_EXECUTOR", "slurm")
    with pytest.raises(OllieError, match="OLLIE_BATCH_EXECUTOR='slurm': give local or ray"):
        configured_executor(sessions)


def test_ray_is_imported_only_once_a_job_runs_on_it(ollie_dirs, tmp_path):
    code = (
        "import sys; from ollie.fs.jobs import Jobs, configured_executor; from ollie.fs.sessions import Sessions; "
        "import os; os.environ['OLLIE_BATCH_EXECUTOR'] = 'ray'; "
        "e = configured_executor(Sessions(default_cwd='.')); "
        "print(type(e).__name__, e.slots, 'ray' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.stdout.split() == ["RayExecutor", "10000", "False"], done.stderr


async def test_a_sessions_oldest_finished_jobs_make_room_for_new_ones(ollie_dirs, tmp_path, monkeypatch):
    """A long session's code (subagent_spawn at every turn) reached the cap of jobs kept, finished
    ones included, and could start no sub-agent again: the oldest finished ones without a worktree
    go instead, as a log rotates; unfinished ones and worktrees (a branch to merge) stay."""
    from ollie.fs import jobs as jobs_module

    monkeypatch.setattr(jobs_module, "JOBS_KEPT_PER_PARENT", 3)
    (ollie_dirs / "cfg" / "agents").mkdir(parents=True, exist_ok=True)
    (ollie_dirs / "cfg" / "lead.script.json").write_text("[]")
    model = ollie_dirs / "cfg" / "lead.script.json"
    (ollie_dirs / "cfg" / "agents" / "lead.json").write_text(f'{{"backend": "scripted", "model": "{model}"}}')
    sessions = Sessions(default_cwd=str(tmp_path))
    parent = await sessions.new({"agent": "lead", "cwd": str(tmp_path)})
    executor = StandIn()
    executor.release.set()
    jobs = Jobs(sessions, executor=executor)
    first = [(await jobs.submit(f"name=j{i}\n---\nhi\n", parent))[0] for i in range(3)]
    await asyncio.gather(*(j.task for j in first if j.task is not None))
    first[0].record.worktree = {"branch": "ollie/j0"}  # its branch is still to merge
    (fourth,) = await jobs.submit("name=j3\n---\nhi\n", parent)
    kept = [j.id for j in jobs.of(parent)]
    assert first[1].id not in kept and not first[1].dir.exists()  # the oldest without a worktree
    assert {first[0].id, first[2].id, fourth.id} == set(kept)
    await asyncio.gather(*(j.task for j in [fourth] if j.task is not None))
    executor.release.clear()  # two unfinished and the worktree: nothing may go
    await jobs.submit("name=j4\n---\nhi\n", parent)
    await jobs.submit("name=j5\n---\nhi\n", parent)
    with pytest.raises(OllieError, match="3 jobs a session at most, unfinished or with a worktree"):
        await jobs.submit("name=j6\n---\nhi\n", parent)
    executor.release.set()
    await jobs.close()
    await sessions.close()
