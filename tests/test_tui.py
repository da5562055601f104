"""The terminal frontend (`ollie`, `ollie chat`): the real UI in tmux against a real file server
with scripted agents, plus its parts (the chat parse, the renderer, `ollie keys`) on their own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from fs_helpers import OLLIE, FsServer
from ollie.tui import keys, render
from ollie.tui.model import Conversation
from tui_helpers import Tmux

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

COUNT = {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "seq 1 12"}]}}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = FsServer(tmp_path_factory.mktemp("tui"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def tmux(server, tmp_path):
    t = Tmux(tmp_path, server.env)
    try:
        yield t
    finally:
        t.close()


def workdir(server: FsServer, name: str) -> Path:
    d = server.work / name
    d.mkdir()
    return d


def session_of(server: FsServer, cwd: Path) -> str:
    ids = [ln.split("\t")[0] for ln in (server.mnt / "s" / "idx").read_text().splitlines() if f"\t{cwd}\t" in ln]
    assert len(ids) == 1, ids
    return ids[0]


# ---- the UI in tmux ---------------------------------------------------------------------------------------


def test_a_conversation_with_a_tool_call_folded_and_unfolded(server, tmux):
    server.agent("count", turns=[COUNT, {"text": "Counted **twelve** numbers.", "chunk": 4}])
    cwd = workdir(server, "count")
    tmux.ollie("--agent", "count", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("count to twelve")
    tmux.keys("Enter")
    screen = tmux.wait_for("Counted twelve numbers.")
    assert "> count to twelve" in screen
    assert "-> execute_code: seq 1 12" in screen
    assert "    4\n    ... 8 more lines (Ctrl-O to unfold)" in screen
    assert "    12" not in screen
    tmux.keys("C-o")
    assert "    12" in tmux.wait_for("    12")
    # The same session, seen through the files: the chat holds the whole conversation.
    chat = (server.mnt / "s" / session_of(server, cwd) / "chat").read_text()
    assert "user: count to twelve\n-> execute_code(" in chat and "assistant: Counted **twelve** numbers." in chat


def test_enter_submits_ctrl_j_and_a_paste_make_new_lines(server, tmux):
    server.agent("echo", rules=[{"match": "(?s)one.*two.*three", "text": "got three lines"}])
    cwd = workdir(server, "lines")
    tmux.ollie("--agent", "echo", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("one")
    tmux.keys("C-j")
    tmux.paste("two\nthree")  # bracketed: the newline does not submit
    time.sleep(0.3)
    assert "got three lines" not in tmux.screen()
    tmux.keys("Enter")
    tmux.wait_for("got three lines")
    assert (server.mnt / "s" / session_of(server, cwd) / "prompt.prev").read_text().strip() == "one\ntwo\nthree"


def test_ctrl_c_interrupts_the_turn_and_twice_leaves_keeping_the_session(server, tmux):
    server.agent("slow", turns=[{"text": "too late", "delay": 60}])
    cwd = workdir(server, "slow")
    tmux.ollie("--agent", "slow", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("take your time")
    tmux.keys("Enter")
    tmux.wait_for("thinking")
    tmux.keys("C-c")
    screen = tmux.wait_for(":: interrupted")
    tmux.wait_for(" idle ")
    assert "too late" not in screen
    sid = session_of(server, cwd)
    time.sleep(1.1)  # a Ctrl-C within a second of the last leaves: this pair must be a pair of its own
    tmux.keys("C-c", "C-c")
    screen = tmux.wait_for("[exited 0]")
    assert f"session: {sid}" in screen
    assert (server.mnt / "s" / sid / "state").read_text().strip() == "idle"  # the session lives on


def test_a_prompt_typed_during_a_turn_is_queued(server, tmux):
    server.agent("queue", turns=[{"text": "first answer", "delay": 2}, {"text": "second answer"}])
    cwd = workdir(server, "queue")
    tmux.ollie("--agent", "queue", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("first")
    tmux.keys("Enter")
    tmux.wait_for("thinking")
    tmux.type("second")
    tmux.keys("Enter")
    assert "queued" in tmux.wait_for("queued")
    screen = tmux.wait_for("second answer")
    assert (
        screen.index("> first")
        < screen.index("first answer")
        < screen.index("> second")
        < screen.index("second answer")
    )


def test_bang_runs_in_the_users_shell_and_its_output_goes_to_the_model(server, tmux):
    server.agent("shell", rules=[{"match": "shell-said-bar", "text": "I see your output"}])
    cwd = workdir(server, "shell")
    (cwd / "here.txt").write_text("x")
    tmux.ollie("--agent", "shell", cwd=cwd)
    tmux.wait_for(" idle ")
    sid = session_of(server, cwd)
    (server.mnt / "s" / sid / "env").write_text("FOO=bar\n")
    tmux.type("!ls; echo shell-said-$FOO")
    tmux.keys("Enter")
    screen = tmux.wait_for("shell-said-bar")
    assert "! ls; echo shell-said-$FOO" in screen and "here.txt" in screen
    tmux.type("what did it say?")
    tmux.keys("Enter")
    tmux.wait_for("I see your output")
    history = (server.mnt / "s" / sid / "context").read_text()
    assert "shell-said-bar" in history and "what did it say?" in history


def test_slash_commands_of_the_core_and_of_the_terminal(server, tmp_path):
    server.agent("cmds", rules=[{"match": ".", "text": "ok"}])
    cwd = workdir(server, "cmds")
    with contextlib.closing(Tmux(tmp_path, server.env, height=60)) as tmux:
        slash_commands(server, tmux, cwd)


def slash_commands(server: FsServer, tmux: Tmux, cwd: Path) -> None:
    tmux.ollie("--agent", "cmds", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("/agent")
    tmux.keys("Enter")
    tmux.wait_for(":: agent: cmds, backend: scripted")
    tmux.type("/help")
    tmux.keys("Enter")
    screen = tmux.wait_for("/compact")
    assert "/switch" in screen and "/sessions" in screen
    tmux.type("/sessions")
    tmux.keys("Enter")
    assert f"* {session_of(server, cwd)}" in tmux.wait_for("* ")
    tmux.type("/cwd /no/such/dir")
    tmux.keys("Enter")
    tmux.wait_for("error: /cwd: ")
    tmux.type("/mod")
    tmux.keys("Tab")
    tmux.wait_for("> /model")


def test_the_last_session_of_the_directory_is_resumed_and_new_starts_another(server, tmux):
    server.agent("resume", rules=[{"match": ".", "text": "noted"}])
    cwd = workdir(server, "resume")
    sid = server.new_session(agent="resume", cwd=str(cwd))
    (server.mnt / "s" / sid / "prompt").write_text("remember the word banana")
    server.wait_idle(sid)
    tmux.ollie(cwd=cwd)
    screen = tmux.wait_for("remember the word banana")
    assert "noted" in screen and sid in screen
    tmux.keys("C-c", "C-c")
    tmux.wait_for("[exited 0]")
    tmux.close()
    tmux.ollie("--new", "--agent", "resume", cwd=cwd)
    tmux.wait_for(" idle ")
    assert "banana" not in tmux.screen()
    ids = [ln.split("\t")[0] for ln in (server.mnt / "s" / "idx").read_text().splitlines() if f"\t{cwd}\t" in ln]
    assert len(ids) == 2


def test_80x24_keeps_the_status_line_and_input(server, tmp_path):
    server.agent("small", turns=[{"text": "\n".join(f"line {i}" for i in range(60))}])
    cwd = workdir(server, "small")
    t = Tmux(tmp_path, server.env, width=80, height=24)
    try:
        t.ollie("--agent", "small", cwd=cwd)
        t.wait_for(" idle ")
        t.type("many lines")
        t.keys("Enter")
        rows = t.wait_for("line 59").split("\n")
        assert rows[22].startswith(" idle |") and rows[23].startswith(">")
        assert "line 40" in rows[0] or "line 3" in rows[0]  # the end of the conversation is in view
        t.keys("PageUp")
        screen = t.wait_for("line 59", gone=True)
        assert "line 20" in screen and "PgDn" in screen
        t.keys("PageDown", "PageDown", "PageDown")
        t.wait_for("line 59")
    finally:
        t.close()


def test_a_restarted_server_gives_the_session_back(tmp_path):
    srv = FsServer(tmp_path / "srv")
    srv.agent("default", rules=[{"match": "again", "text": "welcome back"}, {"match": ".", "text": "hello"}])
    t = Tmux(tmp_path, srv.env)
    try:
        t.ollie(cwd=srv.work)  # no server runs: `ollie` starts one
        t.wait_for(" idle ", timeout=60)
        assert (srv.root / "ns" / "ollie.pid").exists()
        t.type("hi")
        t.keys("Enter")
        t.wait_for("hello")
        srv.ollie("srv", "stop")
        t.wait_for("connection lost")
        srv.start()
        t.wait_for(" idle ", timeout=30)  # reconnected, following the same session
        t.type("again")
        t.keys("Enter")
        t.wait_for("welcome back")
        t.keys("C-c", "C-c")
        t.wait_for("[exited 0]")
        t.close()
        srv.stop()
        srv.start()  # and a fresh `ollie` resumes it, the conversation so far on screen
        t.ollie(cwd=srv.work)
        screen = t.wait_for("welcome back")
        assert "> hi" in screen and "hello" in screen and "> again" in screen
    finally:
        t.close()
        srv.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_remote_session_over_9p_tcp_with_its_token(tmp_path):
    remote = FsServer(tmp_path / "remote")
    remote.agent("default", rules=[{"match": ".", "text": "answered remotely"}])
    port = free_port()
    out = remote.ollie("srv", "start", "--tcp", f"127.0.0.1:{port}", check=False)
    assert out.returncode == 0, out.stderr
    here = FsServer(tmp_path / "here")  # the user's own machine: no server runs, none is started
    t = Tmux(tmp_path, here.env)
    try:
        token = remote.root / "ns" / "ollie.token"
        bad = tmp_path / "bad.token"
        bad.write_text("guess\n")
        t.ollie("--addr", f"tcp!127.0.0.1!{port}", "--token-file", str(bad), "--cwd", str(remote.work), cwd=here.work)
        assert "permission denied" in t.wait_for("[exited 1]")
        t.close()
        t.ollie("--addr", f"tcp!127.0.0.1!{port}", "--token-file", str(token), "--cwd", str(remote.work), cwd=here.work)
        t.wait_for(" idle ")
        t.type("are you there?")
        t.keys("Enter")
        t.wait_for("answered remotely")
        assert not (here.root / "ns" / "ollie.pid").exists()
        [line] = (remote.mnt / "s" / "idx").read_text().splitlines()
        sid = line.split("\t")[0]
        assert "user: are you there?" in (remote.mnt / "s" / sid / "chat").read_text()
    finally:
        t.close()
        remote.stop()


# ---- without a terminal -----------------------------------------------------------------------------------


def test_plain_line_output_when_stdout_is_no_terminal(server):
    server.agent("plain", turns=[COUNT, {"text": "twelve"}])
    cwd = workdir(server, "plain")
    out = subprocess.run(
        [*OLLIE, "--agent", "plain", "--cwd", str(cwd)],
        input="count\n/agent\n",
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "user: count\n-> execute_code(" in out.stdout and "\n12\nassistant: twelve\n" in out.stdout
    assert ":: agent: plain" in out.stdout
    assert "\x1b" not in out.stdout


def test_keys_set_stores_the_key_in_a_private_env_file(tmp_path):
    env = {**os.environ, "OLLIE_CFG_PATH": str(tmp_path / "cfg")}
    env.pop("ANTHROPIC_API_KEY", None)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "env").write_text("# mine\nOLLIE_MODEL=x\nANTHROPIC_API_KEY=old\n")
    run = [*OLLIE, "keys"]
    key = "sk-ant-0123456789\n"
    out = subprocess.run([*run, "set", "anthropic"], input=key, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "cfg" / "env"
    assert path.read_text() == "# mine\nOLLIE_MODEL=x\nANTHROPIC_API_KEY=sk-ant-0123456789\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = subprocess.run([*run, "list"], env=env, capture_output=True, text=True).stdout
    assert listed == "ANTHROPIC_API_KEY=sk-a...89\n"
    assert subprocess.run([*run, "set", "nobody"], env=env, capture_output=True, text=True).returncode == 2


# ---- the parts --------------------------------------------------------------------------------------------


def test_the_chat_parses_the_same_in_any_pieces():
    chat = (
        "user: what is here?\nsecond line\nassistant: Let me look.\n"
        '-> execute_code({"steps": [{"code": "ls"}]})\nREADME.md\nsrc\n'
        "retrying in 2s...\nerror: boom\n:: thought: hmm\n:: interrupted\nassistant: Two.\n\n"
    )
    whole = Conversation()
    whole.feed(chat)
    kinds = [(b.kind, b.head, b.lines) for b in whole.blocks]
    assert kinds[:3] == [
        ("user", "", ["what is here?", "second line"]),
        ("assistant", "", ["Let me look."]),
        ("call", 'execute_code({"steps": [{"code": "ls"}]})', ["README.md", "src"]),
    ]
    assert [k for k, _, _ in kinds[3:]] == ["retry", "error", "thought", "info", "assistant"]
    for size in (1, 3, 7):
        parts = Conversation()
        for i in range(0, len(chat), size):
            parts.feed(chat[i : i + size])
            parts.view()  # a provisional view at every step must not disturb the parse
        assert [(b.kind, b.head, b.lines) for b in parts.blocks] == kinds


def test_a_partial_line_shows_at_once_unless_it_may_become_a_prefix():
    c = Conversation()
    c.feed("user: hi\nassistant: Hel")
    assert c.view()[-1].lines == ["Hel"] and c.blocks[-1].kind == "user"
    c.feed("lo\nwor")
    assert c.view()[-1].lines == ["Hello", "wor"]
    c.feed("ld\nassis")
    assert c.view()[-1].lines == ["Hello", "world"]  # "assis" waits


def test_the_renderer_folds_colours_diffs_and_summarises_calls():
    c = Conversation()
    c.feed('-> file_edit({"path": "a.py"})\n--- a.py\n+++ a.py\n@@ -1,2 +1,2 @@\n-old\n+new\n same\n')
    frags = render.Renderer().render(c.blocks, expanded=True)
    styles = {t.strip(): s for s, t in frags}
    assert styles["-old"] == "class:diff.del" and styles["+new"] == "class:diff.add"
    assert render.plain(frags).startswith("-> file_edit: a.py\n")
    folded = render.plain(render.Renderer().render(c.blocks, expanded=False))
    assert "... 2 more lines" in folded
    steps = json.dumps({"steps": [{"code": "ls\nwc -l"}, {"code": "sort"}]})
    assert render.call_head(f"execute_code({steps})") == ("execute_code", "ls (+1 lines) | sort")


def test_env_file_edits_keep_other_lines(tmp_path):
    path = tmp_path / "env"
    keys.set_var("OLLIE_BACKEND", "ollama", path)
    keys.set_var("OLLIE_BACKEND", "lmstudio", path)
    assert path.read_text() == "OLLIE_BACKEND=lmstudio\n"
    assert keys.remove_var("OLLIE_BACKEND", path) and path.read_text() == ""


def test_retries_errors_and_a_long_tool_call_are_visible(server, tmux):
    slow = {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "sleep 3; echo slept"}]}}]}
    server.agent(
        "rough",
        turns=[{"error": {"type": "transient", "message": "overloaded", "retry_after": 1}}, slow, {"text": "done"}],
    )
    cwd = workdir(server, "rough")
    tmux.ollie("--agent", "rough", cwd=cwd)
    tmux.wait_for(" idle ")
    tmux.type("go")
    tmux.keys("Enter")
    tmux.wait_for("retrying in ")
    screen = tmux.wait_for("calling: execute_code 2s")  # the seconds count up
    assert "-> execute_code: sleep 3; echo slept" in screen
    screen = tmux.wait_for("\ndone")
    assert "    slept" in screen


def test_a_local_model_server_is_found_by_its_answer(tmp_path):
    import asyncio
    import http.server
    import threading

    from ollie.tui import firstrun

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/api/tags" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        assert asyncio.run(firstrun.probe(port, "/api/tags"))
        assert not asyncio.run(firstrun.probe(port, "/v1/models"))
        assert not asyncio.run(firstrun.probe(free_port(), "/api/tags"))
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_no_color_keeps_bold_and_reverse_but_drops_colours(server, tmp_path):
    import re

    server.agent("mono", rules=[{"match": ".", "text": "**bold** answer"}])
    cwd = workdir(server, "mono")
    seen = {}
    for name, extra in (("colour", {}), ("mono", {"NO_COLOR": "1"})):
        t = Tmux(tmp_path / name, {**server.env, **extra})
        (tmp_path / name).mkdir()
        try:
            t.ollie("--agent", "mono", cwd=cwd)
            t.wait_for(" idle ")
            t.type("hi")
            t.keys("Enter")
            t.wait_for("bold answer")
            seen[name] = set(re.findall(r"\x1b\[([0-9;]*)m", t.tmux("capture-pane", "-p", "-e", "-t", "t")))
        finally:
            t.close()
    colours = {s for s in seen["colour"] if re.fullmatch(r"3[0-7]|38;.*", s)}
    assert colours and not {s for s in seen["mono"] if re.fullmatch(r"3[0-7]|38;.*", s)}
    assert {"1", "7"} <= seen["mono"]
