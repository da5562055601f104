"""Through the real mount: every writable file refuses more than its cap (EFBIG, "File too large")
and uses nothing of a refused write; a session's cwd must be absolute."""

from __future__ import annotations

import errno
import os

import pytest

pytestmark = pytest.mark.timeout(120)

KIB, MIB = 1 << 10, 1 << 20


def refused(fs_server, script: str) -> str:
    out = fs_server.sh(script, check=False)
    assert out.returncode != 0, script
    return out.stderr


def write_error(path, data: bytes, flags: int = 0) -> int | None:
    """Write all of `data` to `path` (a short write is continued); the errno that stopped it."""
    fd = os.open(path, os.O_WRONLY | flags)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as e:
        return e.errno
    finally:
        try:
            os.close(fd)
        except OSError as e:  # acting on the rest at close
            return e.errno
    return None


def test_a_50_mb_ctl_line_is_refused_at_once(fs_server):
    """Buffered without a cap (and re-split at each write) such a line took minutes."""
    sid = fs_server.new_session()
    out = refused(fs_server, f"head -c {50 * MIB} /dev/zero | tr '\\0' x > s/{sid}/ctl")
    assert "File too large" in out
    fs_server.sh(f"echo 'cwd /tmp' > s/{sid}/ctl")  # the session is fine
    assert "cwd=/tmp\n" in (fs_server.mnt / "s" / sid / "cfg").read_text()


def test_control_lines_are_capped_at_64_kib(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    before = os.listdir(fs_server.mnt / "s")
    long = b"x" * (64 * KIB)
    for path, line in (
        (fs_server.mnt / "ctl", b"new name=" + long),
        (fs_server.mnt / "s" / "new", b"name=" + long),
        (s / "ctl", b"queue " + long),
        (s / "cfg", b"top_p=" + long),
        (s / "env", b"BIG=" + long),
    ):
        assert write_error(path, line + b"\n") == errno.EFBIG, path
    assert os.listdir(fs_server.mnt / "s") == before
    assert (s / "fifo.out").read_text() == ""  # nothing was queued
    assert "BIG" not in (s / "env").read_text()
    assert write_error(s / "env", b"BIG=" + long[len(b"BIG=") :] + b"\n") is None  # at the cap: taken
    assert "BIG=xxx" in (s / "env").read_text()


def test_prompts_plans_and_configs_are_capped_at_1_mib(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "plan").write_text("# the plan\n")
    for path in (s / "prompt", s / "fifo.in", s / "plan"):
        assert write_error(path, b"x" * (MIB + 1)) == errno.EFBIG, path
    assert write_error(fs_server.mnt / "a" / "big.json", b" " * (MIB + 1), os.O_CREAT) == errno.EFBIG
    assert (s / "chat").read_text() == "" and (s / "state").read_text() == "idle\n"  # nothing submitted
    assert (s / "plan").read_text() == "# the plan\n"
    assert "big.json" not in os.listdir(fs_server.mnt / "a")
    assert write_error(s / "plan", b"x" * MIB) is None  # at the cap: taken
    assert (fs_server.data / "sessions" / sid / "plan").stat().st_size == MIB


def test_a_relative_cwd_is_refused(fs_server):
    sid = fs_server.new_session()
    before = os.listdir(fs_server.mnt / "s")
    for script in (
        "echo 'new cwd=.' > ctl",
        "printf 'cwd=.\\n' > s/new",
        f"echo 'cwd=.' > s/{sid}/cfg",
        f"echo 'cwd work' > s/{sid}/ctl",
    ):
        refused(fs_server, script)
    assert os.listdir(fs_server.mnt / "s") == before
    s = fs_server.mnt / "s" / sid
    assert f"cwd={fs_server.work}\n" in (s / "cfg").read_text()
    assert "error: cwd '.' is relative: give an absolute path" in (s / "chat").read_text()
    fs_server.sh(f"echo 'cwd=~' > s/{sid}/cfg")  # ~ is absolute (the server's home)
    assert f"cwd={fs_server.home}\n" in (s / "cfg").read_text()
