"""Many readers blocked in `statewait` hold up nobody (issue 15): on the mount, where each blocked
read holds one of libfuse's threads, and over 9P, where each is a task. No timed assertions: the
other reads must complete and be right, the waiters must all get a state word once it changes;
hangs are bounded by generous timeouts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from ollie.fs import ninep as P
from ollie.fs.ninep_client import Client

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
        while _threads(server) < before + READERS:  # a FUSE thread per blocked read
            assert time.monotonic() < deadline, f"only {_threads(server) - before} FUSE threads serve the readers"
            assert waiters.poll() is None, "the readers ended before they all blocked"
            time.sleep(0.05)
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
