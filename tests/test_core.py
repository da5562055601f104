"""The agent loop against the scripted backend: events, states, tools, queueing, interrupts, retries,
limits and persistence."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from agent_helpers import kinds
from ollie import cost
from ollie.agent.loop import RESULT_LIMIT, _fit
from ollie.agent.session import SessionStore, list_stored
from ollie.chatfmt import cost_text
from ollie.config import AgentConfig
from ollie.types import BackendError, ConfigError, InvalidValue, OllieError, StoppedError, TurnError, Usage


def call(name, **args):
    return {"name": name, "arguments": args}


async def test_turn_events_reply_and_chat_log(cores):
    core, backend, server, events = await cores.open(
        [
            {"text": "Let me look.", "tool_calls": [call("echo", text="hello")]},
            {"text": "It said hello.", "expect": "hello"},
        ]
    )
    await core.submit("what does echo say?")
    assert kinds(events) == ["user", "assistant", "call", "tool", "assistant", "done"]
    assert core.reply == "Let me look.\nIt said hello."
    assert core.state == "idle"
    states = [e.text for e in events if e.kind == "state"]
    assert states == ["thinking", "calling: echo", "thinking", "idle"]
    assert core.session.chat_path.read_text() == (
        'user: what does echo say?\nassistant: Let me look.\n-> echo({"text": "hello"})\nhello\n'
        "assistant: It said hello.\n\n"
    )
    backend.assert_consumed()


async def test_calls_keep_model_order_and_read_only_calls_overlap(cores):
    core, backend, server, events = await cores.open(
        [
            {
                "tool_calls": [
                    call("sleep", seconds=0.2),
                    call("sleep", seconds=0.1),
                    call("write"),
                    call("echo", text="x"),
                ]
            },
            {"text": "ok"},
        ]
    )
    await core.submit("go")
    tool_msgs = [m for m in core.session.messages if m.role == "tool"]
    assert [m.content for m in tool_msgs] == ["slept 0.2", "slept 0.1", "written", "x"]
    assistant = core.session.messages[1]
    assert [m.tool_call_id for m in tool_msgs] == [c.id for c in assistant.tool_calls]
    assert server.max_running == 2  # the two sleeps ran together
    assert [c[0] for c in server.calls] == ["sleep", "sleep", "write", "echo"]


async def test_identical_read_only_calls_in_a_batch_run_once(cores):
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [call("echo", text="a"), call("echo", text="a")]},
            {"text": "ok"},
        ]
    )
    await core.submit("go")
    assert len(server.calls) == 1
    assert [m.content for m in core.session.messages if m.role == "tool"] == ["a", "a"]


async def test_a_second_submit_during_a_turn_queues_and_each_gets_its_own_reply(cores):
    core, backend, _, events = await cores.open(
        [
            {"text": "first", "delay": 0.2},
            {"text": "second", "expect": "two"},
        ]
    )
    first = asyncio.create_task(core.submit("one"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(core.submit("two"))
    await asyncio.sleep(0.01)
    assert core.queued() == ["two"] and not second.done()  # it waits for its own turn
    assert await first == "first"
    assert await second == "second"
    assert core.reply == "second"
    assert [m.content for m in core.session.messages if m.role == "user"] == ["one", "two"]
    backend.assert_consumed()


async def test_interrupt_keeps_completed_calls_and_strips_cancelled_ones(cores):
    core, backend, server, events = await cores.open(
        [
            {"text": "working", "tool_calls": [call("write"), call("sleep", seconds=30)]},
        ]
    )
    task = asyncio.create_task(core.submit("go"))
    await core.wait_change("state", "idle", timeout=2)
    while server.running == 0:
        await asyncio.sleep(0.01)
    assert core.interrupt() is True
    await asyncio.wait_for(task, 5)
    assert core.state == "idle" and not core.running
    assistant = core.session.messages[1]
    assert [c.name for c in assistant.tool_calls] == ["write"]
    assert [m.role for m in core.session.messages] == ["user", "assistant", "tool"]
    stored = SessionStore(core.session_id).load_history()
    assert [m.role for m in stored] == ["user", "assistant", "tool"]
    assert "info" in kinds(events) and core.interrupt() is False


async def test_inject_is_delivered_with_the_next_tool_result(cores):
    core, backend, server, _ = await cores.open(
        [
            {"tool_calls": [call("sleep", seconds=0.2)]},
            {"text": "noted", "expect": "<system-user-interruption>also check B</system-user-interruption>"},
        ]
    )
    task = asyncio.create_task(core.submit("check A"))
    while server.running == 0:
        await asyncio.sleep(0.01)
    core.inject("also check B")
    await task
    assert core.reply == "noted"
    backend.assert_consumed()


async def test_queue_and_inject_on_an_idle_session_start_the_turn(cores):
    """Idle means nothing runs and nothing is queued: a prompt queued or injected into an idle
    session runs at once, as one written to fifo.in does; one injected or queued during a turn
    still waits for it."""
    core, backend, _, _ = await cores.open(
        [
            {"text": "one done", "expect": "queued when idle"},
            {"text": "two done", "expect": "injected when idle"},
            {"text": "three done", "expect": "replaced when idle"},
            {"text": "four", "delay": 0.3},
            {"text": "five done", "expect": "queued behind four"},
        ]
    )

    async def until_idle() -> None:
        async with asyncio.timeout(5):
            while core.state != "idle":
                await core.wait_change("state", core.state)

    for send, prompt, reply in (
        (core.queue, "queued when idle", "one done"),
        (core.inject, "injected when idle", "two done"),
        (lambda p: core.inject(p, replace=True), "replaced when idle", "three done"),
    ):
        send(prompt)
        assert core.running and core.state == "thinking" and core.queued() == [], prompt
        await until_idle()
        assert core.reply == reply and core.queued() == []
    task = asyncio.create_task(core.submit("four"))
    await asyncio.sleep(0.05)
    core.queue("queued behind four")
    assert core.queued() == ["queued behind four"]  # a turn runs: it waits
    assert await task == "four"  # its own turn's reply; the queued prompt runs next
    await until_idle()
    assert core.reply == "five done" and core.queued() == []
    backend.assert_consumed()


async def test_rate_limit_and_dropped_stream_are_retried_without_duplicating_reply(cores):
    core, backend, _, events = await cores.open(
        [
            {"error": {"type": "rate_limit", "message": "slow down", "retry_after": 0.1}},
            {"text": "partial answer", "drop": True},
            {"text": "full answer"},
        ]
    )
    await core.submit("hi")
    assert core.reply == "full answer"
    assert [e.kind for e in events if e.kind in ("retry", "limitretry") and e.data["first"]] == ["limitretry", "retry"]
    assert [m.content for m in core.session.messages] == ["hi", "full answer"]


async def test_retry_waits_are_capped_and_cancellable(cores):
    core, backend, _, events = await cores.open(
        [
            {"error": {"type": "rate_limit", "message": "quota", "retry_after": 86400}},
        ]
    )
    task = asyncio.create_task(core.submit("hi"))
    while not any(e.kind == "limitretry" for e in events):
        await asyncio.sleep(0.01)
    assert core.state == "limitretry"
    first = next(e for e in events if e.kind == "limitretry")
    assert first.data["seconds"] == 60.0
    core.interrupt()
    await asyncio.wait_for(task, 2)
    assert core.state == "idle"


async def test_backend_error_ends_the_turn_keeps_work_and_session_stays_usable(cores):
    core, backend, _, events = await cores.open(
        [
            {"tool_calls": [call("echo", text="done once")]},
            {"error": {"type": "other", "message": "model exploded", "status": 400}},
            {"text": "fine now"},
        ]
    )
    with pytest.raises(BackendError, match="model exploded"):  # what ended the turn, raised from submit
        await core.submit("first")
    errors = [e.text for e in events if e.kind == "error"]
    assert errors == ["scripted (HTTP 400): model exploded"]
    assert [m.role for m in core.session.messages] == ["user", "assistant", "tool"]
    assert core.state == "idle"
    await core.submit("again")
    assert core.reply == "fine now"


async def test_invalid_arguments_unknown_and_empty_tools_become_error_results(cores):
    core, backend, _, _ = await cores.open(
        [
            {
                "tool_calls": [
                    {"name": "echo", "arguments": "{not json"},
                    {"name": "nope", "arguments": "{}"},
                    {"name": "", "arguments": "{}"},
                    {"name": "echo", "arguments": "[1, 2]"},
                ]
            },
            {"text": "sorry"},
        ]
    )
    await core.submit("go")
    results = [m for m in core.session.messages if m.role == "tool"]
    assert all(r.is_error for r in results)
    assert "arguments for echo are not valid JSON: Expecting property name" in results[0].content
    assert "unknown tool 'nope'" in results[1].content and "echo" in results[1].content
    assert "empty tool name" in results[2].content
    assert "must be a JSON object" in results[3].content


async def test_long_results_are_cut_with_the_rest_saved_where_the_model_can_read_it(cores):
    big = "x" * (RESULT_LIMIT * 3)
    core, backend, _, _ = await cores.open([{"tool_calls": [call("echo", text=big)]}, {"text": "ok"}])
    await core.submit("go")
    result = next(m for m in core.session.messages if m.role == "tool")
    assert len(result.content) < RESULT_LIMIT + 400
    assert f"first {RESULT_LIMIT} of {len(big)} bytes" in result.content
    path = result.content.split("the whole result is in ")[1].split(";")[0]
    assert open(path).read() == big
    # The session closed and continued: the file its history names is there again, as it was; what
    # code planted beside it (a link to a file it may not read) is not followed.
    (core.tmpdir / "results" / "result-planted.txt").symlink_to("/etc/hostname")
    sid = core.session_id
    await cores.close(core)
    assert not os.path.exists(path)
    again, *_ = await cores.open([], session_id=sid)
    assert open(path).read() == big and not (again.tmpdir / "results" / "result-planted.txt").exists()


async def test_a_scratch_directory_left_by_a_crash_leads_no_result_out_of_it(cores, tmp_path):
    """A crash leaves the scratch directory, which code wrote: a `results` link it planted there
    is not where a restore writes the results back."""
    big = "y" * (RESULT_LIMIT * 2)
    core, *_ = await cores.open([{"tool_calls": [call("echo", text=big)]}, {"text": "ok"}])
    await core.submit("go")
    sid, scratch = core.session_id, core.tmpdir
    await cores.close(core)
    outside = tmp_path / "outside"
    outside.mkdir()
    scratch.mkdir()
    (scratch / "results").symlink_to(outside)
    again, *_ = await cores.open([], session_id=sid)
    assert os.listdir(outside) == [] and again.tmpdir == scratch
    [kept] = os.listdir(scratch / "results")  # what its history names is back, in a directory of its own
    assert (scratch / "results" / kept).read_text() == big and not (scratch / "results").is_symlink()
    # A link planted in a live scratch directory (Landlock alone: the code writes it) leads no long
    # result out either: it is written by descriptor, or not at all.
    (scratch / "results" / kept).unlink()
    (scratch / "results").rmdir()
    (scratch / "results").symlink_to(outside)
    cut = _fit(scratch, "z" * (RESULT_LIMIT + 1))
    assert "the rest was not kept" in cut and os.listdir(outside) == []


async def test_failing_rounds_nudge_at_five_and_stop_at_ten(cores):
    script = [{"tool_calls": [call("fail", why=f"bad {i}")]} for i in range(10)]
    core, backend, _, events = await cores.open(script)
    with pytest.raises(TurnError, match="10 consecutive tool rounds failed"):
        await core.submit("try")
    tool_results = [m.content for m in core.session.messages if m.role == "tool"]
    assert "tool rounds in a row failed" in tool_results[4]
    assert "tool rounds in a row failed" not in tool_results[3]
    assert [e.text for e in events if e.kind == "error"] == ["10 consecutive tool rounds failed; stopping the turn"]
    assert core.state == "idle" and len(tool_results) == 10
    backend.assert_consumed()


async def test_max_steps_ends_with_a_final_answer_without_tools(cores):
    cfg = AgentConfig(max_steps=2)
    core, backend, server, events = await cores.open(
        [
            {"tool_calls": [call("echo", text="1")]},
            {"tool_calls": [call("echo", text="2")]},
            {"text": "summary of work", "expect": "step budget", "tool_calls": [call("echo", text="3")]},
        ],
        cfg=cfg,
    )
    await core.submit("go")
    assert core.reply == "summary of work"
    assert backend.tools_seen[-1] == [] and backend.tools_seen[0] != []
    assert "maxsteps" in kinds(events)
    # A call in the last answer is dropped: it could never get a result, which providers refuse.
    assert core.session.messages[-1].tool_calls == [] and len(server.calls) == 2


async def test_session_is_persisted_and_restored_with_usage_and_cost(cores):
    core, backend, _, _ = await cores.open(
        [
            {"text": "remembered", "usage": {"input_tokens": 100, "output_tokens": 7}},
        ]
    )
    sid = core.session_id
    await core.submit("remember 42")
    core.session.set_env("FOO", "bar")
    for bad in ("not a var", "1BAD", "", "A=B"):  # no program could read them by name
        with pytest.raises(InvalidValue, match="invalid variable name"):
            core.session.set_env(bad, "x")
    await cores.close(core)
    before = json.loads((core.session.store.dir / "meta.json").read_text())
    idle, _, _, _ = await cores.open([], session_id=sid)
    await cores.close(idle)  # opened and closed again, as a server's restart and stop do: no activity
    after = json.loads((core.session.store.dir / "meta.json").read_text())
    assert after["updated"] == before["updated"], {k: (v, after[k]) for k, v in before.items() if after[k] != v}
    assert not os.path.exists(core.tmpdir)
    again, backend2, _, _ = await cores.open([{"text": "it was 42", "expect": "what was it"}], session_id=sid)
    assert [m.content for m in again.session.messages] == ["remember 42", "remembered"]
    assert again.usage() == Usage(input_tokens=100, output_tokens=7, requests=1)
    assert again.session.env == {"FOO": "bar"}
    await again.submit("what was it")
    assert len(backend2.requests[0]) == 4  # system + the restored two + the new prompt
    assert [m.id for m in list_stored()] == [sid]


async def test_history_is_appended_never_rewritten(cores):
    core, backend, _, _ = await cores.open([{"text": "a"}, {"text": "b"}])
    path = SessionStore(core.session_id).dir / "history.jsonl"
    await core.submit("one")
    inode, first = os.stat(path).st_ino, path.read_text()
    await core.submit("two")
    assert os.stat(path).st_ino == inode and path.read_text().startswith(first)
    assert [json.loads(line)["content"] for line in path.read_text().splitlines()] == ["one", "a", "two", "b"]


async def test_wait_change_returns_when_state_changes(cores):
    core, backend, _, _ = await cores.open([{"text": "x", "delay": 0.1}])
    waiter = asyncio.create_task(core.wait_change("state", "idle"))
    await asyncio.sleep(0)
    task = asyncio.create_task(core.submit("go"))
    assert await asyncio.wait_for(waiter, 2) == "thinking"
    await task
    assert await core.wait_change("state", "idle", timeout=0.05) == "idle"


async def test_set_session_id_moves_files_and_tmpdir(cores, ollie_dirs):
    core, backend, _, _ = await cores.open([{"text": "x"}])
    await core.submit("go")
    old_dir, old_tmp = SessionStore(core.session_id).dir, core.tmpdir
    (old_tmp / "scratch").write_text("keep")
    core.set_session_id("renamed")
    assert not old_dir.exists() and not old_tmp.exists()
    assert (SessionStore("renamed").dir / "history.jsonl").exists()
    assert (core.tmpdir / "scratch").read_text() == "keep"
    with pytest.raises(ValueError):
        core.set_session_id("../evil")


async def test_a_spending_cap_refuses_a_model_without_a_price_unless_told(cores, monkeypatch, ollie_dirs):
    monkeypatch.setenv("OLLIE_MAX_SESSION_COST", "0.01")
    core, backend, _, events = await cores.open([{"text": "hi", "usage": {"input_tokens": 10**6}}])
    backend.name, backend.model = "openai", "mystery-model-7"  # a provider's model no price list knows
    with pytest.raises(TurnError, match="no price is known"):
        await core.submit("go")
    [error] = [e.text for e in events if e.kind == "error"]
    assert error.startswith("no price is known for model 'mystery-model-7' (backend openai), so ")
    assert "prices.yaml" in error and "OLLIE_ALLOW_UNPRICED=1" in error
    assert backend.requests == [] and core.session.messages == []  # refused before anything was sent
    monkeypatch.setenv("OLLIE_ALLOW_UNPRICED", "1")  # the user says so: it runs, counted as $0, said once
    await core.submit("go")
    assert core.reply == "hi" and "costSession=unknown" in cost_text(core.cost(), backend.model)
    assert [e.text for e in events if e.kind == "info" and "no price" in e.text] == [
        cost.unknown_notice("mystery-model-7", "openai")
    ]
    monkeypatch.delenv("OLLIE_ALLOW_UNPRICED")
    (ollie_dirs / "cfg" / "prices.yaml").write_text("mystery-model-7: {input: 0.001, output: 0.002}\n")
    assert core.cost().price_known  # a price of the user's own: the cap is kept with it


async def test_close_removes_only_its_own_tmpdir(cores):
    a, *_ = await cores.open([])
    b, *_ = await cores.open([])
    await cores.close(a)
    assert not a.tmpdir.exists() and b.tmpdir.exists()


async def test_spending_cap_is_checked_before_every_request_and_keeps_what_was_paid_for(cores, monkeypatch):
    monkeypatch.setenv("OLLIE_MAX_SESSION_COST", "0.01")
    core, backend, server, events = await cores.open(
        [
            {"tool_calls": [call("echo", text="paid")], "usage": {"input_tokens": 10, "cost": 0.5}},
        ]
    )
    with pytest.raises(TurnError, match="exceeds OLLIE_MAX_SESSION_COST"):
        await core.submit("go")
    assert [e.text for e in events if e.kind == "error"] == [
        "session cost $0.5000 exceeds OLLIE_MAX_SESSION_COST=$0.01; raise the cap to go on"
    ]
    assert [m.role for m in core.session.messages] == ["user", "assistant", "tool"]  # the paid answer and its call
    with pytest.raises(TurnError, match="OLLIE_MAX_SESSION_COST"):  # refused before the turn: no request,
        await core.submit("more")  # the prompt not taken into history
    assert len(backend.requests) == 1 and core.session.messages[-1].content == "paid"
    errors = [e.text for e in events if e.kind == "error"]
    assert core.state == "idle" and len(errors) == 2 and "OLLIE_MAX_SESSION_COST" in errors[-1]
    monkeypatch.setenv("OLLIE_MAX_SESSION_COST", "ten dollars")
    with pytest.raises(OllieError, match="not an amount of US dollars"):
        await core.submit("more")
    assert (
        "OLLIE_MAX_SESSION_COST='ten dollars' is not an amount of US dollars"
        in [e for e in events if e.kind == "error"][-1].text
    )


async def test_submit_empties_reply_at_once_and_a_restore_brings_it_back(cores):
    core, backend, _, _ = await cores.open([{"text": "first reply"}, {"text": "second", "delay": 0.2}])
    sid = core.session_id
    await core.submit("one")
    task = asyncio.create_task(core.submit("two"))
    await asyncio.sleep(0)  # the task has not run yet
    assert core.reply == "" and core.state == "thinking"
    await task
    await cores.close(core)
    again, *_ = await cores.open([], session_id=sid)
    assert again.reply == "second"


async def test_execute_calls_of_read_safe_tool_scripts_run_together(ollie_dirs, tmp_path):
    """Two calls of a script marked `ollie:parallel read` overlap: each waits for the other's mark."""
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.backends.scripted import ScriptedBackend
    from ollie.tools import dispatcher_factory, execute

    script = ollie_dirs / "cfg" / "tools" / "meet"
    script.write_text(
        '#!/bin/sh\n# ollie:parallel read\ntouch "$1"\n'
        'for i in $(seq 100); do [ -e "$2" ] && echo met && exit 0; sleep 0.05; done; exit 1\n'
    )
    script.chmod(0o755)
    calls = [
        {"name": "execute_code", "arguments": {"steps": [{"tool": "meet", "args": [a, b]}]}}
        for a, b in (("a", "b"), ("b", "a"))
    ]
    backend = ScriptedBackend([{"tool_calls": calls}, {"text": "done"}])
    nd = dispatcher_factory({"execute": execute.factory(str(tmp_path))})
    core = Core(CoreConfig(backend, await build_agent_env(AgentConfig(), nd(), str(tmp_path)), nd))
    await core.submit("go")
    assert [m.content.strip() for m in core.session.messages if m.role == "tool"] == ["met", "met"]
    await core.close()


async def test_a_torn_last_history_line_is_dropped_and_the_session_goes_on(cores):
    core, *_ = await cores.open([{"text": "a"}])
    sid = core.session_id
    await core.submit("one")
    await cores.close(core)
    with open(SessionStore(sid).dir / "history.jsonl", "a") as f:
        f.write('{"role": "assistant", "content": "cut off by a cra')  # a crash mid-write
    again, *_ = await cores.open([{"text": "b"}], session_id=sid)
    assert [m.content for m in again.session.messages] == ["one", "a"]
    await again.submit("two")
    await cores.close(again)
    third, *_ = await cores.open([], session_id=sid)
    assert [m.content for m in third.session.messages] == ["one", "a", "two", "b"]


async def test_a_cancelled_submit_takes_its_prompt_back(cores):
    """A timeout around `submit` stops what it asked for: its turn interrupted, or its prompt out
    of the queue; a prompt taken back with pop_queue tells its submit so."""
    core, backend, _, events = await cores.open([{"text": "too late", "delay": 30}, {"text": "again", "delay": 30}])

    async def stopped() -> None:
        async with asyncio.timeout(2):
            while core.running:
                await asyncio.sleep(0.01)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(core.submit("one"), 0.2)
    await stopped()
    assert core.reply == "" and "interrupted" in [e.text for e in events]
    slow = asyncio.create_task(core.submit("two is slow"))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(core.submit("dropped"))
    taken = asyncio.create_task(core.submit("taken back"))
    await asyncio.sleep(0.01)
    queued.cancel()
    await asyncio.sleep(0.01)
    assert core.queued() == ["taken back"]
    assert core.pop_queue() == "taken back"
    with pytest.raises(OllieError, match="taken back from the queue"):
        await taken
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    await stopped()
    assert core.queued() == []
    assert [m.content for m in core.session.messages if m.role == "user"] == ["one", "two is slow"]


async def test_close_during_a_turn_starts_no_queued_prompt(cores):
    core, backend, _, events = await cores.open([{"text": "slow", "delay": 30}])
    task = asyncio.create_task(core.submit("one"))
    await asyncio.sleep(0.05)
    two = asyncio.create_task(core.submit("two"))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(cores.close(core), 5)
    assert await task == ""  # its turn was stopped, as an interrupt stops it
    with pytest.raises(OllieError, match="the session closed before the prompt ran"):
        await two
    assert len(backend.requests) == 1
    assert "not run, the session closed first: two" in [e.text for e in events]  # said, in the chat too


async def test_calls_written_as_text_get_ids_unique_in_the_history(cores):
    same = '{"name": "echo", "arguments": {"text": "hi"}}'
    core, *_ = await cores.open([{"text": same}, {"text": same}, {"text": "done"}])
    await core.submit("go")
    ids = [c.id for m in core.session.messages for c in m.tool_calls]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert [m.tool_call_id for m in core.session.messages if m.role == "tool"] == ids


async def test_cut_results_are_saved_apart_inside_the_tmpdir_whatever_the_call_id(cores):
    big = "x" * RESULT_LIMIT
    core, *_ = await cores.open(
        [
            {"tool_calls": [{"id": "../../../escape", "name": "echo", "arguments": {"text": big + "1"}}]},
            {"tool_calls": [{"id": "../../../escape", "name": "echo", "arguments": {"text": big + "2"}}]},
            {"text": "ok"},
        ]
    )
    await core.submit("go")
    paths = [
        m.content.split("the whole result is in ")[1].split(";")[0] for m in core.session.messages if m.role == "tool"
    ]
    assert [open(p).read()[-1] for p in paths] == ["1", "2"]
    assert all(os.path.dirname(p) == str(core.tmpdir / "results") for p in paths)


async def test_a_failing_subscriber_does_not_stop_the_turn(cores):
    core, _, _, events = await cores.open([{"tool_calls": [call("echo", text="x")]}, {"text": "fine"}])

    def broken(ev):
        raise RuntimeError("frontend bug")

    core.subscribe(broken)
    await core.submit("go")
    assert core.reply == "fine" and core.state == "idle"


async def test_a_core_built_by_hand_asks_the_backend_for_its_window_before_the_first_turn(cores):
    core, backend, _, _ = await cores.open([{"text": "ok"}])
    backend._context_length = 32_000
    await core.submit("hi")
    assert core.ctxsz().window == 32_000 and core.ctxsz().percent == 0


async def test_an_expectation_the_loop_reported_still_fails_assert_consumed(cores):
    from ollie.backends.scripted import ScriptError

    core, backend, _, events = await cores.open([{"text": "x", "expect": "something else"}])
    with pytest.raises(ScriptError):
        await core.submit("hi")
    assert [e.text for e in events if e.kind == "error"][0].startswith("scripted backend: expected 'something else'")
    with pytest.raises(ScriptError):
        backend.assert_consumed()


async def test_a_turn_cut_short_by_a_crash_is_marked_in_the_chat_on_restore(cores):
    core, backend, _, _ = await cores.open([{"text": "done"}])
    await core.submit("one")
    sid = core.session_id
    await cores.close(core)  # (its process is gone: it holds the session no more)
    SessionStore(sid).append_chat("user: two\nassistant: half an ans")  # the process died here
    again, *_ = await cores.open([], session_id=sid)
    chat = again.session.chat_path.read_text()
    assert chat.endswith("half an ans\n:: the turn was cut short when ollie stopped; completed work is kept\n\n")
    await cores.close(again)
    third, *_ = await cores.open([], session_id=sid)  # a clean log is left alone
    assert third.session.chat_path.read_text() == chat


async def test_the_tmp_root_is_made_private_and_refused_when_another_user_owns_it(cores, ollie_dirs):
    root = ollie_dirs / "tmp"
    core, *_ = await cores.open([])
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and core.tmpdir.parent == root
    await cores.close(core)
    os.chown(root, 65534, 65534)  # as if another user had made /tmp/ollie first
    sessions = set((ollie_dirs / "data" / "sessions").iterdir())
    with pytest.raises(ConfigError, match=f"^{root} belongs to uid 65534, not to you"):
        await cores.open([])
    assert set((ollie_dirs / "data" / "sessions").iterdir()) == sessions  # nothing was started


@pytest.mark.parametrize(
    "stop_reason, words",
    [
        ("content_filter", "withheld by the provider's content filter"),
        ("refusal", "the model refused"),
        ("other", "a reason ollie does not know"),
    ],
)
async def test_an_answer_that_is_no_answer_is_reported_and_kept_without_its_calls(cores, stop_reason, words):
    core, backend, server, events = await cores.open(
        [
            {"text": "I was saying", "tool_calls": [call("write")], "stop_reason": stop_reason},
            {"text": "next turn", "expect": "again"},
        ]
    )
    with pytest.raises(StoppedError, match=words):
        await core.submit("go")
    errors = [e for e in events if e.kind == "error"]
    assert len(errors) == 1 and words in errors[0].text and errors[0].data["error_type"] == stop_reason
    assert server.calls == []  # its calls were not run
    assert [(m.role, m.content, m.tool_calls) for m in core.session.messages] == [
        ("user", "go", []),
        ("assistant", "I was saying", []),
    ]
    await core.submit("again")  # the session goes on
    assert core.reply == "next turn"


async def test_open_session_builds_a_core_in_one_call_from_a_config_in_code(tmp_path):
    import ollie
    from agent_helpers import ToyServer

    toy = ToyServer()
    script = [{"tool_calls": [call("echo", text="from my server")]}, {"text": "done", "expect": "from my server"}]
    cfg = ollie.AgentConfig(prompt="You are a test.\n", max_steps=5)
    async with ollie.open_session(
        agent=cfg, backend="scripted", script=script, cwd=str(tmp_path), servers={"mine": lambda: toy}
    ) as core:
        await core.submit("use my tool")
        assert core.reply == "done" and core.system_prompt() == "You are a test.\n"
        assert {"execute_code", "echo"} <= set(await core.dispatcher.list_tools())
        assert toy.calls == [("echo", {"text": "from my server"})]
    assert not core.tmpdir.exists()  # closed on the way out


async def test_the_state_is_idle_only_when_no_queued_turn_is_left(cores):
    cfg = AgentConfig(hooks={"preTurn": ["sleep 0.2"]})  # a gap between turns where idle used to show
    core, backend, _, events = await cores.open([{"text": "one", "delay": 0.1}, {"text": "two"}], cfg=cfg)
    first = asyncio.create_task(core.submit("first"))
    await asyncio.sleep(0.05)
    await core.submit("second")  # queued
    await first
    states = [e.text for e in events if e.kind == "state"]
    assert states[-1] == "idle" and "idle" not in states[:-1]
    assert [e.kind for e in events if e.kind == "done"] == ["done", "done"]
    assert core.reply == "two"


async def test_a_backend_switch_forgets_the_old_window(cores, tmp_path):
    core, backend, _, _ = await cores.open([{"text": "ok"}])
    backend._context_length = 1_000_000
    await core.submit("hi")
    assert core.ctxsz().window == 1_000_000
    (tmp_path / "other.json").write_text(json.dumps([{"text": "x"}]))
    await core.set_backend("scripted", str(tmp_path / "other.json"))
    assert core.ctxsz().window == 128_000  # until the new backend says otherwise


async def test_a_backend_chosen_over_the_agents_is_not_asked_for_the_agents_model(ollie_dirs, monkeypatch):
    """`ollie run --backend ollama` with an agent made for Anthropic: Ollama gets its own default
    model (or OLLIE_MODEL), not `claude-…`; the agent's model stands with its own backend, or with
    any when the agent names none."""
    from ollie import open_session
    from ollie.backends import ollama

    monkeypatch.setenv("OLLIE_OLLAMA_URL", "http://127.0.0.1:9")  # nothing there: its window stays unknown
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir(exist_ok=True)
    (agents / "claude.json").write_text(json.dumps({"backend": "anthropic", "model": "claude-sonnet-4-5"}))
    (agents / "anywhere.json").write_text(json.dumps({"model": "qwen3:8b"}))
    (agents / "own.json").write_text(json.dumps({"backend": "ollama", "model": "qwen3:8b"}))

    async def model_of(agent: str) -> str:
        core = await open_session(agent=agent, backend="ollama")
        await core.close()
        return core.backend.model

    assert await model_of("claude") == ollama.DEFAULT_MODEL
    monkeypatch.setenv("OLLIE_MODEL", "mistral")
    assert await model_of("claude") == "mistral"
    assert await model_of("anywhere") == "qwen3:8b" and await model_of("own") == "qwen3:8b"


async def test_a_session_stored_with_a_value_now_refused_opens_without_it(ollie_dirs):
    """`temperature=nan` was taken and stored before values were checked: the session opens, with
    the rest of its settings, and its requests no longer fail."""
    from ollie import open_session

    core = await open_session(backend="scripted", script=[{"text": "x"}])
    core.session.set_param("top_p", "0.5")
    await core.submit("hi")
    sid = core.session_id
    await core.close()
    meta_file = SessionStore(sid).dir / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["params"]["temperature"] = float("nan")
    meta_file.write_text(json.dumps(meta))
    again = await open_session(session_id=sid, backend="scripted", script=[{"text": "y"}])
    assert again.session.params.nonempty() == {"top_p": 0.5}
    await again.close()
