"""A session reads the same awake (from its Core) and asleep (from what is stored), and reading an
asleep one wakes nothing (fs/reading.py)."""

from __future__ import annotations

from typing import Any

from ollie.fs.sessions import Session, Sessions


def answers(s: Session) -> dict[str, Any]:
    """Everything the files ask of a session."""
    settings = s.settings()
    return {
        "id": s.id,
        "chat_path": s.chat_path,
        "state": s.state,
        "reply": s.reply,
        "last_prompt": s.last_prompt,
        "plan": s.plan,
        "usage": s.usage(),
        "cost": s.cost(),
        "context_size": s.context_size(),
        "system_prompt": s.system_prompt(),
        "env": s.env(),
        "messages": [m.to_dict() for m in s.messages()],
        "settings": {**settings, "params": settings["params"].nonempty()},
        "prompt_offset": s.prompt_offset(),
        "checkpoints": s.checkpoints().listing(),
    }


async def test_a_session_reads_the_same_asleep_as_awake_and_reading_wakes_nothing(h):
    awake = await h.new()
    core = await awake.wake()
    core.session.set_env("A", "b")
    core.session.set_param("temperature", 0.5)
    core.session.set_plan("1. a step\n")
    await core.submit("first")
    await core.submit("second")
    seen = answers(awake)
    assert seen["reply"] == "default says ok" and seen["last_prompt"] == "second" and seen["usage"].requests
    await h.sessions.close()

    again = Sessions(default_cwd=str(h.work))
    again.restore()
    asleep = again.get(awake.id)
    try:
        assert answers(asleep) == seen
        assert asleep.core is None
    finally:
        await again.close()


async def test_reading_a_sessions_chat_makes_its_text_stream_as_it_comes(h, monkeypatch):
    """The server's own watch of a session follows none of its text: an answer then gathers in
    its stream (agent/events.py). A subscriber that shows the text follows it while subscribed;
    an open or a read of `chat` (a `tail -f`, the terminal UI's poll, a web page) is a look, after
    which the text streams as it comes for FOLLOW_LINGER seconds (here 0.2)."""
    import asyncio

    from ollie.agent import events
    from ollie.fs.session_files import SESSION_FILES
    from ollie.vfs.namespace import OpenMode

    monkeypatch.setattr(events, "FOLLOW_LINGER", 0.2)
    s = await h.new()
    core = await s.wake()
    assert not core.followed
    unsubscribe = core.subscribe(lambda ev: None)  # a frontend that shows the text
    assert core.followed
    unsubscribe()
    core.subscribe(lambda ev: None, follows=False)  # one that watches for states and errors
    assert not core.followed
    handle = await SESSION_FILES["chat"](s, None).open(OpenMode.READ)
    assert core.followed  # the open
    await asyncio.sleep(0.3)
    assert not core.followed  # the look has lapsed
    await handle.read(0, 4096)
    assert core.followed  # the read
    await handle.release()


async def test_reading_a_jobs_log_makes_its_sessions_text_stream_as_it_comes(h):
    """A job's `log` is its session's chat: a look at it is a look at the session's."""
    import asyncio
    import json

    from ollie.fs.job_files import JOB_FILES
    from ollie.vfs.namespace import OpenMode

    script = h.cfg / "slow.script.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "slow done", "delay": 3}]}))
    (h.cfg / "agents" / "slow.json").write_text(json.dumps({"backend": "scripted", "model": str(script)}))
    [job] = await h.jobs.submit("agent=slow\n---\nwork\n")
    for _ in range(200):  # its session is made a while after the job starts (its tool servers start)
        if job.session is not None and job.session.core is not None:
            break
        await asyncio.sleep(0.05)
    core = job.session.core
    assert core is not None and not core.followed
    handle = await JOB_FILES["log"](job).open(OpenMode.READ)
    await handle.release()
    assert core.followed
