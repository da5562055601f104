"""The scripted backend's stop reasons: what a script says is what the stream's Done says."""

import pytest

from ollie.backends.scripted import ScriptedBackend, ScriptError
from ollie.types import ConfigError, Done, GenerationParams, Message


async def last_chunk(turn):
    backend = ScriptedBackend([turn])
    chunks = [c async for c in backend.stream([Message("user", "hi")], [], GenerationParams())]
    backend.assert_consumed()
    return chunks[-1]


@pytest.mark.parametrize(
    ("turn", "done"),
    [
        ({"text": "hello"}, Done("stop")),
        ({"tool_calls": [{"name": "t", "arguments": {}}]}, Done("tool_calls")),
        ({"text": "hel", "stop_reason": "length"}, Done("length", reason="length")),
        ({"text": "I", "stop_reason": "content_filter"}, Done("content_filter", reason="content_filter")),
        ({"text": "No.", "stop_reason": "refusal"}, Done("refusal", reason="refusal")),
        ({"text": "so far", "stop_reason": "other"}, Done("other", reason="other")),
        ({"text": "so far", "stop_reason": "pause_turn"}, Done("other", reason="pause_turn")),  # unknown: other
    ],
    ids=["default", "tool calls", "length", "content_filter", "refusal", "other", "unknown"],
)
async def test_a_scripts_stop_reason_reaches_done(turn, done):
    assert await last_chunk(turn) == done


def test_an_empty_script_is_a_script_not_a_file_named_after_the_model():
    """`open_session(backend="scripted", script=[])` read a file called "scripted"."""
    backend = ScriptedBackend.from_options(model=None, script=[])
    assert backend.model == "scripted"
    with pytest.raises(ConfigError, match="give a script"):
        ScriptedBackend.from_options(model=None, script=None)


async def test_a_scripted_backend_built_in_a_test_drives_a_session_and_is_checked_afterwards(tmp_path):
    """The README's "Testing your own agents": the backend built in the test is the session's, so
    the test can see what its script was asked (a name alone made a backend the test never held)."""
    from ollie import open_session

    (tmp_path / "README.md").write_text("hi\n")
    (tmp_path / "main.py").write_text("")
    backend = ScriptedBackend(
        [
            {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "ls"}]}}]},
            {"text": "Two files.", "expect": "README.md"},
            {"text": "never asked"},
        ]
    )
    async with open_session(backend=backend, cwd=str(tmp_path)) as core:
        assert core.backend is backend
        await core.submit("what is here?")
        assert core.reply == "Two files."
        with pytest.raises(ScriptError, match="never asked"):
            backend.assert_consumed()  # the third turn was never requested
    with pytest.raises(ConfigError, match="no model or script"):
        await open_session(backend=ScriptedBackend([]), model="other", cwd=str(tmp_path))
