"""The scripted backend's stop reasons: what a script says is what the stream's Done says."""

import pytest

from ollie.backends.scripted import ScriptedBackend
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
