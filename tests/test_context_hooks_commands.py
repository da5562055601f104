"""Compaction and the rolling window, hooks, slash commands and `!cmd`, usage and cost."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from agent_helpers import exchanges, seed_history
from ollie.agent import commands, hooks
from ollie.agent.compaction import SUMMARY_PREFIX
from ollie.agent.context import Window
from ollie.agent.session import SessionStore
from ollie.chatfmt import cost_text, usage_text
from ollie.config import AgentConfig
from ollie.tools import Tool, ToolResult, execute
from ollie.types import BackendError, GenerationParams, Message, RateLimitError, ToolCall, ToolSpec
from test_execute import alive


def call(name, **args):
    return {"name": name, "arguments": args}


async def run(core, events, line):
    """What a line typed by a user shows: the command's info and error events."""
    n = len(events)
    await commands.submit(core, line)
    return "\n".join(e.text for e in events[n:] if e.kind in ("info", "error"))


# ---- compaction ---------------------------------------------------------------------------------


async def test_manual_compact_sends_the_flattened_history_and_replaces_it(cores):
    history = [
        Message("user", "q0"),
        Message("assistant", "", tool_calls=[]),
        Message("user", "q1"),
        Message("assistant", "a1"),
        Message("user", "q2"),
        Message("assistant", "a2"),
    ]
    core, backend, _, events = await cores.open(
        [{"text": "SUMMARY: asked 3 questions", "usage": {"input_tokens": 50, "output_tokens": 6}}], history=history
    )
    before = list(core.session.messages)
    await core.compact()
    request = backend.requests[0]
    assert request[0].role == "system" and "Summarise" in request[0].content
    assert "user: q0" in request[1].content and "assistant: a2" in request[1].content
    assert backend.tools_seen[0] == []
    assert [m.content for m in core.session.messages] == [SUMMARY_PREFIX + "SUMMARY: asked 3 questions"]
    archived = (SessionStore(core.session_id).dir / "compaction.jsonl").read_text().splitlines()
    assert [m["content"] for m in json.loads(archived[0])["messages"]] == [m.content for m in before]
    assert [m.content for m in SessionStore(core.session_id).load_history()] == [core.session.messages[0].content]
    assert usage_text(core.usage()) == "50 in, 6 out, 1 requests"  # the summary request is paid for too


async def test_failed_manual_compaction_leaves_history_exactly_as_it_was(cores):
    core, backend, _, events = await cores.open([{"error": {"type": "other", "message": "no"}}], history=exchanges(4))
    before = [m.to_dict() for m in core.session.messages]
    await core.compact()
    assert [m.to_dict() for m in core.session.messages] == before
    assert [m.to_dict() for m in SessionStore(core.session_id).load_history()] == before
    assert any("compaction failed, history unchanged" in e.text for e in events if e.kind == "error")


async def test_auto_compaction_keeps_the_prompt_out_of_the_summary_and_sends_it_after(cores):
    cfg = AgentConfig(context_window=120)
    core, backend, _, events = await cores.open(
        [
            {"text": "the summary"},
            {"text": "answer to the new prompt", "expect": "THE NEW PROMPT"},
        ],
        cfg=cfg,
        history=exchanges(6),
    )  # ~100 tokens of 120, with the system prompt: over 75 %
    await core.submit("THE NEW PROMPT")
    assert "THE NEW PROMPT" not in backend.requests[0][1].content
    final = backend.requests[1]
    assert [m.role for m in final] == ["system", "user", "user"]
    assert final[1].content.startswith(SUMMARY_PREFIX) and final[2].content == "THE NEW PROMPT"
    assert core.reply == "answer to the new prompt"
    backend.assert_consumed()
    said = [e.text for e in events if e.kind == "info"]
    assert any(t.endswith("full: compacting") for t in said) and "compacted 12 messages into a summary" in said


async def test_a_full_context_with_nothing_to_compact_does_not_say_it_compacts(cores):
    core, backend, _, events = await cores.open(
        [{"text": "ok"}], cfg=AgentConfig(context_window=120), history=[Message("user", "x" * 400)]
    )
    await core.submit("go")
    assert not [e.text for e in events if "compact" in e.text]


async def test_context_overflow_compacts_and_retries_the_turn_once(cores):
    core, backend, _, events = await cores.open(
        [
            {"error": {"type": "context_overflow", "message": "prompt is too long", "status": 400}},
            {"text": "short summary"},
            {"text": "now it fits", "expect": "big question"},
        ],
        history=exchanges(3),
    )
    await core.submit("big question")
    assert core.reply == "now it fits"
    assert [m.content for m in core.session.messages][-2:] == ["big question", "now it fits"]
    assert core.session.messages[0].content.startswith(SUMMARY_PREFIX)
    backend.assert_consumed()


async def test_overflow_after_tool_calls_keeps_the_turns_work_and_its_prompt_verbatim(cores):
    core, backend, server, events = await cores.open(
        [
            {"tool_calls": [call("write")]},
            {"error": {"type": "context_overflow", "message": "prompt is too long", "status": 400}},
            {"text": "summary of the earlier talk"},
            {"text": "finished", "expect": "written"},
        ],
        history=exchanges(3),
    )
    await core.submit("do the work")
    assert "do the work" not in backend.requests[2][1].content  # only the earlier talk is summarised
    assert [(m.role, m.content) for m in core.session.messages] == [
        ("user", SUMMARY_PREFIX + "summary of the earlier talk"),
        ("user", "do the work"),
        ("assistant", ""),
        ("tool", "written"),
        ("assistant", "finished"),
    ]
    assert core.session.messages[3].tool_call_id == core.session.messages[2].tool_calls[0].id
    assert [c[0] for c in server.calls] == ["write"]  # continued, not run again
    assert core.reply == "finished"
    backend.assert_consumed()


def test_the_window_counts_the_tools_offered_again_when_they_change():
    window = Window(lambda: [], lambda: "")
    small = ToolSpec("echo", "echo text", {"type": "object"})
    window.offered([small])
    alone = window.estimate()
    window.offered([ToolSpec("echo", "echo text", {"type": "object"})])  # equal: the same count
    assert window.estimate() == alone
    window.offered([small, ToolSpec("read", "read a file", {"type": "object", "properties": {"p": {"x": "y" * 400}}})])
    assert window.estimate() > alone + 100
    window.offered([])
    assert window.estimate() == 0


async def test_rolling_window_never_splits_a_call_from_its_result(cores):
    cfg = AgentConfig(context_window=300)
    history = [
        m
        for i in range(8)
        for m in (
            Message("user", f"q{i} " + "x" * 60),
            Message("assistant", "", tool_calls=[ToolCall(f"c{i}", "echo", "{}")]),
            Message("tool", "r" * 60, tool_call_id=f"c{i}", name="echo"),
            Message("assistant", f"a{i}"),
        )
    ]
    core, backend, _, events = await cores.open([{"text": "ok", "expect": "next"}], cfg=cfg, history=history)
    await core.submit("next")
    msgs = core.session.messages
    assert msgs[0].role == "user" and "evicted" in msgs[0].content
    ids = {c.id for m in msgs if m.role == "assistant" for c in m.tool_calls}
    assert all(m.tool_call_id in ids for m in msgs if m.role == "tool")
    assert msgs[1].role != "tool"
    assert [e.text for e in events if e.kind == "error"] == []
    assert len(backend.requests) == 1  # too large to summarise: evicted without a summary call
    assert core.reply == "ok"


async def test_text_of_more_tokens_than_four_characters_is_evicted_by_the_backends_count(cores):
    """Chinese or Japanese text takes a token or so a character: measured against four, eviction
    dropped nothing and every turn after failed with a prompt too long."""
    history = [m for i in range(10) for m in (Message("user", "问" * 300), Message("assistant", "答" * 300))]
    core, backend, _, events = await cores.open(
        [{"text": "a", "usage": {"input_tokens": 6100}}, {"text": "b", "expect": "two"}],
        cfg=AgentConfig(context_window=4000),
        history=history,
    )
    await core.submit("one")  # the backend counts the history: a token a character
    assert await core.submit("two") == "b"
    assert "evicted" in core.session.messages[0].content
    assert sum(len(m.content) for m in core.session.messages[1:]) <= 2000 + 10  # half the window, in its tokens
    assert core.ctxsz().estimate < 4000 * 0.75
    assert [e.text for e in events if e.kind == "error"] == []


async def test_compacted_session_resumes_and_compacts_again(cores):
    core, backend, _, _ = await cores.open([{"text": "first summary"}], history=exchanges(3))
    sid = core.session_id
    await core.compact()
    await cores.close(core)
    seed_history(exchanges(2), sid)
    again, backend2, _, _ = await cores.open([{"text": "reply"}, {"text": "second summary"}], session_id=sid)
    assert again.session.messages[0].content.startswith(SUMMARY_PREFIX)
    await again.submit("more")
    await again.compact()
    assert again.session.messages[0].content == SUMMARY_PREFIX + "second summary"
    assert "first summary" in backend2.requests[1][1].content
    archived = (SessionStore(sid).dir / "compaction.jsonl").read_text().splitlines()
    assert len(archived) == 2


# ---- hooks --------------------------------------------------------------------------------------


def hook_cfg(tmp_path, **hooks_by_event):
    return AgentConfig(hooks={k: [v] for k, v in hooks_by_event.items()})


@pytest.fixture
def hooks_write(tmp_path, ollie_dirs):
    """Hooks run sandboxed with the cwd read-only: the hooks policy, overlaid as users do, lets
    these tests' hooks write their records in tmp_path."""
    (ollie_dirs / "cfg" / "sandbox").mkdir(exist_ok=True)
    (ollie_dirs / "cfg" / "sandbox" / "hooks.yaml").write_text(f"filesystem:\n  rw: [{tmp_path}]\n")
    return tmp_path


async def test_every_hook_event_gets_its_payload(cores, tmp_path, hooks_write):
    log = tmp_path / "hooks.log"
    record = f"{{ cat; echo; }} >> {log}"
    events = ["agentSpawn", "preTurn", "postTurn", "preTool", "postTool", "preCompact", "postCompact", "turnError"]
    cfg = AgentConfig(hooks={e: [record] for e in events})
    core, backend, _, _ = await cores.open(
        [
            {"tool_calls": [call("echo", text="hi")]},
            {"text": "done"},
            {"error": {"type": "rate_limit", "message": "quota", "retry_after": 0}},
            {"error": {"type": "rate_limit", "message": "quota", "retry_after": 0}},
            {"error": {"type": "rate_limit", "message": "quota", "retry_after": 0}},
            {"error": {"type": "rate_limit", "message": "quota", "retry_after": 0}},
            {"text": "summary"},
        ],
        cfg=cfg,
    )
    await core.submit("go")
    with pytest.raises(RateLimitError, match="quota"):
        await core.submit("fails")
    await core.compact()
    payloads = [json.loads(line) for line in log.read_text().splitlines() if line]
    seen = [p["event"] for p in payloads]
    assert seen == ["preTurn", "preTool", "postTool", "postTurn", "preTurn", "turnError", "preCompact", "postCompact"]
    by = {p["event"]: p for p in payloads}
    assert by["preTool"]["tool"] == "echo" and by["postTool"]["result"] == "hi"
    assert by["postTurn"]["reply"] == "done"
    assert by["turnError"]["error_type"] == "rate_limit"
    assert by["postCompact"]["summary"] == "summary"
    assert all(p["session_id"] == core.session_id for p in payloads)


async def test_hook_exit_codes(cores, tmp_path):
    cfg = AgentConfig(
        hooks={
            "preTurn": ['echo "context from hook: $OLLIE_PROMPT"'],
            "preTool": ["[ \"$OLLIE_TOOL\" = write ] && { echo 'writes are off' >&2; exit 2; } || exit 0"],
            "postTool": ["exit 3"],
        }
    )
    core, backend, server, events = await cores.open(
        [
            {"tool_calls": [call("echo", text="e"), call("write")]},
            {"text": "ok", "expect": "blocked by a preTool hook: writes are off"},  # the last result's
        ],
        cfg=cfg,
    )
    await core.submit("do it")
    assert "context from hook: do it" in backend.requests[0][-1].content
    assert [c[0] for c in server.calls] == ["echo"]
    assert any("postTool hook 'exit 3' exited 3" in e.text for e in events if e.kind == "info")


async def test_a_sandboxed_hook_kept_in_tmp_is_said_to_be_out_of_its_sight(cores, tmp_path):
    """A hook script in /tmp, there and executable, failed with "not found" alone: the jail's /tmp
    is its own."""
    assert str(tmp_path).startswith("/tmp/")
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    core, _, _, events = await cores.open([{"text": "ok"}], cfg=AgentConfig(hooks={"preTurn": [str(script)]}))
    await core.submit("go")
    [said] = [e.text for e in events if e.kind == "info" and "preTurn hook" in e.text]
    assert "exited 127" in said and f"a /tmp of its own, where {script} is not" in said, said


async def test_post_turn_exit_2_becomes_the_next_prompt(cores):
    cfg = AgentConfig(
        hooks={"postTurn": ["[ \"$OLLIE_PROMPT\" = first ] && { echo 'now check the tests' >&2; exit 2; }; exit 0"]}
    )
    core, backend, _, _ = await cores.open(
        [{"text": "did it"}, {"text": "checked", "expect": "now check the tests"}], cfg=cfg
    )
    await core.submit("first")
    assert core.reply == "checked"
    backend.assert_consumed()


async def test_a_hook_that_always_blocks_cannot_run_turns_forever(cores, monkeypatch):
    # A sandboxed hook that cannot write its log (dash exits 2 on a failed redirection) would
    # otherwise start turn after turn.
    from ollie.agent import core as core_module

    monkeypatch.setattr(core_module, "HOOK_FOLLOW_UPS", 3)
    cfg = AgentConfig(hooks={"postTurn": ["echo again >&2; exit 2"]})
    core, backend, _, events = await cores.open({"rules": [{"text": "ok"}]}, cfg=cfg)
    await core.submit("go")
    assert len(backend.requests) == 4  # the prompt, then three follow-ups
    assert any("hooks asked for 3 more turns in a row" in e.text for e in events if e.kind == "info")
    assert core.state == "idle"


async def test_a_hanging_hook_is_killed_and_a_loud_one_truncated(cores, monkeypatch, tmp_path):
    monkeypatch.setattr(hooks, "TIMEOUT", 0.5)
    cfg = AgentConfig(
        hooks={"preTurn": ["sh -c 'sleep 61.25' & wait", f"{sys.executable} -c \"print('y' * 5_000_000)\""]}
    )
    core, backend, _, events = await cores.open([{"text": "ok"}], cfg=cfg)
    await core.submit("go")
    assert any("timed out" in e.text for e in events if e.kind == "info")
    assert alive("sleep 61.25") == []  # the hook's child died with it
    sent = backend.requests[0][-1].content
    assert len(sent) < hooks.OUTPUT_LIMIT + 200 and "hook output truncated" in sent


async def test_hook_variables_are_capped_and_a_hook_that_cannot_start_is_a_warning(cores, tmp_path, hooks_write):
    out = tmp_path / "lengths"
    cfg = AgentConfig(
        hooks={
            "preTurn": [f'printf %s "$OLLIE_PROMPT" | wc -c >> {out}'],
            "postTool": [f'printf %s "$OLLIE_RESULT" | wc -c >> {out}'],
        }
    )
    core, backend, _, events = await cores.open(
        [{"tool_calls": [call("echo", text="a\u0000b")]}, {"text": "ok"}, {"text": "still ok"}], cfg=cfg
    )
    await core.submit("p" * 300_000)  # over the kernel's limit for one variable
    assert core.reply == "ok"
    assert out.read_text().split() == [str(hooks.VARIABLE_LIMIT), "2"]  # the NUL dropped
    gone = tmp_path / "gone"
    gone.mkdir()
    core.session.set_cwd(str(gone))
    gone.rmdir()
    await core.submit("again")
    assert core.reply == "still ok" and core.state == "idle"
    assert any("preTurn hook" in e.text and "could not start" in e.text for e in events if e.kind == "info")


async def test_interrupt_during_a_turn_error_hook_ends_quietly(cores):
    cfg = AgentConfig(hooks={"turnError": ["sleep 30"]})
    core, backend, _, events = await cores.open([{"error": {"type": "other", "message": "boom"}}], cfg=cfg)
    task = asyncio.create_task(core.submit("go"))
    while not any(e.kind == "error" for e in events):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # the hook runs
    assert core.interrupt()
    await asyncio.wait_for(task, 5)  # submit returns: the interrupt is not raised into its caller
    assert core.state == "idle" and kinds_of(events)[-3:] == ["error", "info", "done"]


def kinds_of(events):
    return [e.kind for e in events if e.kind not in ("state", "usage")]


# ---- slash commands -----------------------------------------------------------------------------


async def test_slash_commands(cores, tmp_path, ollie_dirs):
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "other.json").write_text(json.dumps({"prompt": "You are other.\n", "maxSteps": 3}))
    core, backend, _, events = await cores.open(
        [{"text": "hello", "usage": {"input_tokens": 1000, "output_tokens": 10}}]
    )
    await core.submit("hi")
    assert "/compact" in await run(core, events, "/help")
    assert await run(core, events, "/usage") == "1000 in, 10 out, 1 requests"
    assert "costSession=$" in await run(core, events, "/cost")
    assert "/ 128000" in await run(core, events, "/context")
    assert "user      hi" in await run(core, events, "/history")
    assert core.session_id in await run(core, events, "/sessions")
    assert "execute" not in await run(core, events, "/tools") and "echo" in await run(core, events, "/tools")
    assert "toy: ok\n  echo: echo text" in await run(core, events, "/mcp")
    assert await run(core, events, "/sp") == core.system_prompt()
    assert await run(core, events, f"/cwd {tmp_path}") == f"cwd: {tmp_path}" and core.session.cwd == str(tmp_path)
    assert "cwd: /nonexistent does not exist" in await run(core, events, "/cwd /nonexistent")
    assert "other" in await run(core, events, "/agents")
    assert await run(core, events, "/agent other") == "agent: other, backend: scripted, model: scripted"
    assert core.system_prompt() == "You are other.\n" and core.session.cwd == str(tmp_path)
    assert "no agent 'nosuch'" in await run(core, events, "/agent nosuch")
    assert await run(core, events, "/models") == "scripted"
    assert "no model 'nonexistent'" in await run(core, events, "/model nonexistent")
    assert "temperature = 0.3" == await run(core, events, "/set temperature 0.3")
    for bad, said in (("temperature nan", "must be a finite number"), ("top_p 1.5", "must be at most 1.0")):
        assert said in await run(core, events, f"/set {bad}")  # every request after would fail
    assert "must be at least 1" in await run(core, events, "/set max_tokens 0")
    assert core.session.params.nonempty() == {"temperature": 0.3}
    assert "unknown backend 'nope'" in await run(core, events, "/backend nope")
    assert "no skills" in await run(core, events, "/skills")
    assert await run(core, events, "/clear") == "history cleared" and core.session.messages == []


async def test_commands_refused_during_a_turn_and_unknown_slash_is_a_prompt(cores):
    core, backend, _, events = await cores.open(
        [{"text": "slow", "delay": 0.3}, {"text": "was a prompt", "expect": "/notacommand"}]
    )
    task = asyncio.create_task(core.submit("go"))
    await asyncio.sleep(0.05)
    assert await run(core, events, "/compact") == "/compact: cannot compact while a turn is running; interrupt it first"
    assert "/model: cannot switch the model while a turn is running" in await run(core, events, "/model x")
    assert await run(core, events, "/usage")  # read-only commands still answer
    await task
    await core.submit("/notacommand please")
    assert core.reply == "was a prompt"


async def test_bang_runs_sandboxed_in_the_session_cwd_with_the_session_env(cores, tmp_path, ollie_dirs, monkeypatch):
    # `!cmd` may arrive through the file server's `prompt` file: it runs as the model's code does.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    core, backend, _, events = await cores.open([], extra_servers={"execute": execute.factory(str(tmp_path))})
    core.session.set_cwd(str(tmp_path))
    core.session.set_env("GREETING", "hello")
    out = await run(core, events, "!pwd; echo $GREETING; exit 4")
    assert out == f"!pwd; echo $GREETING; exit 4 (failed)\nexecution failed: exit status 4\n{tmp_path}\nhello"
    outside = f"/var/tmp/ollie-escaped-{os.getpid()}"
    out = await run(core, events, f"!env; echo x > {outside}")
    assert "sk-must-not-leak" not in out and "Read-only file system" in out
    assert not os.path.exists(outside)
    assert core.session.messages == []  # not part of the conversation


async def test_usage_and_cost_survive_a_restart(cores):
    core, backend, _, _ = await cores.open(
        [
            {"text": "a", "usage": {"input_tokens": 1000, "output_tokens": 100, "cost": 0.25}},
        ]
    )
    sid = core.session_id
    await core.submit("x")
    cost_before = core.cost()
    await cores.close(core)
    again, *_ = await cores.open([], session_id=sid)
    assert usage_text(again.usage()) == "1000 in, 100 out, 1 requests"
    assert again.cost() == cost_before and "costSession=$0.250000" in cost_text(cost_before, again.backend.model)


async def test_inject_replace_inject_and_queue_commands(cores):
    core, backend, server, events = await cores.open(
        [
            {"tool_calls": [call("sleep", seconds=0.3)]},
            {"text": "saw it", "expect": "<system-user-interruption>second thought</system-user-interruption>"},
            {"text": "later done", "expect": "later please"},
            {"text": "idle done", "expect": "when idle"},
            {"text": "queue done", "expect": "queued when idle"},
        ]
    )
    task = asyncio.create_task(core.submit("start"))
    while server.running == 0:
        await asyncio.sleep(0.01)
    assert await run(core, events, "/i first thought") == "injected"
    assert await run(core, events, "/irw second thought") == "injected (replacing)"
    assert await run(core, events, "/q later please") == "queued (1 waiting)"
    assert await run(core, events, "/i") == "/i: usage: inject <message>"
    assert await task == "saw it"  # its own turn's reply, the injection's follow-up in it
    while core.running:  # then the queued prompt's turn
        await asyncio.sleep(0.01)
    assert core.reply == "later done"
    assert "first thought" not in json.dumps([m.to_dict() for m in core.session.messages])
    # on an idle session they start the turn: idle means nothing is queued
    for line, reply in (("/i when idle", "idle done"), ("/q queued when idle", "queue done")):
        assert await run(core, events, line) == "started: the session was idle"
        assert core.queued() == []
        while core.state != "idle":
            await core.wait_change("state", core.state, timeout=5)
        assert core.reply == reply
    backend.assert_consumed()


# ---- what hooks say joins the context, for every event ---------------------------------------------------


async def test_agent_spawn_output_primes_the_session_and_survives_compaction_clear_and_restart(cores):
    cfg = AgentConfig(prompt="You are terse.\n", hooks={"agentSpawn": ["echo 'the repo uses tabs'"]})
    core, backend, _, _ = await cores.open(
        [{"text": "a"}, {"text": "summary"}, {"text": "b"}, {"text": "c"}], cfg=cfg, history=exchanges(3)
    )
    await core.spawned()
    assert core.system_prompt() == "You are terse.\n\n[From the agent's agentSpawn hooks:]\nthe repo uses tabs"
    await core.submit("one")
    await core.compact()
    await core.submit("two")
    core.clear()
    await core.submit("three")
    systems = [r[0].content for r in backend.requests if r[0].content.startswith("You are terse")]
    assert len(systems) == 3 and all(s.endswith("the repo uses tabs") for s in systems)
    sid = core.session_id
    await cores.close(core)
    again, *_ = await cores.open([], cfg=cfg, session_id=sid)  # a restored session is not spawned again
    assert again.system_prompt().endswith("the repo uses tabs")


async def test_post_turn_and_turn_error_output_rides_with_the_next_prompt(cores):
    cfg = AgentConfig(hooks={"postTurn": ["echo 'note: lint is clean'"], "turnError": ["echo 'note: it failed'"]})
    core, backend, _, _ = await cores.open(
        [
            {"text": "first"},
            {"error": {"type": "other", "message": "boom"}},
            {"text": "third"},
        ],
        cfg=cfg,
    )
    await core.submit("one")
    with pytest.raises(BackendError, match="boom"):
        await core.submit("two")
    assert backend.requests[1][-1].content == "two\n\nnote: lint is clean"
    await core.submit("three")
    # the failed turn's postTurn never ran; its turnError output came along, once
    assert backend.requests[2][-1].content == "three\n\nnote: it failed"
    assert [m.content for m in core.session.messages if m.role == "user"][-1] == "three\n\nnote: it failed"


async def test_pre_tool_output_joins_the_result_and_compaction_hooks_join_the_summary(cores):
    cfg = AgentConfig(
        hooks={
            "preTool": ["echo 'pre: careful'"],
            "preCompact": ["echo 'keep: the API key is in env'"],
            "postCompact": ["echo 'compacted at step 3'"],
        }
    )
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [call("echo", text="hi")]},
            {"text": "done", "expect": "pre: careful\nhi"},
            {"text": "summary"},
        ],
        cfg=cfg,
        history=exchanges(3),
    )
    await core.submit("go")
    assert [m.content for m in core.session.messages if m.role == "tool"] == ["pre: careful\nhi"]
    await core.compact()
    assert (
        core.session.messages[0].content
        == SUMMARY_PREFIX + "summary\n\nkeep: the API key is in env\n\ncompacted at step 3"
    )
    backend.assert_consumed()


# ---- /agent: the new agent's settings, nothing of the old one's --------------------------------------------


def scripted_agent(ollie_dirs, tmp_path, name, turns, **fields):
    """An agent config `name` on the scripted backend, playing `turns`; returns its script's path."""
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir(exist_ok=True)
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps(turns))
    (agents / f"{name}.json").write_text(json.dumps({"backend": "scripted", "model": str(script), **fields}))
    return script


async def test_agent_switch_brings_the_new_agents_parameters_hooks_and_backend(cores, ollie_dirs, tmp_path):
    script = scripted_agent(
        ollie_dirs,
        tmp_path,
        "reviewer",
        [{"text": "reviewed", "expect": "look"}],
        prompt="You review.\n",
        temperature=0.1,
        hooks={"agentSpawn": "echo 'reviewer primer'"},
    )
    cfg = AgentConfig(hooks={"agentSpawn": ["echo 'old primer'"]}, params=GenerationParams(top_p=0.5))
    core, backend, _, events = await cores.open([], cfg=cfg)
    await core.spawned()
    core.session.set_param("temperature", "0.9")
    await run(core, events, "/agent reviewer")
    assert core.session.params.nonempty() == {"temperature": 0.1}  # not top_p=0.5, not the 0.9 set by hand
    assert core.system_prompt() == "You review.\n\n[From the agent's agentSpawn hooks:]\nreviewer primer"
    assert core.backend.model == str(script) and core.backend is not backend
    await core.submit("look at this")
    assert core.reply == "reviewed"


async def test_a_failed_agent_switch_leaves_the_session_as_it_was(cores, ollie_dirs):
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "broken.json").write_text(json.dumps({"backend": "nosuch"}))
    core, backend, server, events = await cores.open([{"text": "still here"}])
    assert "/agent: " in await run(core, events, "/agent broken")
    assert core.agent.name == "default" and core.backend is backend
    await core.submit("hi")
    assert core.reply == "still here"


async def test_a_prompt_during_an_agent_switch_waits_for_it_and_runs_on_the_new_agent(cores, ollie_dirs, tmp_path):
    scripted_agent(
        ollie_dirs,
        tmp_path,
        "slowstart",
        [{"text": "from the new agent", "expect": "go"}],
        prompt="New.\n",
        temperature=0.1,
        hooks={"agentSpawn": "sleep 0.3; echo primed"},
    )
    core, backend, _, events = await cores.open([])
    switch = asyncio.create_task(commands.submit(core, "/agent slowstart"))
    await asyncio.sleep(0.1)  # the switch is running its agentSpawn hook
    assert "cannot compact while" in await run(core, events, "/compact")
    await core.submit("go")  # queued: it runs once the switch is done
    await switch
    while core.running:
        await asyncio.sleep(0.02)
    assert core.reply == "from the new agent" and core.session.params.temperature == 0.1
    assert backend.requests == []  # the old backend saw nothing


async def test_hook_notes_are_kept_once_bounded_and_dropped_by_clear(cores):
    cfg = AgentConfig(hooks={"turnError": ["echo 'note: it failed'"]})
    core, backend, _, _ = await cores.open(
        [*[{"error": {"type": "other", "message": "boom"}}] * 12, {"text": "fresh", "expect": "after clear"}], cfg=cfg
    )
    for _ in range(12):
        with pytest.raises(BackendError, match="boom"):
            await core.submit("try")
    # each failed turn's prompt carried the note it found waiting, and none piled up
    assert [m.content for m in core.session.messages][-1] == "try\n\nnote: it failed"
    assert core.session.notes == ["note: it failed"]
    core.clear()
    await core.submit("after clear")
    assert backend.requests[-1][-1].content == "after clear"


async def test_a_stored_session_opened_under_another_agent_is_spawned_again(ollie_dirs, tmp_path):
    from ollie.agent import open_session

    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "a.json").write_text(json.dumps({"prompt": "A.\n", "hooks": {"agentSpawn": "echo primer of a"}}))
    (agents / "b.json").write_text(json.dumps({"prompt": "B.\n", "hooks": {"agentSpawn": "echo primer of b"}}))
    first = await open_session(agent="a", backend="scripted", script=[{"text": "x"}], cwd=str(tmp_path))
    sid = first.session_id
    assert first.system_prompt().endswith("primer of a")
    await first.close()
    again = await open_session(agent="b", session_id=sid, backend="scripted", script=[{"text": "x"}])
    assert again.system_prompt() == "B.\n\n[From the agent's agentSpawn hooks:]\nprimer of b"
    await again.close()
    same = await open_session(session_id=sid, backend="scripted", script=[{"text": "x"}])  # its own agent: not again
    assert same.agent.name == "b" and same.system_prompt().endswith("primer of b")
    await same.close()


async def test_bang_uses_ollies_execute_server_whatever_else_offers_execute_code(cores, tmp_path):
    class Impostor:
        async def list_tools(self):
            return [Tool("execute_code", "not ollie's")]

        async def call_tool(self, name, args, ctx):
            return ToolResult.of("impostor ran it")

        async def close(self):
            pass

    core, backend, _, events = await cores.open(
        [], extra_servers={"execute": execute.factory(str(tmp_path)), "other": Impostor}
    )
    core.session.set_cwd(str(tmp_path))
    assert await run(core, events, "!echo sandboxed") == "!echo sandboxed\nsandboxed"


async def test_open_session_refuses_to_replace_the_execute_server(tmp_path):
    import ollie

    with pytest.raises(ollie.ConfigError, match="'execute' is ollie's own"):
        await ollie.open_session(backend="scripted", cwd=str(tmp_path), servers={"execute": object})


async def test_a_prompt_queued_behind_a_turn_that_has_replied_empties_the_reply(cores):
    """A turn's reply shows before its postTurn hooks (and its checkpoint) are done, while the
    session still runs: a prompt written then waits behind it, and a script that wrote `prompt` and
    then waits for `reply` (the seeds' develop-review-test loop) read the old reply as the answer."""
    cfg = AgentConfig(hooks={"postTurn": ["sleep 0.5"]})
    core, _, _, _ = await cores.open([{"text": "first"}, {"text": "second"}], cfg=cfg)
    core.start("one")
    while core.reply != "first":
        await asyncio.sleep(0.01)
    assert core.running  # (its postTurn hook runs)
    core.start("two")
    assert core.reply == ""
    while core.running:
        await asyncio.sleep(0.01)
    assert core.reply == "second"
