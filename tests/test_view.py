"""A session's own view of ollie's files at $OLLIE, as its sandboxed code sees it: each test runs
real execute_code stages in the session's jail, which mounts the view the server serves."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ollie.agent import commands
from ollie.fs import sessions as sessions_module
from ollie.fs.sessions import Sessions
from script_helpers import DEFAULTS
from view_helpers import start_child, views


async def test_the_view_holds_the_session_and_the_shared_directories(h):
    other = await h.new()
    me = await h.new()
    assert (await h.ok(me, "ls $OLLIE")).split() == ["b", "ctl", "help", "m", "p", "pl", "s", "sk", "t"]
    assert (await h.ok(me, "ls $OLLIE/s")).split() == [me.id]  # not the other session
    assert (await h.ok(me, "cat $OLLIE/s/$OLLIE_SESSION_ID/state")).strip() in ("idle", "calling: execute_code")
    assert "sub-session" in await h.ok(me, "cat $OLLIE/help")
    await h.ok(me, "echo 'a note' > $OLLIE/m/note.md && cat $OLLIE/t/idx > /dev/null && ls $OLLIE/pl")
    memory = Path(sessions_module.config.data_path()) / "memory" / "note.md"
    assert memory.read_text() == "a note\n"
    await h.fails(me, f"cat $OLLIE/s/{other.id}/chat")


NO_NODE, DENIED = "No such file or directory", "Permission denied"


@pytest.mark.parametrize(
    ("what", "code", "error"),
    [
        ("another session's files", "cat $OLLIE/s/{other}/chat", NO_NODE),
        ("another session's ctl", "echo stop > $OLLIE/s/{other}/ctl", NO_NODE),
        ("ending another session", "echo 'kill {other}' > $OLLIE/ctl", NO_NODE),
        ("removing another session", "rm -r $OLLIE/s/{other}", NO_NODE),
        ("agent configs (hooks run unsandboxed)", "ls $OLLIE/a", NO_NODE),
        ("writing an agent config", "echo '{{}}' > $OLLIE/a/evil.json", NO_NODE),
        ("plugins", "ls $OLLIE/x", NO_NODE),
        ("utilities", "ls $OLLIE/u", NO_NODE),
        ("transcripts", "ls $OLLIE/tr", NO_NODE),
        ("the server's scratch", "ls $OLLIE/tmp", NO_NODE),
        ("writing a tool script", "echo 'echo pwned' > $OLLIE/t/evil", DENIED),
        ("writing a skill", "echo pwned > $OLLIE/sk/evil", DENIED),
        ("its own prompt", "echo '!touch /tmp/x' > $OLLIE/s/$OLLIE_SESSION_ID/prompt", DENIED),
        ("its own ctl", "echo 'cwd /' > $OLLIE/s/$OLLIE_SESSION_ID/ctl", DENIED),
        ("its own cfg", "echo 'agent=wide' > $OLLIE/s/$OLLIE_SESSION_ID/cfg", DENIED),
        ("its own env", "echo 'PATH=/tmp' > $OLLIE/s/$OLLIE_SESSION_ID/env", DENIED),
        ("renaming itself", "mv $OLLIE/s/$OLLIE_SESSION_ID $OLLIE/s/renamed", DENIED),
        ("running a program from the view", "cp /bin/true $OLLIE/m/t && $OLLIE/m/t", DENIED),
    ],
)
async def test_what_the_view_does_not_reach(h, what, code, error):
    other = await h.new()
    me = await h.new()
    before = (me.settings()["cwd"], me.settings()["agent"], dict(me.env()), me.id)
    assert error in await h.fails(me, code.format(other=other.id))
    assert h.sessions.get(other.id) is other  # still there
    assert (me.settings()["cwd"], me.settings()["agent"], dict(me.env()), me.id) == before
    assert not (h.cfg / "tools" / "evil").exists() and not (h.cfg / "agents" / "evil.json").exists()
    assert [m.content for m in me.messages() if m.role == "user"] == []  # no prompt was submitted


async def test_plan_is_writable_and_a_thought_lands_in_the_chat(h, monkeypatch):
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(DEFAULTS))
    me = await h.new()
    await h.ok(me, "printf '1. read\\n2. write\\n' > $OLLIE/s/$OLLIE_SESSION_ID/plan")
    assert me.plan == "1. read\n2. write\n"
    core = await me.wake()
    server = core.dispatcher.get_server("execute")
    steps = {"steps": [{"tool": "reasoning_think", "args": ["the tests live under tests/"]}]}
    result = await server.call_tool("execute_code", steps, core.call_context())
    assert not result.is_error and result.text().strip() == "noted", result.text()
    assert "thought: the tests live under tests/" in me.chat_path.read_text()


async def test_a_session_drives_a_sub_session_it_starts(h):
    parent = await h.new()
    child = await start_child(h, parent, f"cwd={h.work}/sub")
    assert child.meta.parent == parent.id and child.settings()["cwd"] == str(h.work / "sub")
    assert child.settings()["agent"] == "default"
    assert (await h.ok(parent, "ls $OLLIE/s")).split() == [parent.id, child.id]
    reply = await h.ok(
        parent,
        f"""s=$OLLIE/s/{child.id}
        echo 'hello child' > $s/prompt
        until [ "$(cat $s/state)" = idle ]; do cat $s/statewait > /dev/null; done
        cat $s/reply""",
    )
    assert reply.strip() == "default says ok"
    # A sub-session of the sub-session is the parent's to see and end too.
    grandchild = await start_child(h, child, "")
    assert grandchild.settings()["cwd"] == str(h.work / "sub")  # the parent's cwd by default
    assert grandchild.id in (await h.ok(parent, "ls $OLLIE/s")).split()
    named = await start_child(h, parent, "name=rv")  # <parent>.rv, found as rv in the view: ended so too
    assert named.id == f"{parent.id}.rv" and (await h.ok(parent, "cat $OLLIE/s/rv/state")).strip() == "idle"
    await h.ok(parent, "echo 'kill rv' > $OLLIE/ctl")
    assert h.sessions.find(named.id) is None
    await h.ok(parent, f"rm -r $OLLIE/s/{child.id}")
    assert {s.id for s in h.sessions.all()} == {parent.id}  # the grandchild went with it


async def test_a_sub_session_gets_no_more_than_its_parent(h):
    h.agent("lead", subagents=["helper"])
    h.agent("helper")
    h.agent("wide", sandboxes=["default"])
    (h.work / "out").symlink_to("/etc")
    parent = await h.new(agent="lead")
    refused = {
        "cwd=/": "outside",
        f"cwd={h.work}/out": "outside",  # a link inside that leads out
        f"cwd={h.work}/../": "outside",
        "agent=wide": "subagents",
    }
    for spec, why in refused.items():
        out = await h.fails(parent, f"echo 'new {spec}' > $OLLIE/ctl; cat $OLLIE/s/$OLLIE_SESSION_ID/chat; exit 1")
        assert DENIED in out and why in out, (spec, out)  # the reason is in the parent's chat
    assert [s.id for s in h.sessions.all()] == [parent.id]
    child = await start_child(h, parent, "agent=helper")
    assert child.settings()["agent"] == "helper"
    # Once started, the sub-session cannot be widened either: not by ctl, cfg or a /command.
    s = f"$OLLIE/s/{child.id}"
    for code in (
        f"echo 'cwd /' > {s}/ctl",
        f"echo 'cwd=/' > {s}/cfg",
        f"echo 'agent wide' > {s}/ctl",
        f"echo 'rn elsewhere' > {s}/ctl",
        f"echo 'save' > {s}/ctl",
        f"echo 'PATH=/tmp' > {s}/env",
    ):
        await h.fails(parent, code)
    await h.ok(parent, f"echo '/cwd /' > {s}/prompt")  # refused at close: the write itself succeeds
    assert child.settings()["cwd"] == str(h.work) and child.settings()["agent"] == "helper"
    assert child.env() == {} and h.sessions.get(child.id) is child
    await h.ok(parent, f"echo 'cwd {h.work}/sub' > {s}/ctl")  # within bounds: taken
    assert child.settings()["cwd"] == str(h.work / "sub")


async def test_sub_sessions_are_bounded_in_number(h, monkeypatch):
    monkeypatch.setattr(sessions_module, "CHILDREN_MAX", 2)
    parent = await h.new()
    await start_child(h, parent, "")
    await start_child(h, parent, "")
    out = await h.fails(parent, "echo new > $OLLIE/ctl")
    assert "Permission denied" in out
    assert len(h.sessions.children(parent.id)) == 2


async def test_sub_sessions_stay_sub_sessions_after_a_restart(h):
    parent = await h.new()
    child = await start_child(h, parent, "")
    await h.sessions.close()
    again = Sessions(default_cwd=str(h.work))
    again.restore()
    try:
        assert again.get(child.id).meta.parent == parent.id
        await again.kill(parent.id)
        with pytest.raises(Exception, match="no session"):
            again.get(child.id)
    finally:
        await again.close()
    h.sessions = Sessions()


async def test_the_view_ends_with_its_session(h):
    me = await h.new()
    await h.ok(me, "ls $OLLIE > /dev/null")
    threads = views()
    assert len(threads) == 1
    await h.sessions.kill(me.id)
    for thread in threads:  # the jail's end aborts the connection: libfuse returns
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()


async def test_a_prompt_command_runs_in_the_sessions_sandbox(h):
    """`!cmd` written to a session's prompt is the session's code: it sees the view, not the host."""
    me = await h.new()
    await commands.submit(await me.wake(), "!ls $OLLIE/s; ls $OLLIE/a 2>&1 || true")
    chat = me.chat_path.read_text()
    assert f"\n{me.id}\n" in chat and "No such file" in chat


async def test_the_documented_sub_session_example_runs_verbatim(h):
    docs = (Path(__file__).resolve().parent.parent / "docs" / "files.md").read_text()
    example = docs.split("```sh\n# inside execute_code:", 1)[1].split("```", 1)[0].split("\n", 1)[1]
    h.agent("lead", subagents=["reviewer"])
    h.agent("reviewer")
    parent = await h.new(agent="lead")
    assert (await h.ok(parent, example)).strip() == "reviewer says ok"
    assert [s.id for s in h.sessions.all()] == [parent.id]  # the example ends its sub-session


async def test_without_fuse_a_jail_runs_code_without_the_view_and_says_so(h, monkeypatch):
    monkeypatch.setenv("OLLIE", "/proc/no-such-dir/mnt")  # nowhere a jail can mount
    me = await h.new()
    first = await h.ok(me, "echo ${OLLIE:-unset}")
    assert first.startswith("[no view of ollie's files at $OLLIE in this sandbox: ") and first.endswith("unset\n")
    assert await h.ok(me, "echo ${OLLIE:-unset}") == "unset\n"  # said once
    assert not views()
