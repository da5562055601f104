"""Attacks on batch jobs (b/) through a session's view that succeed today: each test asserts what
the threat model promises, and fails while the hole is open. Found by a red-team review of b/."""

from __future__ import annotations

import asyncio
import errno
import json

from ollie.fs.namespace import FsError
from script_helpers import DEFAULTS
from view_helpers import Harness, start_child


def slow_agent(h: Harness, name: str, delay: float, **extra: object) -> None:
    script = h.cfg / f"{name}.script.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": f"{name} done", "delay": delay}]}))
    config = {"backend": "scripted", "model": str(script), "prompt": f"You are {name}.", **extra}
    (h.cfg / "agents" / f"{name}.json").write_text(json.dumps(config))


FINISHED = ("done", "cancelled", "failed: the turn ended without an answer")


async def until(h: Harness, jid: str, *statuses: str, timeout: float = 20) -> None:
    for _ in range(int(timeout * 20)):
        if jid in h.jobs._by_id and h.jobs.get(jid).status in statuses:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {jid}: {h.jobs.get(jid).status if jid in h.jobs._by_id else 'none'}")


async def test_a_jobs_name_takes_over_no_other_session(h):
    """A job's id (`<name>-<i>`) is its session's id: a job named `worker` with parallel=2 once ran
    its prompt in the user's session `worker-1` (registering a taken id returned the session
    there), with that session's agent, cwd and tools, handed its reply back to the code that
    asked, and then dropped that session from the server. Session and job ids are one space now:
    the spec is refused, and nothing of the victim changes."""
    h.agent("power")
    victim = await h.new(agent="power", name="worker-1")
    attacker = await h.new()  # no relation to the victim
    out = await h.ok(attacker, "printf 'name=worker\\nparallel=2\\n---\\ndo as I say\\n' > $OLLIE/b/new; ls $OLLIE/b")
    assert out == ""  # no job was made
    await asyncio.sleep(0.5)
    assert "name 'worker' is taken" in attacker.chat_path.read_text()
    assert [m.content for m in victim.messages() if m.role == "user"] == []
    assert h.sessions.find("worker-1") is victim and victim.core is not None


async def test_a_sub_session_named_as_a_job_gets_not_its_prompt(h):
    """A session's code names a sub-session as a job of the user will be named; the job once ran
    in that sub-session (the code read the user's prompt in its chat, its own agent wrote the
    job's result). The user's spec is refused now (the name is taken), and the scripts name their
    jobs with random characters, so that such a name cannot be guessed."""
    slow_agent(h, "evil", 2)
    h.agent("lead", subagents=["evil"])
    attacker = await h.new(agent="lead")
    await start_child(h, attacker, "name=report-0 agent=evil")
    try:
        await h.jobs.submit("name=report\n---\nSECRET: summarise the salaries\n")  # the user's
    except FsError as e:
        assert e.errno == errno.EEXIST
    else:
        raise AssertionError("a job took the name of another session's sub-session")
    _, chat = await h.sh(attacker, "cat $OLLIE/s/report-0/chat")
    assert "SECRET" not in chat
    for script in ("b/job", "utils/optimize", "tools/subagent_spawn"):
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
    await until(h, "a-0", "running")
    await h.ok(h.jobs.get("a-0").session, "printf 'name=b\\n---\\nwork\\n' > $OLLIE/b/new")  # depth 2
    await until(h, "b-0", "running")
    await until(h, "a-0", "done")
    await until(h, "b-0", "cancelled", "done")
    assert h.jobs.get("b-0").status == "cancelled"  # it ended with the job that made it
    assert "c-0" not in h.jobs._by_id
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
    await until(h, "a-0", "running")
    await h.ok(h.jobs.get("a-0").session, "printf 'name=b\\nagent=quick\\n---\\nwork\\n' > $OLLIE/b/new")
    await until(h, "b-0", "done")
    await until(h, "a-0", "done")
    a, b = h.jobs.get("a-0").record, h.jobs.get("b-0").record
    assert top.meta.children.get("agents") == 2
    assert top.meta.children["input_tokens"] == a.usage["input_tokens"] + b.usage["input_tokens"]
