"""The serving process: `ollie srv start|status|stop`, and sessions surviving a kill -9."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fs_helpers import OLLIE, FsServer
from ollie.tui.client import start_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server(tmp_path):
    srv = FsServer(tmp_path)
    srv.agent("default", [{"match": "slow", "text": "slow answer", "delay": 0.5}, {"match": ".", "text": "answer"}])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_start_status_stop(server):
    socket = server.root / "ns" / "ollie"
    assert stat.S_ISSOCK(os.stat(socket).st_mode) and stat.S_IMODE(os.stat(socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(server.root / "ns").st_mode) == 0o700
    status = server.ollie("srv", "status")
    assert f"running (pid {server.pid()})" in status.stdout and str(server.mnt) in status.stdout
    again = server.ollie("srv", "start", check=False)
    assert again.returncode == 1 and "already running" in again.stderr
    sid = server.new_session()
    (server.mnt / "s" / sid / "prompt").write_text("slow")  # a turn still running when stopped
    assert server.ollie("srv", "stop").stdout == "ollie srv: stopped\n"
    assert not os.path.ismount(server.mnt)
    assert not socket.exists() and not (server.root / "ns" / "ollie.pid").exists()
    assert server.ollie("srv", "status", check=False).returncode == 1
    meta = json.loads((server.data / "sessions" / sid / "meta.json").read_text())
    assert meta["id"] == sid


def test_a_shell_whose_directory_is_in_the_mount_does_not_hold_up_a_stop(server):
    """`cd` into the mount in one terminal, `ollie srv stop` in another: the server ends at once
    (it waited 10 s, then died of the wait, leaving its pid file), and the shell, once it uses the
    detached mount, is told the server is gone."""
    sid = server.new_session()
    inside = subprocess.Popen(
        ["bash", "-c", "read _; ls . 2>&1; pwd"],
        cwd=server.mnt / "s" / sid,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started_there = subprocess.Popen(  # and a start from there, after the stop: told why not, in words
        ["bash", "-c", f"read _; exec {shlex.join([sys.executable, '-P', *OLLIE[1:]])} srv start"],  # as `ollie` runs
        cwd=server.mnt / "s" / sid,
        env=server.env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = time.monotonic()
        assert server.ollie("srv", "stop").stdout == "ollie srv: stopped\n"
        assert time.monotonic() - started < 5
        assert not (server.root / "ns" / "ollie.pid").exists() and not os.path.ismount(server.mnt)
        assert "ollie srv: \n" not in (server.root / "ns" / "ollie.log").read_text()
        out, _ = inside.communicate("\n", timeout=10)
        assert "Transport endpoint is not connected" in out
        started_there.stdin.write("\n")  # type: ignore[union-attr]
        started_there.stdin.close()  # type: ignore[union-attr]
        started_there.wait(timeout=60)
        assert started_there.returncode == 1
    finally:
        inside.kill()
        inside.wait()
        started_there.kill()
    assert "this shell's directory is gone (Transport endpoint is not connected)" in started_there.stderr.read()  # type: ignore[union-attr]
    server.start()  # the mount point serves again
    assert (server.mnt / "s" / sid / "state").read_text() == "idle\n"


def test_sessions_survive_kill_9(server):
    a = server.new_session()
    b = server.new_session()
    (server.mnt / "s" / a / "prompt").write_text("hello")
    server.wait_idle(a)
    server.sh(f"printf '# plan\\n- [ ] one\\n' > s/{a}/plan; echo temperature=0.25 > s/{a}/cfg; mv s/{b} s/named")
    chat = (server.mnt / "s" / a / "chat").read_text()
    server.kill9()
    assert not os.path.ismount(server.mnt)
    server.start()
    s = server.mnt / "s"
    assert os.listdir(s) == [a]  # and the named one, by its name (not listed: test_fs_examples)
    assert [line.split("\t")[0] for line in (s / "idx").read_text().splitlines()] == [a, "named"]
    assert (s / a / "chat").read_text() == chat  # read from disk: no Core built for it
    assert (s / a / "state").read_text() == "idle\n"
    assert os.stat(s / a / "reply").st_size == len("answer")  # scripts poll its size
    assert (s / a / "reply").read_text() == "answer" and (s / a / "prompt.prev").read_text() == "hello"
    assert (s / a / "plan").read_text() == "# plan\n- [ ] one\n"
    assert "temperature=0.25\n" in (s / a / "cfg").read_text()
    (s / a / "prompt").write_text("again")
    server.wait_idle(a)
    roles = [json.loads(line)["role"] for line in (s / a / "context").read_text().splitlines()]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert (s / a / "chat").read_text() == chat + "user: again\nassistant: answer\n\n"
    assert "cwd=" + str(server.work) in (s / "named" / "cfg").read_text()


def test_the_server_imports_nothing_from_the_directory_it_starts_in(tmp_path, monkeypatch):
    """`ollie srv start`, and the terminal UI that starts it, run in a project whose files
    sandboxed code writes: a module planted there (an `argparse.py`, which the server imports as it
    starts) ran as the server, with every session's keys, when the server was `python -c` there."""
    srv = FsServer(tmp_path)
    planted = tmp_path / "planted-module-ran"
    (srv.work / "argparse.py").write_text(f"open({str(planted)!r}, 'w').close()\nraise SystemExit(9)\n")
    start = [sys.executable, "-P", *OLLIE[1:], "srv", "start", "--no-mount"]  # as `ollie` is: no cwd on its path
    try:
        out = subprocess.run(start, cwd=srv.work, env=srv.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and not planted.exists(), out.stderr + srv.log()
        assert Path(f"/proc/{srv.pid()}/cwd").resolve() == srv.work  # its sessions' default cwd, as before
        srv.ollie("srv", "stop")
        monkeypatch.chdir(srv.work)
        for key, value in srv.env.items():
            monkeypatch.setenv(key, value)
        start_server(str(tmp_path / "ns" / "ollie"))  # the terminal UI's way
        monkeypatch.chdir(tmp_path)  # (the test's own `python -c` would import the plant)
        assert not planted.exists() and srv.ollie("srv", "status", check=False).returncode == 0, srv.log()
    finally:
        srv.stop()


def test_the_tcp_token_comes_from_a_file_never_the_command_line(tmp_path):
    srv = FsServer(tmp_path)
    try:  # stopped even when a start that should have failed did not
        out = srv.ollie("srv", "start", "--no-mount", "--tcp", "127.0.0.1:0", "--token", "s3cret", check=False)
        assert out.returncode != 0 and "--token-file PATH" in out.stderr and "$OLLIE_9P_TOKEN" in out.stderr
        assert srv.ollie("srv", "status", check=False).returncode == 1
        (tmp_path / "token").write_text("s3cret\n")
        srv.ollie("srv", "start", "--no-mount", "--tcp", "127.0.0.1:0", "--token-file", str(tmp_path / "token"))
        assert (tmp_path / "ns" / "ollie.token").read_text() == "s3cret\n"
        assert b"s3cret" not in Path(f"/proc/{srv.pid()}/cmdline").read_bytes()
    finally:
        srv.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
@pytest.mark.parametrize("theirs", ["ns", "tmp"])
def test_directories_of_another_user_are_refused(tmp_path, theirs):
    """Under a shared /tmp, whoever makes a name first owns it and what goes into it."""
    srv = FsServer(tmp_path)
    (tmp_path / theirs).mkdir(exist_ok=True)
    os.chown(tmp_path / theirs, 65534, 65534)
    try:
        out = srv.ollie("srv", "start", check=False)
        assert out.returncode == 1 and f"{tmp_path / theirs} belongs to uid 65534, not to you" in out.stderr
        assert not os.path.ismount(srv.mnt)
    finally:
        srv.stop()


def test_a_namespace_that_is_a_file_is_said_so(tmp_path):
    srv = FsServer(tmp_path)
    (tmp_path / "ns").rmdir()
    (tmp_path / "ns").write_text("")  # NAMESPACE=that file: it said only "File exists"
    out = srv.ollie("srv", "start", "--no-mount", check=False)
    assert out.returncode == 1 and f"{tmp_path / 'ns'} must be a directory, not a link or a file" in out.stderr


def test_namespace_and_scratch_directories_are_private(server):
    for d in (server.root / "ns", server.root / "tmp", server.root / "tmp" / "scratch"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_a_server_that_does_not_stop_in_time_is_killed_with_what_it_started(tmp_path, monkeypatch):
    """A server stuck past the stop's timeout was killed alone: the `git` of a snapshot it had
    started went on, orphaned, for as long as the snapshot took."""
    from ollie.cli import build_parser, srv

    ns = tmp_path / "ns"
    ns.mkdir(mode=0o700)
    monkeypatch.setenv("NAMESPACE", str(ns))
    stuck = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(subprocess.Popen(['sleep', '300']).pid, flush=True); time.sleep(300)"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", stuck], start_new_session=True, stdout=subprocess.PIPE, text=True
    )  # as `ollie srv start` starts it: the leader of a process group
    try:
        child = int(server.stdout.readline())
        (ns / "ollie.pid").write_text(f"{server.pid}\n")
        monkeypatch.setattr(srv, "STOP_TIMEOUT", 0.5)
        assert srv._stop(build_parser().parse_args(["srv", "stop"])) == 1
        assert server.wait(5) == -9
        assert _gone(child)
    finally:
        server.kill()
        server.wait()


def _gone(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X"):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False
