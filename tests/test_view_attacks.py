"""Attacks on a session's view ($OLLIE) that succeed today: each test asserts what the threat
model promises, and fails while the hole is open. Found by a red-team review of the view."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import threading
import time

from view_helpers import start_child


async def test_a_sub_session_runs_no_prompt_command_outside_the_sandbox(h):
    """An agent whose prompt is `!git status` runs it unsandboxed in the new session's cwd; the
    parent's code picks that cwd and plants `.git/config` there first (core.fsmonitor)."""
    h.agent("gitty")
    path = h.cfg / "agents" / "gitty.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "prompt": "!git status --short"}))
    subprocess.run(["git", "init", "-q", str(h.work)], check=True)
    proof = h.root / "ran-outside"  # the jail's /tmp is private: only an unsandboxed process writes here
    parent = await h.new(agent="gitty")
    await h.sh(
        parent,
        f"""export HOME=$TMPDIR GIT_CONFIG_NOSYSTEM=1
        mkdir {h.work}/evil && cd {h.work}/evil && git init -q . && git config core.fsmonitor 'id > {proof}; false'
        echo "new cwd={h.work}/evil" > $OLLIE/ctl""",
    )
    assert not proof.exists(), proof.read_text()


async def test_a_sub_session_starts_no_tool_server_from_code_the_sandbox_wrote(h):
    """A stdio MCP server (`python3 -m helper_mcp`) starts unsandboxed in the sub-session's cwd,
    where the parent's code has put a module of that name."""
    h.agent("mcpy")
    path = h.cfg / "agents" / "mcpy.json"
    servers = {"helper": {"command": "python3", "args": ["-m", "helper_mcp"]}}
    path.write_text(json.dumps({**json.loads(path.read_text()), "mcpServers": servers}))
    proof = h.root / "ran-outside"
    parent = await h.new(agent="mcpy")
    await h.sh(
        parent,
        f"""mkdir {h.work}/evil && printf 'open("{proof}", "w").write("pwned")\\n' > {h.work}/evil/helper_mcp.py
        echo "new cwd={h.work}/evil" > $OLLIE/ctl""",
    )
    await asyncio.sleep(2)
    assert not proof.exists()


async def test_a_sub_sessions_model_reads_no_file_outside_the_sandbox(h):
    """backend=scripted takes its model as a script path, which the server reads unconfined; the
    refusal, which quotes what it read, lands in the parent's chat, which its code reads."""
    secret = h.root / "secret.json"  # outside the sandbox: the stage cannot read it
    secret.write_text(json.dumps(["sk-THE-SECRET-KEY-0123456789"]))
    parent = await h.new()
    _, out = await h.sh(
        parent,
        f"""cat {secret}; echo "new backend=scripted model={secret}" > $OLLIE/ctl
        cat $OLLIE/s/$OLLIE_SESSION_ID/chat""",
    )
    assert "THE-SECRET" not in out


async def test_a_sub_sessions_model_cannot_stall_the_server(h):
    """A FIFO given as a scripted model path: the server's event loop blocks in open() until a
    writer comes, which nothing ever does (every session and the user's mount hang)."""
    parent = await h.new()
    fifo = h.work / "f.json"
    gaps: list[float] = []
    done = False

    async def heartbeat() -> None:
        last = time.monotonic()
        while not done:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    def rescue() -> None:  # unblock the test after 4 s (nothing would, outside a test)
        time.sleep(4)
        for _ in range(100):
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno not in (errno.ENXIO, errno.ENOENT):
                    return
                time.sleep(0.1)
                continue
            os.write(fd, b"[]")
            os.close(fd)
            return

    threading.Thread(target=rescue, daemon=True).start()
    beat = asyncio.ensure_future(heartbeat())
    await h.sh(parent, f'mkfifo {fifo} && echo "new backend=scripted model={fifo}" > $OLLIE/ctl')
    done = True
    await beat
    assert max(gaps) < 2, f"the event loop stood still for {max(gaps):.1f} s"


async def test_a_tool_directory_in_the_cwd_swapped_for_a_link_shows_nothing_else(h, monkeypatch):
    """t/ follows no symlink in its last component, but the tool directory itself (in the cwd,
    as the view's own comment allows) can be renamed away and replaced by a link to anywhere."""
    elsewhere = h.root / "dotssh"
    elsewhere.mkdir()
    (elsewhere / "id_rsa").write_text("PRIVATE KEY\n")
    tools = h.work / "tools"
    tools.mkdir()
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(tools))
    me = await h.new()
    _, out = await h.sh(me, f"mv {tools} {tools}.old; ln -s {elsewhere} {tools}; cat $OLLIE/t/id_rsa")
    assert "PRIVATE KEY" not in out


async def test_ending_a_session_leaves_no_sub_session_behind(h):
    """The parent's code still runs while `kill` closes its sub-sessions (the parent last, and out
    of the registry already): a `new` then makes a sub-session no kill reaches, outside any tree."""
    parent = await h.new()
    child = await start_child(h, parent, "")
    await h.ok(child, "true")  # a jail to close: the kill takes a moment
    loop = "for i in $(seq 200); do echo new > $OLLIE/ctl 2>/dev/null; sleep 0.02; done"
    stage = asyncio.ensure_future(h.sh(parent, loop))
    await asyncio.sleep(1.0)
    await h.sessions.kill(parent.id)
    await asyncio.gather(asyncio.wait_for(stage, 30), return_exceptions=True)
    assert [(s.id, s.meta.parent) for s in h.sessions.all()] == []
