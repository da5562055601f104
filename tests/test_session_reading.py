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
