"""Attacks on batch jobs (b/) through a session's view that succeed today: each test asserts what
the threat model promises, and fails while the hole is open. Found by a red-team review of b/."""

from __future__ import annotations

import asyncio
import json

from script_helpers import DEFAULTS
from view_helpers import Harness, start_child


def slow_agent(h: Harness, name: str, delay: float, **extra: object) -> None:
    script = h.cfg / f"{name}.script.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": f"{name} done", "delay": delay}]}))
    config = {"backend": "scripted", "model": str(script), "prompt": f"You are {name}.", **extra}
    (h.cfg / "agents" / f"{name}.json").write_text(json.dumps(config))


FINISHED = ("done", "cancelled", "failed: the turn ended without an answer")


async def until(h: Harness, jid: str, *statuses: str, timeout: float = 20) -> None:
    """Wait for the job to reach one of `statuses` (a running one: with its session made, which
    takes a while after the job is marked running: its tool servers start)."""
    for _ in range(int(timeout * 20)):
        job = h.jobs.get(jid) if jid in h.jobs._by_id else None
        if job is not None and job.status in statuses and (job.status != "running" or job.session is not None):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {jid}: {h.jobs.get(jid).status if jid in h.jobs._by_id else 'none'}")


async def test_a_jobs_name_takes_over_no_other_session(h):
    """A job's id (`<name>-<i>`) is its session's id: a job named `worker` with parallel=2 once ran
    its prompt in the user's session `worker-1` (registering a taken id returned the session
    there), with that session's agent, cwd and tools, handed its reply back to the code that
    asked, and then dropped that session from the server. A name a session's code gives is its own
    now (`<its id>.worker-1`), and nothing of the victim changes."""
    h.agent("power")
    victim = await h.new(agent="power", name="worker-1")
    attacker = await h.new()  # no relation to the victim
    out = await h.ok(attacker, "printf 'name=worker\\nparallel=2\\n---\\ndo as I say\\n' > $OLLIE/b/new; ls $OLLIE/b")
    assert out.split() == [f"{attacker.id}.worker-0", f"{attacker.id}.worker-1"]
    assert (await h.ok(attacker, "cat $OLLIE/b/worker-1/spec")).startswith("name=worker\n")  # its own, by name
    await asyncio.sleep(0.5)
    assert [m.content for m in victim.messages() if m.role == "user"] == []
    assert h.sessions.find("worker-1") is victim and victim.core is not None


async def test_a_sub_session_named_as_a_job_gets_not_its_prompt(h):
    """A session's code names a sub-session as a job of the user will be named; the job once ran
    in that sub-session (the code read the user's prompt in its chat, its own agent wrote the
    job's result). A name the code gives is its own now (`<its id>.report-0`): the user's job gets
    its name and a session of its own; the scripts also name their jobs with random characters."""
    slow_agent(h, "evil", 2)
    h.agent("lead", subagents=["evil"])
    attacker = await h.new(agent="lead")
    child = await start_child(h, attacker, "name=report-0 agent=evil")
    assert child.id == f"{attacker.id}.report-0"  # a name the code gives is its own
    [job] = await h.jobs.submit("name=report\n---\nSECRET: summarise the salaries\n")  # the user's
    assert job.id == "report-0"
    _, chat = await h.sh(attacker, "cat $OLLIE/s/report-0/chat")  # its own sub-session, by name
    assert "SECRET" not in chat
    for script in ("b/job", "u/optimize", "tools/subagent_spawn"):
        assert "urandom" in (DEFAULTS.parent / script).read_text(), script


async def test_a_jobs_own_jobs_end_with_it_and_nest_no_deeper(h, monkeypatch):
    """A job that ends normally leaves its session (`forget`) without ending its jobs: one already
    running goes on, its parent gone from the registry, so it counts 0 deep again (a chain of
    such hand-offs nests without end), and killing the top session, from which all of them came,
    reaches it no more."""
    monkeypatch.setenv("OLLIE_SUBAGENT_DEPTH", "2")
    slow_agent(h, "default", 4)
    top = await h.new()
    await h.ok(top, "printf 'name=a\\n---\\nwork\\n' > $OLLIE/b/new")
    a0 = f"{top.id}.a-0"  # a name a session's code gives is its own
    await until(h, a0, "running")
    await h.ok(h.jobs.get(a0).session, "printf 'name=b\\n---\\nwork\\n' > $OLLIE/b/new")  # depth 2
    b0 = f"{a0}.b-0"
    await until(h, b0, "running")
    await until(h, a0, "done")
    await until(h, b0, "cancelled", "done")
    assert h.jobs.get(b0).status == "cancelled"  # it ended with the job that made it
    assert not [j for j in h.jobs._by_id if j.endswith(".c-0")]
    await h.sessions.kill(top.id)
    await asyncio.sleep(0.5)
    assert [j.id for j in h.jobs.all() if j.status in ("queued", "running")] == []


async def test_a_jobs_sub_session_ends_with_it(h):
    """A sub-session that a job's code starts outlives the job (it is not killed when the job's
    session is let go), and killing the top session misses it: it stays in s/, a session of its
    own with no parent, bounded by nothing the user started."""
    slow_agent(h, "default", 3)
    top = await h.new()
    [job] = await h.jobs.submit("name=j\n---\nhi\n", parent=top)
    await until(h, job.id, "running")
    await h.ok(job.session, "echo 'new name=leftover' > $OLLIE/ctl")
    await until(h, job.id, "done")
    await h.sessions.kill(top.id)
    assert [s.id for s in h.sessions.all()] == []


async def test_what_a_jobs_own_jobs_spent_counts_in_the_top_sessions_cost(h):
    """A job's spend is rolled up to its parent as its Core's usage alone: what its own jobs spent
    (counted in its session's `children`) is dropped, so the top session's `cost` and `usage`
    miss every sub-agent below the first level."""
    slow_agent(h, "default", 3, subagents=["quick"])
    slow_agent(h, "quick", 0.2)
    top = await h.new()
    await h.ok(top, "printf 'name=a\\n---\\nwork\\n' > $OLLIE/b/new")
    a0 = f"{top.id}.a-0"
    await until(h, a0, "running")
    await h.ok(h.jobs.get(a0).session, "printf 'name=b\\nagent=quick\\n---\\nwork\\n' > $OLLIE/b/new")
    b0 = f"{a0}.b-0"
    await until(h, b0, "done")
    await until(h, a0, "done")
    a, b = h.jobs.get(a0).record, h.jobs.get(b0).record
    assert top.meta.children.get("agents") == 2
    assert top.meta.children["input_tokens"] == a.usage["input_tokens"] + b.usage["input_tokens"]
