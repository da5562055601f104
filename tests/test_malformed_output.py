"""Malformed model output: each kind becomes an error result the model can act on, or an error event
that ends the turn, never a traceback; and the history stays restorable and sendable."""

from __future__ import annotations

import json
import logging
import os

import pytest

from agent_helpers import ToyServer, kinds
from ollie import backends
from ollie.agent.core import Core, CoreConfig
from ollie.agent.env import build_agent_env
from ollie.agent.session import SessionStore
from ollie.backends import anthropic, ollama
from ollie.backends.scripted import ScriptedBackend
from ollie.config import AgentConfig
from ollie.textcalls import MAX_DEPTH
from ollie.tools import dispatcher_factory
from ollie.types import BackendError, ConfigError, GenerationParams, ToolSpec
from wire import WireServer, sse, stream_reply
from wire import anthropic as anthropic_wire
from wire import ollama as ollama_wire
from wire.openai import PATH, chunk, text_stream

DEEP = 100_000
TOOLS = [ToolSpec("echo", "echo text", {"type": "object", "properties": {}})]


def deep_dict(depth):
    root = value = {}
    for _ in range(depth - 1):
        value["a"] = {}
        value = value["a"]
    return root


@pytest.fixture(autouse=True)
def no_tracebacks(caplog):
    """A malformed answer is reported as what it is, never as an internal failure."""
    yield
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def surrogates(value):
    """The lone surrogates in the strings of a JSON value."""
    if isinstance(value, dict):
        return surrogates(list(value.items()))
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in surrogates(v)]
    return [c for c in value if "\ud800" <= c <= "\udfff"] if isinstance(value, str) else []


def assert_history_valid(core):
    """Restorable as it is, every call answered once, and encodable as each wire backend sends it."""
    restored = SessionStore(core.session_id).load_history()
    assert [m.to_dict() for m in restored] == [m.to_dict() for m in core.session.messages]
    calls = [c for m in core.session.messages for c in m.tool_calls]
    assert all(isinstance(v, str) for c in calls for v in (c.id, c.name, c.arguments))
    assert len({c.id for c in calls}) == len(calls)
    assert sorted(m.tool_call_id for m in core.session.messages if m.role == "tool") == sorted(c.id for c in calls)
    params = GenerationParams()
    openai_be = backends.create("openai", "m", base_url="http://127.0.0.1:9/v1", api_key="k")
    bodies = [
        openai_be.request_body(core.session.messages, TOOLS, params),
        anthropic.build_request("m", core.session.messages, TOOLS, params)[0],
        ollama.build_request("m", core.session.messages, TOOLS, params, None),
    ]
    assert not surrogates(bodies)
    for m in bodies[1]["messages"]:
        assert all(isinstance(b["input"], dict) for b in m["content"] if b["type"] == "tool_use")
    for m in bodies[2]["messages"]:
        assert all(isinstance(c["function"]["arguments"], dict) for c in m.get("tool_calls", ()))
    assert core.session.chat_path.read_text()  # valid UTF-8


async def test_a_tool_name_that_is_no_string_gets_an_error_result_and_the_turn_goes_on(cores):
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [{"name": 5, "arguments": {}}, {"name": None, "arguments": {}}, {"name": ["echo"]}]},
            {"text": "ok", "expect": "available tools: echo"},
        ]
    )
    await core.submit("go")
    results = [m for m in core.session.messages if m.role == "tool"]
    assert [r.is_error for r in results] == [True, True, True]
    assert "unknown tool '5'" in results[0].content and "empty tool name" in results[1].content
    assert "unknown tool '[\"echo\"]'" in results[2].content
    assert core.reply == "ok" and server.calls == []
    backend.assert_consumed()
    assert_history_valid(core)


async def test_call_ids_missing_not_strings_or_repeated_are_replaced_by_unique_ones(cores):
    core, backend, _, _ = await cores.open(
        [
            {
                "tool_calls": [
                    {"id": 7, "name": "echo", "arguments": {"text": "a"}},
                    {"id": "same", "name": "echo", "arguments": {"text": "b"}},
                    {"id": "same", "name": "echo", "arguments": {"text": "c"}},
                ]
            },
            {"tool_calls": [{"id": "same", "name": "echo", "arguments": {"text": "d"}}]},  # used in the last answer
            {"text": "ok"},
        ]
    )
    await core.submit("go")
    assert [m.content for m in core.session.messages if m.role == "tool"] == ["a", "b", "c", "d"]
    assert core.session.messages[1].tool_calls[1].id == "same"
    backend.assert_consumed()
    assert_history_valid(core)


@pytest.mark.parametrize(
    "arguments",
    [
        "[" * DEEP + "]" * DEEP,  # JSON text the decoder gives up on
        deep_dict(DEEP),  # a value a backend parsed already
        json.dumps(deep_dict(MAX_DEPTH + 1)),  # parsable, yet deeper than any tool takes
    ],
    ids=["text", "parsed", "just-too-deep"],
)
async def test_arguments_nested_too_deep_get_an_error_result(cores, arguments):
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [{"name": "echo", "arguments": arguments}]},
            {"text": "flatter next time", "expect": f"arguments for echo are nested more than {MAX_DEPTH} levels deep"},
        ]
    )
    await core.submit("go")
    assert core.reply == "flatter next time" and server.calls == []
    backend.assert_consumed()
    assert_history_valid(core)


async def test_arguments_that_are_a_json_list_or_a_number_get_an_error_result(cores):
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [{"name": "echo", "arguments": [1, 2]}, {"name": "echo", "arguments": 3}]},
            {"text": "ok", "expect": "arguments for echo must be a JSON object, not a number"},
        ]
    )
    await core.submit("go")
    first = next(m for m in core.session.messages if m.role == "tool")
    assert first.is_error and "must be a JSON object, not an array" in first.content
    assert server.calls == []
    backend.assert_consumed()
    assert_history_valid(core)


async def test_lone_surrogates_in_text_and_arguments_become_replacement_characters(cores):
    core, backend, server, events = await cores.open(
        [
            {
                "reasoning": "hm\ud800",
                "text": "look\ud800",
                "tool_calls": [
                    {"name": "echo", "arguments": {"text": "raw\udfff"}},
                    {"name": "echo", "arguments": '{"text": "escaped\\ud800"}'},
                ],
            },
            {"text": "done\udc80", "expect": "escaped\ufffd"},
            {"text": "again"},
        ]
    )
    await core.submit("go\udcff")  # an argv with bytes that are no UTF-8
    assert server.calls == [("echo", {"text": "raw\ufffd"}), ("echo", {"text": "escaped\ufffd"})]
    assert core.reply == "look\ufffd\ndone\ufffd"
    assert all("\ud800" not in e.text and "\udfff" not in e.text for e in events)
    await core.submit("and now")  # the history is sent again
    assert core.reply == "again"
    backend.assert_consumed()
    assert_history_valid(core)


@pytest.mark.parametrize(
    "script, message",
    [
        ([{"text": "a"}, "oops"], "turn 2 (index 1) must be an object with keys such as text and tool_calls, not str"),
        ([["text", "a"]], "turn 1 (index 0) must be an object with keys such as text and tool_calls, not list ['text'"),
        (
            [{"tool_call": []}],
            "turn 1 (index 0) has an unknown key 'tool_call'; known keys: text, reasoning, tool_calls",
        ),
        ([{"text": 42}], "turn 1 (index 0): text must be a string, not int 42"),
        (
            [{"tool_calls": ["echo"]}],
            "turn 1 (index 0): tool_calls[0] must be an object (name, arguments, id), not str",
        ),
        ([{"usage": {"tokens": 1}}], "turn 1 (index 0): usage has unknown keys ['tokens']"),
        ({"rules": [{"match": "(", "text": "a"}]}, "rule 1 (index 0): match is no regular expression"),
        ({"rules": "x"}, 'a script object needs a "rules" list'),
    ],
)
def test_a_script_of_the_wrong_shape_is_refused_naming_the_turn(script, message):
    with pytest.raises(ConfigError) as e:
        ScriptedBackend(script)
    assert str(e.value).startswith("scripted backend: " + message)


# ---- through the wire backends ------------------------------------------------------------------


@pytest.fixture
def server():
    with WireServer() as s:
        yield s


async def wire_core(backend):
    toy = ToyServer()
    nd = dispatcher_factory({"toy": lambda: toy})
    core = Core(CoreConfig(backend, await build_agent_env(AgentConfig(), nd(), os.getcwd()), nd))
    events = []
    core.subscribe(events.append)
    return core, toy, events


def openai_backend(server):
    return backends.create("openai", "gpt-4o-mini", base_url=server.url + "/v1", api_key="sk-test")


async def test_openai_call_with_a_numeric_name_and_id_is_answered_and_sent_back_well_formed(server):
    server.reply(
        PATH,
        stream_reply(
            sse(
                [
                    (
                        None,
                        chunk(
                            {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": 7,
                                        "type": "function",
                                        "function": {"name": 5, "arguments": "{}"},
                                    }
                                ]
                            }
                        ),
                    ),
                    (None, chunk({}, "tool_calls")),
                    (None, "[DONE]"),
                ]
            )
        ),
        text_stream("sorry"),
    )
    core, toy, _ = await wire_core(openai_backend(server))
    await core.submit("go")
    assert core.reply == "sorry" and toy.calls == []
    sent = server.requests[-1].json["messages"]
    call = sent[-2]["tool_calls"][0]
    assert isinstance(call["id"], str) and call["function"]["name"] == "5"
    assert sent[-1]["tool_call_id"] == call["id"] and "unknown tool '5'" in sent[-1]["content"]
    assert_history_valid(core)
    await core.close()


async def test_openai_lone_surrogates_never_reach_the_next_request(server):
    server.reply(
        PATH,
        stream_reply(
            sse(
                [
                    (None, '{"choices": [{"index": 0, "delta": {"content": "a\\ud800b"}, "finish_reason": null}]}'),
                    (
                        None,
                        chunk(
                            {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c1",
                                        "type": "function",
                                        "function": {"name": "echo", "arguments": '{"text": "x\\ud800"}'},
                                    }
                                ]
                            }
                        ),
                    ),
                    (None, chunk({}, "tool_calls")),
                    (None, "[DONE]"),
                ]
            )
        ),
        text_stream("ok"),
    )
    core, toy, events = await wire_core(openai_backend(server))
    await core.submit("go")
    assert toy.calls == [("echo", {"text": "x\ufffd"})]
    assert [e.text for e in events if e.kind == "assistant"][0] == "a\ufffdb"
    sent = json.loads(server.requests[-1].body.decode())  # strict UTF-8
    assert not surrogates(sent) and sent["messages"][-2]["content"] == "a\ufffdb"
    assert_history_valid(core)
    await core.close()


@pytest.mark.parametrize(
    "data, error",
    [
        (
            '{"choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": null}]}',
            "openai: malformed answer: a piece of its text is int, not a string",
        ),
        (
            '{"choices": [{"index": 0, "delta": {"reasoning": ["x"]}, "finish_reason": null}]}',
            "openai: malformed answer: a piece of its reasoning is list, not a string",
        ),
        (
            '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0", "function": {"name": "echo"}}]}, '
            '"finish_reason": null}]}',
            "openai: malformed answer: a tool call piece has the index '0', not a number",
        ),
        ('{"choices": [], "usage": {"prompt_tokens": "12"}}', "openai: malformed stream chunk: "),
        (
            '{"choices": [], "x": ' + "[" * DEEP + "]" * DEEP + "}",
            "openai: malformed stream chunk: nested too deeply to read",
        ),
    ],
    ids=["text", "reasoning", "index", "usage", "deep"],
)
async def test_openai_answers_that_are_no_answer_end_the_turn_with_an_error_event(server, data, error):
    server.reply(PATH, stream_reply(sse([(None, data), (None, chunk({}, "stop")), (None, "[DONE]")])))
    core, _, events = await wire_core(openai_backend(server))
    with pytest.raises(BackendError):  # what ended the turn; the session stays usable
        await core.submit("go")
    assert [e.text for e in events if e.kind == "error"][0].startswith(error)
    assert kinds(events)[-2:] == ["error", "done"] and core.state == "idle"
    assert [m.role for m in core.session.messages] == ["user"]
    assert_history_valid(core)
    await core.close()


async def test_ollama_usage_that_is_no_number_ends_the_turn_with_an_error_event(server, monkeypatch):
    monkeypatch.setenv("OLLIE_OLLAMA_URL", server.url)
    server.route(ollama_wire.SHOW, lambda req: ollama_wire.show(32768))
    server.reply(ollama_wire.CHAT, ollama_wire.chat([{**ollama_wire.done_line(), "eval_count": "many"}]))
    core, _, events = await wire_core(backends.create("ollama", "llama3.2"))
    with pytest.raises(BackendError):  # what ended the turn; the session stays usable
        await core.submit("go")
    assert [e.text for e in events if e.kind == "error"] == [
        "ollama: malformed answer: its usage (output_tokens) is not in numbers"
    ]
    assert_history_valid(core)
    await core.close()


@pytest.mark.parametrize(
    "line, error",
    [
        (
            b'{"message": {"tool_calls": [{"function": {"name": "echo", "arguments": '
            + b'{"a": ' * DEEP
            + b"1"
            + b"}" * DEEP
            + b'}}]}, "done": false}\n',
            "ollama: malformed stream line, nested too deeply to read",
        ),
        (b'{"message": "hi", "done": false}\n', "ollama: malformed stream line: "),
        (b'{"message": {"tool_calls": [{"function": "echo"}]}, "done": false}\n', "ollama: malformed stream line: "),
    ],
    ids=["deep-arguments", "message-no-object", "function-no-object"],
)
async def test_ollama_lines_that_cannot_be_read_end_the_turn_with_an_error_event(server, monkeypatch, line, error):
    monkeypatch.setenv("OLLIE_OLLAMA_URL", server.url)
    server.route(ollama_wire.SHOW, lambda req: ollama_wire.show(32768))
    server.reply(ollama_wire.CHAT, stream_reply([line], content_type="application/x-ndjson"))
    core, _, events = await wire_core(backends.create("ollama", "llama3.2"))
    with pytest.raises(BackendError):  # what ended the turn; the session stays usable
        await core.submit("go")
    assert [e.text for e in events if e.kind == "error"][0].startswith(error)
    assert [m.role for m in core.session.messages] == ["user"] and core.state == "idle"
    assert_history_valid(core)
    await core.close()


async def test_ollama_arguments_that_are_a_list_are_refused_and_sent_back_as_an_object(server, monkeypatch):
    monkeypatch.setenv("OLLIE_OLLAMA_URL", server.url)
    server.route(ollama_wire.SHOW, lambda req: ollama_wire.show(32768))
    server.reply(
        ollama_wire.CHAT,
        ollama_wire.chat(
            [ollama_wire.chat_line(tool_calls=[ollama_wire.tool_call("echo", [1, 2])]), ollama_wire.done_line()]
        ),
        ollama_wire.chat([ollama_wire.chat_line(content="ok"), ollama_wire.done_line()]),
    )
    core, toy, _ = await wire_core(backends.create("ollama", "llama3.2"))
    await core.submit("go")
    assert core.reply == "ok" and toy.calls == []
    sent = server.requests_to(ollama_wire.CHAT)[-1].json["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == {"_raw": "[1, 2]"}
    assert "must be a JSON object, not an array" in sent[-1]["content"]
    assert_history_valid(core)
    await core.close()


async def test_anthropic_event_nested_too_deeply_ends_the_turn_with_an_error_event(server, monkeypatch):
    monkeypatch.setenv("OLLIE_ANTHROPIC_KEY", "sk-test")
    monkeypatch.setenv("OLLIE_ANTHROPIC_URL", server.url)
    deep = '{"type": "message_start", "message": ' + "[" * DEEP + "]" * DEEP + "}"
    server.reply(anthropic_wire.PATH, stream_reply(sse([("message_start", deep)])))
    core, _, events = await wire_core(backends.create("anthropic"))
    with pytest.raises(BackendError):  # what ended the turn; the session stays usable
        await core.submit("go")
    assert [e.text for e in events if e.kind == "error"] == [
        "anthropic: malformed stream event: nested too deeply to read"
    ]
    assert_history_valid(core)
    await core.close()


async def test_an_answer_cut_off_mid_stream_is_said_dropped_before_it_is_asked_for_again(server):
    """The chat showed the cut-off text as an answer of its own, the one asked for again after it:
    its readers (the terminal, the web page, a script) could not tell which to believe."""
    server.reply(
        PATH,
        stream_reply(sse([(None, chunk({"content": "I am half way thr"}))]), cut=True),
        text_stream("the whole answer"),
    )
    core, _, events = await wire_core(openai_backend(server))
    assert await core.submit("go") == "the whole answer"
    chat = core.session.chat_path.read_text()
    said = chat.index("retrying in 2.0s (the answer above was cut off: it is dropped and asked for again)...\n")
    assert chat.index("assistant: I am half way thr") < said < chat.index("assistant: the whole answer")
    assert [m.content for m in core.session.messages if m.role == "assistant"] == ["the whole answer"]
    [first] = [e for e in events if e.kind == "retry" and e.data["first"]]
    assert first.data["dropped"] is True
    await core.close()
