"""The Ollama backend against a local server speaking Ollama's native NDJSON API."""

import json

import pytest

from ollie import backends
from ollie.backends.ollama import base_url_from_env
from ollie.types import (
    BackendError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    RateLimitError,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    ToolUnsupportedError,
    TransientError,
    UsageChunk,
)
from wire import WireServer, stream_reply
from wire import ollama as wire

TOOL = ToolSpec("execute_code", "Run code", {"type": "object", "properties": {"code": {"type": "string"}}})


@pytest.fixture
def server(monkeypatch):
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    with WireServer() as s:
        monkeypatch.setenv("OLLIE_OLLAMA_URL", s.url)
        s.route(wire.SHOW, lambda req: wire.show(32768))
        yield s


async def run(messages, tools=(), params=None, model="llama3.2", **options):
    backend = backends.create("ollama", model=model, **options)
    try:
        return [c async for c in backend.stream(messages, list(tools), params or GenerationParams())]
    finally:
        await backend.aclose()


async def test_streams_text_thinking_and_usage(server):
    server.reply(
        wire.CHAT,
        wire.chat(
            [
                wire.chat_line(thinking="Hmm, "),
                wire.chat_line(thinking="easy."),
                wire.chat_line(content="Hel"),
                wire.chat_line(content="lo"),
                wire.done_line(prompt=26, output=12),
            ]
        ),
    )
    chunks = await run([Message("system", "Be brief."), Message("user", "hi")])

    assert "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)) == "Hmm, easy."
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hello"
    usage = next(c.usage for c in chunks if isinstance(c, UsageChunk))
    assert (usage.input_tokens, usage.output_tokens) == (26, 12)
    assert chunks[-1] == Done("stop")
    body = server.requests_to(wire.CHAT)[0].json
    assert body["model"] == "llama3.2" and body["stream"] is True
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


async def test_num_ctx_comes_from_api_show_once(server):
    for _ in range(2):
        server.reply(wire.CHAT, wire.chat([wire.done_line()]))
    backend = backends.create("ollama", model="llama3.2")
    for _ in range(2):
        [c async for c in backend.stream([Message("user", "hi")], [], GenerationParams())]
    assert await backend.context_length() == 32768
    await backend.aclose()
    assert [r.json["options"]["num_ctx"] for r in server.requests_to(wire.CHAT)] == [32768, 32768]
    assert len(server.requests_to(wire.SHOW)) == 1
    assert server.requests_to(wire.SHOW)[0].json == {"model": "llama3.2"}


@pytest.mark.parametrize(
    ("done_reason", "stop_reason", "reason"),
    [
        ("stop", "stop", ""),
        ("length", "length", "length"),
        ("unload", "other", "unload"),  # the model was unloaded mid-answer
        ("some_future_reason", "other", "some_future_reason"),
    ],
)
async def test_done_reason_becomes_the_stop_reason_and_ollamas_word(server, done_reason, stop_reason, reason):
    server.reply(wire.CHAT, wire.chat([wire.chat_line(content="So far"), wire.done_line(reason=done_reason)]))
    chunks = await run([Message("user", "hi")])
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "So far"
    assert chunks[-1] == Done(stop_reason, reason=reason)


async def test_generation_params_map_onto_ollama_options(server):
    server.reply(wire.CHAT, wire.chat([wire.done_line(reason="length")]))
    params = GenerationParams(
        temperature=0.2,
        top_p=0.9,
        top_k=30,
        min_p=0.05,
        repetition_penalty=1.1,
        max_tokens=64,
        stop=["\n\n"],
        reasoning_effort="high",
        response_format={"type": "json_object"},
    )
    chunks = await run([Message("user", "hi")], params=params)
    body = server.requests_to(wire.CHAT)[0].json
    assert body["options"] == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 30,
        "min_p": 0.05,
        "repeat_penalty": 1.1,
        "num_predict": 64,
        "stop": ["\n\n"],
        "num_ctx": 32768,
    }
    assert body["think"] == "high" and body["format"] == "json"
    assert chunks[-1].stop_reason == "length"


async def test_tool_calls_get_stable_ids_and_results_go_back_by_name(server):
    lines = [
        wire.chat_line(tool_calls=[wire.tool_call("execute_code", {"code": "echo hi"})]),
        wire.chat_line(tool_calls=[wire.tool_call("execute_code", {"code": "ls"})]),
        wire.done_line(),
    ]
    server.reply(wire.CHAT, wire.chat(lines), wire.chat(lines))
    history = [Message("user", "run")]
    first = await run(history, tools=[TOOL])
    again = await run(history, tools=[TOOL])

    calls = [c for c in first if isinstance(c, ToolCallDelta)]
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "execute_code", {"code": "echo hi"}),
        (1, "execute_code", {"code": "ls"}),
    ]
    assert calls[0].id and calls[0].id != calls[1].id
    assert [c.id for c in calls] == [c.id for c in again if isinstance(c, ToolCallDelta)]  # stable
    assert first[-1].stop_reason == "tool_calls"
    assert server.requests_to(wire.CHAT)[0].json["tools"] == [
        {
            "type": "function",
            "function": {"name": "execute_code", "description": "Run code", "parameters": TOOL.input_schema},
        }
    ]

    server.reply(wire.CHAT, wire.chat([wire.chat_line(content="hi"), wire.done_line()]))
    history += [
        Message("assistant", "", tool_calls=[ToolCall(calls[0].id, "execute_code", calls[0].arguments)]),
        Message("tool", "hi\n", tool_call_id=calls[0].id, name="execute_code"),
    ]
    await run(history, tools=[TOOL])
    sent = server.requests_to(wire.CHAT)[-1].json["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "execute_code", "arguments": {"code": "echo hi"}}}],
    }
    assert sent[2] == {"role": "tool", "content": "hi\n", "tool_name": "execute_code"}


async def test_models_from_api_tags(server):
    server.reply(wire.TAGS, wire.tags(["qwen3:8b", "llama3.2:latest"]))
    backend = backends.create("ollama")
    assert await backend.models() == ["llama3.2:latest", "qwen3:8b"]
    await backend.aclose()


async def test_unknown_model_names_it(server):
    server.route(wire.SHOW, lambda req: wire.error(404, f"model '{req.json['model']}' not found"))
    with pytest.raises(BackendError, match=r"ollama \(HTTP 404\): model 'nope' not found"):
        await run([Message("user", "hi")], model="nope")


async def test_tool_unsupported(server):
    server.reply(wire.CHAT, wire.error(400, "registry.ollama.ai/library/gemma:2b does not support tools"))
    with pytest.raises(ToolUnsupportedError, match="does not support tools"):
        await run([Message("user", "hi")], tools=[TOOL], model="gemma:2b")


async def test_rate_limit_and_server_errors(server):
    server.reply(
        wire.CHAT, wire.error(429, "too many requests"), wire.error(500, "llama runner process has terminated")
    )
    with pytest.raises(RateLimitError):
        await run([Message("user", "hi")])
    with pytest.raises(TransientError, match=r"ollama \(HTTP 500\): llama runner process has terminated"):
        await run([Message("user", "hi")])


async def test_error_line_mid_stream_is_transient(server):
    server.reply(
        wire.CHAT,
        wire.chat([wire.chat_line(content="par"), {"error": "an error was encountered while running the model"}]),
    )
    with pytest.raises(TransientError, match="while running the model"):
        await run([Message("user", "hi")])


async def test_overflow_reported_mid_stream_is_a_context_overflow(server):
    server.reply(wire.CHAT, wire.chat([{"error": "the input length exceeds the context length"}]))
    with pytest.raises(ContextOverflowError):
        await run([Message("user", "hi")])


async def test_a_malformed_line_is_an_error_naming_the_provider(server):
    server.reply(
        wire.CHAT,
        stream_reply(
            [b'{"message": {"content": "hi"}, "done": false}\n', b"<html>oops\n"], content_type="application/x-ndjson"
        ),
    )
    with pytest.raises(BackendError, match="ollama: malformed stream line: '<html>oops'"):
        await run([Message("user", "hi")])


async def test_arguments_given_as_json_text_stay_that_text(server):
    server.reply(
        wire.CHAT,
        wire.chat([wire.chat_line(tool_calls=[wire.tool_call("execute_code", '{"code": "ls"}')]), wire.done_line()]),
    )
    [call] = [c for c in await run([Message("user", "go")], tools=[TOOL]) if isinstance(c, ToolCallDelta)]
    assert json.loads(call.arguments) == {"code": "ls"}


@pytest.mark.parametrize("cut", [True, False], ids=["connection-dropped", "ended-early"])
async def test_stream_cut_mid_way_is_transient(server, cut):
    server.reply(wire.CHAT, wire.chat([wire.chat_line(content="par")], cut=cut))
    with pytest.raises(TransientError):
        await run([Message("user", "hi")])


async def test_nothing_listening_fails_at_once_and_names_the_url(monkeypatch):
    """A refused connection is no hiccup: the Core does not retry it (issue 29)."""
    monkeypatch.setenv("OLLIE_OLLAMA_URL", "http://127.0.0.1:9")
    with pytest.raises(BackendError, match="ollama: cannot reach http://127.0.0.1:9/api/show: connection refused") as e:
        await run([Message("user", "hi")])
    assert not isinstance(e.value, TransientError) and "OLLIE_OLLAMA_URL" in str(e.value)


async def test_explicit_num_ctx_skips_api_show(server):
    server.reply(wire.CHAT, wire.chat([wire.done_line()]))
    await run([Message("user", "hi")], num_ctx=4096)
    assert server.requests_to(wire.CHAT)[0].json["options"] == {"num_ctx": 4096}
    assert not server.requests_to(wire.SHOW)


@pytest.mark.parametrize(
    "env, url",
    [
        ({}, "http://localhost:11434"),
        ({"OLLAMA_HOST": "0.0.0.0"}, "http://0.0.0.0:11434"),
        ({"OLLAMA_HOST": "gpu-box:11500"}, "http://gpu-box:11500"),
        ({"OLLAMA_HOST": "https://ollama.example/"}, "https://ollama.example"),
        ({"OLLIE_OLLAMA_URL": "http://127.0.0.1:8000", "OLLAMA_HOST": "ignored:1"}, "http://127.0.0.1:8000"),
    ],
)
def test_base_url_from_env(monkeypatch, env, url):
    for var in ("OLLIE_OLLAMA_URL", "OLLAMA_HOST"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert base_url_from_env() == url
