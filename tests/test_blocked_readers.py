"""Many readers blocked in `statewait` hold up nobody (issue 15): on the mount and over 9P, where
each blocked read is a task of the server's loop (no thread of its own). No timed assertions: the
other reads must complete and be right, the waiters must all get a state word once it changes;
hangs are bounded by generous timeouts."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ollie.vfs import ninep as P
from ollie.vfs.fuse import Mount
from ollie.vfs.namespace import File, Handle, Namespace, OpenMode, StaticDir
from ollie.vfs.ninep_client import Client
from ollie.vfs.stores import TextFile
from task_helpers import tasks_made, word_and_slow

READERS = 600  # past the old cap of 256 FUSE threads, which stalled the mount at about 250
STATES = {"idle", "thinking"}

# One process, READERS threads, each reading statewait once; prints what each read got, one a line.
WAITERS = """
import sys, threading
path, n = sys.argv[1], int(sys.argv[2])
out = [None] * n
def read(i):
    with open(path) as f:
        out[i] = f.read().strip()
threads = [threading.Thread(target=read, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("\\n".join(out))
"""


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _blocked_on_fuse(pid: int) -> int:
    """How many of `pid`'s threads wait for an answer of a FUSE server."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            n += Path(f"/proc/{pid}/task/{tid}/wchan").read_text() == "request_wait_answer"
        except OSError:
            pass
    return n


def test_600_blocked_statewait_readers_on_the_mount_hold_up_no_other_read(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    server = fs_server.pid()
    before = _threads(server)
    waiters = subprocess.Popen(
        [sys.executable, "-c", WAITERS, str(s / "statewait"), str(READERS)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while _blocked_on_fuse(waiters.pid) < READERS:
            assert time.monotonic() < deadline, f"only {_blocked_on_fuse(waiters.pid)} readers got to wait"
            assert waiters.poll() is None, "the readers ended before they all blocked"
            time.sleep(0.05)
        assert _threads(server) < before + 10, "the server holds a thread per blocked reader"
        # with every reader blocked, other reads and a write are still served, and right
        out = subprocess.run(["cat", str(s / "state")], capture_output=True, text=True, timeout=30)
        assert out.stdout == "idle\n"
        assert sid in os.listdir(fs_server.mnt / "s")
        (s / "prompt").write_text("hello")  # the state changes: every reader gets a word
        got, _ = waiters.communicate(timeout=60)
    finally:
        waiters.kill()
        waiters.wait()
    words = got.splitlines()
    assert len(words) == READERS and set(words) <= STATES, set(words)
    fs_server.wait_idle(sid, timeout=30)
    assert (s / "reply").read_text() == "ok"


def test_a_killed_reader_among_many_blocked_ones_ends_and_the_others_carry_on(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    waiters = subprocess.Popen(
        [sys.executable, "-c", WAITERS, str(s / "statewait"), str(READERS)], stdout=subprocess.PIPE, text=True
    )
    victim = subprocess.Popen(["cat", str(s / "statewait")], stdout=subprocess.PIPE)
    try:
        victim.kill()  # its read is interrupted (EINTR on the mount's side); it ends either way
        assert victim.wait(timeout=30) == -9
        assert (s / "state").read_text() == "idle\n"
        (s / "prompt").write_text("hello")
        got, _ = waiters.communicate(timeout=60)
    finally:
        waiters.kill()
        waiters.wait()
    words = got.splitlines()
    assert len(words) == READERS and set(words) <= STATES


def test_600_blocked_statewait_readers_over_9p_hold_up_no_other_read(fs_server):
    sid = fs_server.new_session()
    addr = f"unix!{fs_server.root / 'ns' / 'ollie'}"

    async def scenario() -> list[bytes]:
        waiting = await Client.connect(addr)
        other = await Client.connect(addr)
        try:
            readers = [asyncio.create_task(waiting.read_path(f"s/{sid}/statewait")) for _ in range(READERS)]
            await asyncio.sleep(0)
            assert await asyncio.wait_for(other.read_path(f"s/{sid}/state"), 30) == b"idle\n"
            fid = await other.walk(f"s/{sid}/prompt")
            await other.open(fid, P.OWRITE | P.OTRUNC)
            await other.write(fid, 0, b"hello")
            await other.clunk(fid)  # submitted at the close
            return await asyncio.wait_for(asyncio.gather(*readers), 60)
        finally:
            await waiting.close()
            await other.close()

    words = asyncio.run(scenario())
    assert len(words) == READERS and {w.decode().strip() for w in words} <= STATES
    fs_server.wait_idle(sid, timeout=30)
    assert Path(fs_server.mnt / "s" / sid / "reply").read_text() == "ok"


# ---- the mount's serving, in this process ------------------------------------------------------
class _Gate(File):
    """A file whose reads block until the gate opens; it remembers the reads that were cancelled."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waiting = 0
        self.cancelled = 0

    async def open(self, mode: OpenMode) -> Handle:
        gate = self

        class Reading(Handle):
            async def read(self, offset: int, count: int) -> bytes:
                if offset:
                    return b""
                gate.waiting += 1
                try:
                    await gate.opened.wait()
                except asyncio.CancelledError:
                    gate.cancelled += 1
                    raise
                finally:
                    gate.waiting -= 1
                return b"open\n"

        return Reading()


async def _until(cond, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def _mounted(tmp_path: Path, gate: _Gate) -> Mount:
    ns = Namespace(StaticDir({"gate": gate, "word": TextFile(lambda: "word\n")}))
    m = Mount(ns, str(tmp_path / "mnt"))
    await m.start()
    return m


async def test_blocked_reads_are_tasks_and_a_killed_reader_cancels_its_own(tmp_path):
    gate = _Gate()
    m = await _mounted(tmp_path, gate)
    try:
        before = _threads(os.getpid())
        readers = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WAITERS, m.path + "/gate", str(READERS), stdout=asyncio.subprocess.PIPE
        )
        await _until(lambda: gate.waiting == READERS, f"only {gate.waiting} reads got to wait")
        assert _threads(os.getpid()) < before + 10, "a thread per blocked read"
        # meanwhile others are served: another process's read and a listing
        out = await asyncio.create_subprocess_exec("cat", m.path + "/word", stdout=asyncio.subprocess.PIPE)
        assert (await asyncio.wait_for(out.communicate(), 30))[0] == b"word\n"
        ls = await asyncio.create_subprocess_exec("ls", m.path, stdout=asyncio.subprocess.PIPE)
        assert (await asyncio.wait_for(ls.communicate(), 30))[0].split() == [b"gate", b"word"]
        # a killed reader's read is interrupted: its coroutine is cancelled, the others wait on
        victim = await asyncio.create_subprocess_exec("cat", m.path + "/gate", stdout=asyncio.subprocess.PIPE)
        await _until(lambda: gate.waiting == READERS + 1, "the victim's read never came")
        victim.kill()
        assert await asyncio.wait_for(victim.wait(), 30) == -9
        await _until(lambda: gate.cancelled == 1, "the killed reader's read was not cancelled")
        assert gate.waiting == READERS
        gate.opened.set()
        got, _ = await asyncio.wait_for(readers.communicate(), 60)
        assert got.decode().splitlines() == ["open"] * READERS
    finally:
        await m.unmount()


async def test_the_servers_own_thread_touching_the_mount_fails_rather_than_hangs(tmp_path):
    m = await _mounted(tmp_path, _Gate())
    try:
        with pytest.raises(OSError) as e:
            os.stat(m.path + "/word")  # on the loop's thread, which alone could answer it
        assert e.value.errno == errno.EDEADLK
        assert await asyncio.to_thread(Path(m.path, "word").read_text) == "word\n"  # from another thread: served
    finally:
        await m.unmount()


async def test_a_text_at_hand_is_opened_and_read_without_a_task_and_an_awaited_one_by_a_task(tmp_path):
    """`cat` of a file whose text is at hand (a session's `state`, `reply`, `chat`) is answered as
    its requests come, without a task: under load a task waits its turn behind all the loop has to
    do, at each of the open and the reads. A text that must be awaited is read by a task, its
    getter called once."""
    calls: list[int] = []
    m = Mount(word_and_slow(calls), str(tmp_path / "mnt"))
    await m.start()
    try:
        with tasks_made(asyncio.get_running_loop()) as served:
            out = await asyncio.create_subprocess_exec("cat", m.path + "/word", stdout=asyncio.subprocess.PIPE)
            assert (await asyncio.wait_for(out.communicate(), 30))[0] == b"word\n"
            assert "Connection._run" not in served
            out = await asyncio.create_subprocess_exec("cat", m.path + "/slow", stdout=asyncio.subprocess.PIPE)
            assert (await asyncio.wait_for(out.communicate(), 30))[0] == b"slow\n"
            assert "Connection._run" in served and calls == [1]
    finally:
        await m.unmount()
