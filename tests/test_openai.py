"""The OpenAI-compatible backend against a local server speaking the Chat Completions wire format."""

from __future__ import annotations

import os

import pytest

from agent_helpers import ToyServer
from ollie import backends
from ollie.agent.core import Core, CoreConfig
from ollie.agent.env import build_agent_env
from ollie.config import AgentConfig
from ollie.tools import dispatcher_factory
from ollie.types import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    RateLimitError,
    TextDelta,
    ToolCall,
    ToolSpec,
    TransientError,
    UsageChunk,
)
from wire import WireServer, json_reply, sse, stream_reply
from wire.openai import PATH, chunk, text_stream, tool_call_stream


@pytest.fixture
def server():
    with WireServer() as s:
        yield s


def backend(server, **kw):
    return backends.create("openai", "gpt-4o-mini", base_url=server.url + "/v1", api_key="sk-test", **kw)


async def collect(be, messages=None, tools=(), params=None):
    return [c async for c in be.stream(messages or [Message("user", "hi")], list(tools), params or GenerationParams())]


async def test_text_stream_usage_and_request_body(server):
    server.reply(PATH, text_stream("Hello there"))
    be = backend(server)
    chunks = await collect(be, params=GenerationParams(temperature=0.2, max_tokens=50))
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hello there"
    assert [c.usage.input_tokens for c in chunks if isinstance(c, UsageChunk)] == [12]
    assert isinstance(chunks[-1], Done) and chunks[-1].stop_reason == "stop"
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer sk-test"
    body = req.json
    assert body["model"] == "gpt-4o-mini" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    await be.aclose()


async def test_tool_calls_assembled_by_index_and_sent_back(server):
    server.reply(PATH, tool_call_stream([("call_a", "echo", '{"text": "one"}'), ("call_b", "echo", '{"text": "two"}')]))
    be = backend(server)
    tools = [ToolSpec("echo", "echo text", {"type": "object"})]
    history = [
        Message("user", "hi"),
        Message("assistant", "", tool_calls=[ToolCall("c0", "echo", '{"text":"z"}')]),
        Message("tool", "z", tool_call_id="c0", name="echo"),
    ]
    chunks = await collect(be, history, tools)
    assert chunks[-1] == Done("tool_calls")
    body = server.requests[0].json
    assert body["tools"] == [
        {"type": "function", "function": {"name": "echo", "description": "echo text", "parameters": {"type": "object"}}}
    ]
    assert body["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "echo", "arguments": '{"text":"z"}'}}],
    }
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c0", "content": "z"}
    await be.aclose()


async def test_tools_sent_as_they_are_at_each_request(server):
    """The tools' JSON is made once while they stay the same: a change of tools (a server added, a
    schema replaced) is sent as it is, and `extra_body` still overrides them."""
    echo = ToolSpec("echo", "echo text", {"type": "object"})
    read = ToolSpec("read", "read a file", {"type": "object", "properties": {"path": {"type": "string"}}})
    narrower = ToolSpec("echo", "echo text", {"type": "object", "required": ["text"]})
    be = backend(server)
    for tools in ([echo], [echo], [ToolSpec("echo", "echo text", {"type": "object"})], [echo, read], [narrower], []):
        server.reply(PATH, text_stream("ok"))
        await collect(be, tools=tools)
        body = server.requests[-1].json
        sent = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in tools
        ]
        assert body.get("tools", []) == sent and body["messages"] == [{"role": "user", "content": "hi"}]
    server.reply(PATH, text_stream("ok"))
    await collect(backend(server, extra_body={"tools": []}), tools=[echo])
    assert server.requests[-1].json["tools"] == []
    await be.aclose()


@pytest.mark.parametrize(
    ("finish", "stop_reason", "reason"),
    [
        ("stop", "stop", ""),
        ("function_call", "tool_calls", ""),  # the deprecated spelling
        ("length", "length", "length"),
        ("content_filter", "content_filter", "content_filter"),
        ("sensitive", "other", "sensitive"),  # a reason ollie does not know (some providers' own)
        ("eos", "stop", "eos"),  # Together's word for an answer that ended
        ("eos_token", "stop", "eos_token"),  # TGI's and watsonx's
    ],
)
async def test_finish_reason_becomes_the_stop_reason_and_the_providers_word(server, finish, stop_reason, reason):
    server.reply(PATH, text_stream("What it said so far", finish=finish))
    be = backend(server)
    chunks = await collect(be)
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "What it said so far"
    assert isinstance(chunks[-2], UsageChunk)  # the usage chunk after the finish_reason is not lost
    assert chunks[-1] == Done(stop_reason, reason=reason)
    await be.aclose()


async def test_reasoning_deltas_in_both_spellings(server):
    server.reply(
        PATH,
        stream_reply(
            sse(
                [
                    (None, chunk({"reasoning_content": "think A "})),
                    (None, chunk({"reasoning": "think B"})),
                    (None, chunk({"content": "answer"}, "stop")),
                    (None, "[DONE]"),
                ]
            )
        ),
    )
    be = backend(server)
    chunks = await collect(be)
    assert "".join(c.text for c in chunks if type(c).__name__ == "ReasoningDelta") == "think A think B"
    await be.aclose()


async def test_http_errors_map_onto_the_taxonomy(server):
    server.reply(
        PATH,
        json_reply({"error": {"message": "Rate limit reached", "type": "requests"}}, 429, {"retry-after": "7"}),
        json_reply({"error": {"message": "upstream broke"}}, 500),
        json_reply(
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens",
                    "code": "context_length_exceeded",
                }
            },
            400,
        ),
        json_reply({"error": {"message": "bad request: unknown field"}}, 400),
    )
    be = backend(server)
    with pytest.raises(RateLimitError) as e:
        await collect(be)
    assert e.value.retry_after == 7 and "HTTP 429" in str(e.value) and "Rate limit reached" in str(e.value)
    with pytest.raises(TransientError, match="upstream broke"):
        await collect(be)
    with pytest.raises(ContextOverflowError):
        await collect(be)
    with pytest.raises(BackendError, match=r"openai \(HTTP 400\): bad request"):
        await collect(be)
    await be.aclose()


async def test_a_cut_stream_ends_without_done(server):
    server.reply(PATH, stream_reply(sse([(None, chunk({"content": "partial"}))]), cut=True))
    be = backend(server)
    try:
        chunks = await collect(be)
    except TransientError:
        chunks = []  # a reset connection is a transient error; a clean cut is a missing Done
    assert not any(isinstance(c, Done) for c in chunks)
    await be.aclose()


async def test_malformed_chunk_is_an_error(server):
    server.reply(PATH, stream_reply([b"data: {not json\n\n"]))
    be = backend(server)
    with pytest.raises(BackendError, match="malformed stream chunk"):
        await collect(be)
    await be.aclose()


async def test_chunks_not_shaped_as_the_apis_are_errors(server):
    server.reply(PATH, stream_reply(sse([(None, {"choices": "not a list"})])), stream_reply(sse([(None, [1, 2])])))
    be = backend(server)
    for _ in range(2):
        with pytest.raises(BackendError, match="openai: malformed stream chunk"):
            await collect(be)
    await be.aclose()


async def test_an_error_sent_inside_the_stream_maps_onto_the_taxonomy(server):
    """OpenRouter and vLLM report a failure after the 200 as an `error` object in the stream."""

    def failing(error):
        return stream_reply(sse([(None, chunk({"content": "par"})), (None, {"error": error})]))

    server.reply(
        PATH,
        failing({"code": 502, "message": "upstream overloaded"}),
        failing({"message": "This model's maximum context length is 8192 tokens"}),
        failing({"code": 400, "message": "invalid tool schema"}),
    )
    be = backend(server)
    with pytest.raises(TransientError, match=r"openai \(HTTP 502\): upstream overloaded"):
        await collect(be)
    with pytest.raises(ContextOverflowError):
        await collect(be)
    with pytest.raises(BackendError, match="invalid tool schema") as e:
        await collect(be)
    assert type(e.value) is BackendError
    await be.aclose()


async def test_unreachable_server_names_the_url_and_fails_at_once():
    """A refused connection is no hiccup: the Core does not retry it (issue 29)."""
    be = backends.create("openai", "m", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(
        BackendError, match=r"cannot reach http://127.0.0.1:9/v1/chat/completions: connection refused"
    ) as e:
        await collect(be)
    assert not isinstance(e.value, TransientError)
    await be.aclose()


def test_missing_key_names_the_variables():
    with pytest.raises(ConfigError, match="OLLIE_OPENAI_KEY or OPENAI_API_KEY"):
        backends.create("openai", "gpt-4o")


def test_url_from_the_environment(monkeypatch):
    monkeypatch.setenv("OLLIE_OPENAI_URL", "http://127.0.0.1:8080/")
    assert backends.create("openai", "m").base_url == "http://127.0.0.1:8080/v1"


async def test_models_and_context_length(server):
    server.route(
        "/v1/models",
        lambda r: json_reply(
            {
                "object": "list",
                "data": [
                    {"id": "b-model", "object": "model"},
                    {"id": "gpt-4o-mini", "object": "model", "context_length": 32768},
                ],
            }
        ),
    )
    be = backend(server)
    assert await be.models() == ["b-model", "gpt-4o-mini"]
    assert await be.context_length() == 32768
    await be.aclose()


async def test_full_loop_over_the_wire_with_retries(server):
    """A turn against the server: a 429, a cut stream, then tool calls and an answer."""
    server.reply(
        PATH,
        json_reply({"error": {"message": "slow down"}}, 429, {"retry-after": "0"}),
        stream_reply(sse([(None, chunk({"content": "half"}))])),  # ends without finish_reason
        tool_call_stream([("c1", "echo", '{"text": "from tool"}')]),
        text_stream("The tool said: from tool"),
    )
    be = backend(server)
    toy = ToyServer()
    nd = dispatcher_factory({"toy": lambda: toy})
    core = Core(CoreConfig(be, await build_agent_env(AgentConfig(), nd(), os.getcwd()), nd))
    events = []
    core.subscribe(events.append)
    await core.submit("use the tool")
    assert core.reply == "The tool said: from tool"
    assert [e.kind for e in events if e.kind in ("retry", "limitretry") and e.data["first"]] == ["limitretry", "retry"]
    last = server.requests[-1].json["messages"]
    assert last[-1] == {"role": "tool", "tool_call_id": "c1", "content": "from tool"}
    usage = core.usage()
    assert (usage.input_tokens, usage.output_tokens, usage.requests) == (24, 10, 2)
    await core.close()
