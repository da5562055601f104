"""The Anthropic backend against a local server speaking the Messages API's SSE wire format."""

import json

import pytest

from ollie import backends
from ollie.types import (
    BackendError,
    ConfigError,
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
from wire import WireServer, sse, stream_reply
from wire import anthropic as wire

TOOL = ToolSpec("execute_code", "Run code", {"type": "object", "properties": {"code": {"type": "string"}}})
OTHER = ToolSpec("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})


@pytest.fixture
def server(monkeypatch):
    for var in ("OLLIE_ANTHROPIC_KEY", "ANTHROPIC_API_KEY", "OLLIE_ANTHROPIC_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    with WireServer() as s:
        monkeypatch.setenv("OLLIE_ANTHROPIC_KEY", "sk-test")
        monkeypatch.setenv("OLLIE_ANTHROPIC_URL", s.url)
        yield s


async def run(messages, tools=(), params=None, model=None):
    backend = backends.create("anthropic", model=model)
    try:
        return [c async for c in backend.stream(messages, list(tools), params or GenerationParams())]
    finally:
        await backend.aclose()


def text_of(chunks, kind=TextDelta):
    return "".join(c.text for c in chunks if isinstance(c, kind))


def calls_of(chunks):
    calls = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            call = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += c.id
            call["name"] += c.name
            call["arguments"] += c.arguments
    return [calls[i] for i in sorted(calls)]


async def test_streams_text_usage_and_sends_a_cached_system_prompt(server):
    server.reply(
        wire.PATH,
        wire.stream(
            [{"type": "text", "text": "Hello there"}],
            start_usage=wire.usage(input_tokens=12, cache_read=100, cache_write=30),
            output_tokens=7,
        ),
    )
    chunks = await run([Message("system", "Be brief."), Message("user", "hi")])

    assert text_of(chunks) == "Hello there"
    usage = next(c.usage for c in chunks if isinstance(c, UsageChunk))
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        12,
        7,
        100,
        30,
    )
    assert chunks[-1] == Done("stop")

    [req] = server.requests
    assert "sk-test" in req.headers.get("x-api-key", "") + req.headers.get("authorization", "")
    body = req.json
    assert body["model"] == "claude-sonnet-4-6" and body["stream"] is True and body["max_tokens"] == 8192
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert "thinking" not in body and "tools" not in body


async def test_tool_use_streams_as_call_deltas_and_the_last_tool_is_cached(server):
    server.reply(
        wire.PATH,
        wire.stream(
            [
                {"type": "text", "text": "Running."},
                {"type": "tool_use", "id": "toolu_1", "name": "execute_code", "input": {"code": "echo hi"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {}},
            ],
            stop_reason="tool_use",
        ),
    )
    chunks = await run([Message("user", "run it")], tools=[TOOL, OTHER])

    assert calls_of(chunks) == [
        {"id": "toolu_1", "name": "execute_code", "arguments": json.dumps({"code": "echo hi"})},
        {"id": "toolu_2", "name": "read_file", "arguments": "{}"},
    ]
    assert chunks[-1].stop_reason == "tool_calls"
    tools = server.requests[0].json["tools"]
    assert [t["name"] for t in tools] == ["execute_code", "read_file"]
    assert "cache_control" not in tools[0] and tools[1]["cache_control"] == {"type": "ephemeral"}
    assert tools[0]["input_schema"] == TOOL.input_schema


async def test_consecutive_tool_results_become_one_user_message_and_a_large_last_one_is_cached(server):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "ok"}]))
    big = "x" * 5000
    history = [
        Message("user", "do two things"),
        Message(
            "assistant",
            "Sure.",
            tool_calls=[ToolCall("t1", "execute_code", '{"code": "a"}'), ToolCall("t2", "read_file", '{"path": "b"}')],
        ),
        Message("tool", "out a", tool_call_id="t1", name="execute_code"),
        Message("tool", big, tool_call_id="t2", name="read_file", is_error=True),
    ]
    await run(history, tools=[TOOL, OTHER])

    msgs = server.requests[0].json["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "t1", "name": "execute_code", "input": {"code": "a"}},
        {"type": "tool_use", "id": "t2", "name": "read_file", "input": {"path": "b"}},
    ]
    assert msgs[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "out a"},
        {
            "type": "tool_result",
            "tool_use_id": "t2",
            "content": big,
            "is_error": True,
            "cache_control": {"type": "ephemeral"},
        },
    ]


async def test_small_last_tool_result_is_not_cached(server):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "ok"}]))
    await run(
        [
            Message("user", "go"),
            Message("assistant", "", tool_calls=[ToolCall("t1", "execute_code", "{}")]),
            Message("tool", "tiny", tool_call_id="t1"),
        ],
        tools=[TOOL],
    )
    assert "cache_control" not in server.requests[0].json["messages"][-1]["content"][0]


async def test_thinking_streams_reasoning_and_its_signed_blocks_go_back_next_time(server):
    thought = {"type": "thinking", "thinking": "Let me think about it.", "signature": "sig-abc=="}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    server.reply(
        wire.PATH,
        wire.stream(
            [thought, redacted, {"type": "tool_use", "id": "t1", "name": "execute_code", "input": {"code": "ls"}}],
            stop_reason="tool_use",
        ),
        wire.stream([{"type": "text", "text": "done"}]),
    )
    params = GenerationParams(reasoning_budget=2048, temperature=0.2, top_k=40, top_p=0.5)
    history = [Message("user", "list files")]
    chunks = await run(history, tools=[TOOL], params=params)

    assert text_of(chunks, ReasoningDelta) == "Let me think about it."
    done = chunks[-1]
    assert done.provider_data == {"anthropic_thinking": [thought, redacted]}
    first = server.requests[0]
    assert first.json["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert not {"temperature", "top_k", "top_p"} & set(first.json)  # thinking forbids them
    assert "interleaved-thinking" in first.headers["anthropic-beta"]

    [call] = calls_of(chunks)
    history += [
        Message("assistant", "", tool_calls=[ToolCall(**call)], provider_data=done.provider_data),
        Message("tool", "a.txt", tool_call_id="t1"),
    ]
    await run(history, tools=[TOOL], params=params)
    sent = server.requests[1].json["messages"][1]["content"]
    assert sent[:2] == [thought, redacted] and sent[2]["type"] == "tool_use"


async def test_without_tools_past_calls_and_results_go_as_text(server):
    """The API refuses tool_use/tool_result blocks in a request without tools: the Core's last
    answer after the step budget is such a request."""
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "summary"}]))
    thought = {"type": "thinking", "thinking": "hm", "signature": "sig"}
    history = [
        Message("user", "go"),
        Message(
            "assistant",
            "Looking.",
            tool_calls=[ToolCall("t1", "execute_code", '{"code": "ls"}')],
            provider_data={"anthropic_thinking": [thought]},
        ),
        Message("tool", "a.txt", tool_call_id="t1", is_error=True),
        Message("user", "[The step budget is exhausted. Summarize.]"),
    ]
    await run(history, params=GenerationParams(reasoning_budget=2048))
    msgs = server.requests[0].json["messages"]
    assert msgs[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Looking."},
            {"type": "text", "text": '[Tool call: execute_code({"code": "ls"})]'},
        ],
    }
    assert msgs[2] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "[Tool result (error)]: a.txt"},
            {"type": "text", "text": "[The step budget is exhausted. Summarize.]"},
        ],
    }


async def test_arguments_that_are_no_json_object_are_sent_as_an_object(server):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "ok"}]))
    history = [
        Message("user", "go"),
        Message(
            "assistant",
            "",
            tool_calls=[ToolCall("t1", "execute_code", "[1, 2]"), ToolCall("t2", "execute_code", "{oops")],
        ),
        Message("tool", "bad", tool_call_id="t1"),
        Message("tool", "bad", tool_call_id="t2"),
    ]
    await run(history, tools=[TOOL])
    inputs = [b["input"] for b in server.requests[0].json["messages"][1]["content"]]
    assert inputs == [{"_raw": "[1, 2]"}, {"_raw": "{oops"}]


async def test_a_malformed_event_is_an_error_naming_the_provider(server):
    server.reply(wire.PATH, stream_reply([b"event: message_start\ndata: {not json\n\n"]))
    with pytest.raises(BackendError, match="anthropic: malformed stream event"):
        await run([Message("user", "hi")])


async def test_thinking_budget_larger_than_max_tokens_leaves_room_for_the_answer(server):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "ok"}]))
    await run([Message("user", "hi")], params=GenerationParams(reasoning_budget=10000, max_tokens=4000))
    assert server.requests[0].json["max_tokens"] > 10000


async def test_sampling_params_and_stop_sequences_without_thinking(server):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "ok"}], stop_reason="max_tokens"))
    chunks = await run(
        [Message("user", "hi")], params=GenerationParams(temperature=0.3, top_k=5, max_tokens=100, stop=["END"])
    )
    body = server.requests[0].json
    assert (body["temperature"], body["top_k"], body["max_tokens"], body["stop_sequences"]) == (0.3, 5, 100, ["END"])
    assert chunks[-1].stop_reason == "length"


@pytest.mark.parametrize(
    ("api_reason", "stop_reason", "reason"),
    [
        ("end_turn", "stop", ""),
        ("stop_sequence", "stop", ""),
        ("max_tokens", "length", "max_tokens"),
        ("refusal", "refusal", "refusal"),
        ("pause_turn", "other", "pause_turn"),  # a server tool's long turn: ollie cannot resume it
        ("some_future_reason", "other", "some_future_reason"),
    ],
)
async def test_stop_reason_and_the_apis_own_word_for_it(server, api_reason, stop_reason, reason):
    server.reply(wire.PATH, wire.stream([{"type": "text", "text": "I can"}], stop_reason=api_reason))
    chunks = await run([Message("user", "hi")])
    assert text_of(chunks) == "I can"
    assert chunks[-1] == Done(stop_reason, reason=reason)


async def test_rate_limit_carries_retry_after_and_the_sdk_does_not_retry(server):
    server.reply(
        wire.PATH,
        wire.error(429, "rate_limit_error", "Number of request tokens has exceeded your limit", {"retry-after": "7"}),
    )
    with pytest.raises(RateLimitError) as e:
        await run([Message("user", "hi")])
    assert e.value.retry_after == 7
    assert "anthropic (HTTP 429)" in str(e.value) and "exceeded your limit" in str(e.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status, kind", [(500, "api_error"), (529, "overloaded_error")])
async def test_server_errors_and_overload_are_transient(server, status, kind):
    server.reply(wire.PATH, wire.error(status, kind, "Overloaded"))
    with pytest.raises(TransientError, match=f"anthropic \\(HTTP {status}\\): Overloaded"):
        await run([Message("user", "hi")])
    assert len(server.requests) == 1


async def test_error_event_mid_stream_is_transient(server):
    events = wire.message_events([{"type": "text", "text": "partial answer"}])[:5]
    events.append(("error", wire.error_body("overloaded_error", "Overloaded")))
    server.reply(wire.PATH, stream_reply(sse(events)))
    seen = []
    with pytest.raises(TransientError, match="Overloaded"):
        async for chunk in backends.create("anthropic").stream([Message("user", "hi")], [], GenerationParams()):
            seen.append(chunk)
    assert not any(isinstance(c, Done) for c in seen)


@pytest.mark.parametrize("cut", [True, False], ids=["connection-dropped", "ended-early"])
async def test_a_stream_cut_mid_way_is_transient(server, cut):
    events = wire.message_events([{"type": "text", "text": "partial answer"}])[:5]
    server.reply(wire.PATH, stream_reply(sse(events), cut=cut))
    with pytest.raises(TransientError):
        await run([Message("user", "hi")])


async def test_context_overflow(server):
    server.reply(
        wire.PATH, wire.error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")
    )
    with pytest.raises(ContextOverflowError, match="prompt is too long"):
        await run([Message("user", "hi")])


async def test_tool_unsupported(server):
    server.reply(wire.PATH, wire.error(400, "invalid_request_error", "This model does not support tools"))
    with pytest.raises(ToolUnsupportedError):
        await run([Message("user", "hi")], tools=[TOOL])


async def test_other_client_errors_name_provider_status_and_message(server):
    server.reply(wire.PATH, wire.error(401, "authentication_error", "invalid x-api-key"))
    with pytest.raises(BackendError) as e:
        await run([Message("user", "hi")])
    assert type(e.value) is BackendError and e.value.status == 401
    assert str(e.value) == "anthropic (HTTP 401): invalid x-api-key"


async def test_a_refused_connection_fails_at_once_naming_the_url(monkeypatch):
    """A refused connection is no hiccup: the Core does not retry it (issue 29)."""
    monkeypatch.setenv("OLLIE_ANTHROPIC_KEY", "k")
    monkeypatch.setenv("OLLIE_ANTHROPIC_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(
        BackendError, match="anthropic: cannot reach http://127.0.0.1:9/v1/messages: connection refused"
    ) as e:
        await run([Message("user", "hi")])
    assert not isinstance(e.value, TransientError) and "OLLIE_ANTHROPIC_URL" in str(e.value)


def test_missing_key_names_both_variables(monkeypatch):
    monkeypatch.delenv("OLLIE_ANTHROPIC_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OLLIE_ANTHROPIC_KEY or ANTHROPIC_API_KEY"):
        backends.create("anthropic")


async def test_models_and_context_length(server):
    server.reply(
        "/v1/models",
        wire.json_reply(
            {
                "data": [
                    {
                        "type": "model",
                        "id": "claude-sonnet-4-6",
                        "display_name": "Sonnet",
                        "created_at": "2025-09-29T00:00:00Z",
                    },
                    {
                        "type": "model",
                        "id": "claude-haiku-4-5",
                        "display_name": "Haiku",
                        "created_at": "2025-10-01T00:00:00Z",
                    },
                ],
                "has_more": False,
                "first_id": "claude-sonnet-4-6",
                "last_id": "claude-haiku-4-5",
            }
        ),
    )
    server.reply(
        "/v1/models/claude-sonnet-4-6",
        wire.json_reply(
            {
                "type": "model",
                "id": "claude-sonnet-4-6",
                "display_name": "Sonnet",
                "created_at": "2025-09-29T00:00:00Z",
                "max_input_tokens": 1000000,
            }
        ),
    )
    backend = backends.create("anthropic")
    assert await backend.models() == ["claude-haiku-4-5", "claude-sonnet-4-6"]
    assert await backend.context_length() == 1000000
    assert await backend.context_length() == 1000000
    assert len(server.requests_to("/v1/models/claude-sonnet-4-6")) == 1  # cached
    await backend.aclose()
