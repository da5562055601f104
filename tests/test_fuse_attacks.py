"""Attacks on the FUSE layer (fuse.py, fuse_kernel.py) from a session's sandboxed code, through its
view ($OLLIE): each test asserts what the threat model promises, and fails while the hole is open."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import stat
import threading
import time

from ollie import config
from ollie.vfs.fuse import VIEW_OPEN_MAX

RACE = r"""
import os, sys, time
mem, view = os.environ["OLLIE_MEMORY_DIR"], os.environ["OLLIE"] + "/m"
os.mkfifo(f"{mem}/.fifo")
open(f"{mem}/x", "w").write("x")
pid = os.fork()
if pid == 0:  # swap x between a file and a FIFO, atomically, as fast as it goes
    while True:
        os.rename(f"{mem}/x", f"{mem}/.reg"); os.rename(f"{mem}/.fifo", f"{mem}/x")
        os.rename(f"{mem}/x", f"{mem}/.fifo"); os.rename(f"{mem}/.reg", f"{mem}/x")
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    try:
        os.close(os.open(f"{view}/x", os.O_RDONLY | os.O_NONBLOCK)); n += 1
    except OSError:
        pass
print("opens", n)
"""


def _watch(loop: asyncio.AbstractEventLoop, mem: str, stop: threading.Event, blocked: list[float]) -> None:
    """Finds the loop blocked (no callback run in 2 s), records it, and unblocks it: opens every FIFO
    of the memory directory for writing, which ends the server's open of it for reading."""
    while not stop.is_set():
        ran = threading.Event()
        t0 = time.monotonic()
        loop.call_soon_threadsafe(ran.set)
        if ran.wait(2):
            time.sleep(0.1)
            continue
        blocked.append(time.monotonic() - t0)
        while not ran.is_set():
            for name in os.listdir(mem):
                path = os.path.join(mem, name)
                try:
                    if stat.S_ISFIFO(os.lstat(path).st_mode):
                        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            ran.wait(0.2)


async def test_a_fifo_swapped_into_the_memory_blocks_no_server(h):
    """m/ is a directory the sandbox writes directly ($OLLIE_MEMORY_DIR). The server checks that a
    name there is a regular file (lookup's stat), then opens it (os.open, blocking, on the event
    loop): code that swaps the name between a file and a FIFO wins that race within a second, and
    the server's open of a FIFO with no writer never returns. The loop of every session, the user's
    mount and 9P is blocked for good. The open must not block (O_NONBLOCK, then fstat S_ISREG)."""
    mem = str(config.data_path() / "memory")
    os.makedirs(mem, exist_ok=True)
    s = await h.new()
    await h.ok(s, "true")  # the jail is up
    stop, blocked = threading.Event(), []
    watch = threading.Thread(target=_watch, args=(asyncio.get_running_loop(), mem, stop, blocked), daemon=True)
    watch.start()
    try:
        await h.sh(s, f"python3 - 3 <<'EOF'\n{RACE}\nEOF")
    finally:
        stop.set()
        watch.join()
    assert not blocked, f"the server's loop was blocked {len(blocked)} times (at least {blocked} s)"


INTERRUPTED_RMDIR = r"""
import os, signal, sys
n = [0]
def tick(*a):
    n[0] += 1
    if n[0] > 30:
        signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGALRM, tick)
path = os.environ["OLLIE"] + "/s/" + sys.argv[1]
signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]), 0.0003)  # then a signal every 0.3 ms
try:
    os.rmdir(path)
    print("removed")
except OSError as e:
    print("rmdir:", e)
signal.setitimer(signal.ITIMER_REAL, 0)
"""


async def test_an_interrupted_kill_leaves_no_session_running_unseen(h):
    """FUSE_INTERRUPT cancels the task serving the request (new with the rewrite: libfuse ran every
    operation to its end). `rm -r $OLLIE/s/<sub>` is Sessions.kill: it takes the session out of
    the registry, then awaits its close (its turn, its tool servers and jail, its tmpdir). Code
    that signals itself during the rmdir cancels the close half-way: the sub-session is gone from
    s/ (nobody can kill it any more) while its core, jail and tmpdir live on, and what it spent is
    never counted in its parent's cost. A kill must run to its end once begun (shielded), or the
    session must stay registered. Intermittent: the cancel must land inside the close (seen in 1
    of 3 runs of this test; another run left the rmdir unanswered, its caller stuck until killed)."""
    script = h.cfg / "slow.script.json"
    script.write_text('{"rules": [{"match": ".", "text": "slow done", "delay": 3}]}')
    agent = {"backend": "scripted", "model": str(script), "prompt": "You are slow.", "subagents": ["slow"]}
    (h.cfg / "agents" / "slow.json").write_text(json.dumps(agent))
    parent = await h.new(agent="slow")
    await h.ok(parent, "true")
    leaked = []
    for delay in (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016):
        before = {s.id for s in h.sessions.all()}
        await h.ok(parent, "echo new > $OLLIE/ctl")
        (child,) = [s for s in h.sessions.all() if s.id not in before]
        await h.ok(child, "true")  # it has a jail
        await child.submit("work")  # and a turn under way
        tmpdir = child.core.tmpdir
        await h.sh(parent, f"timeout -s KILL 5 python3 - {child.id} {delay} <<'EOF'\n{INTERRUPTED_RMDIR}\nEOF")
        await asyncio.sleep(0.3)
        jail = [t.name for t in threading.enumerate() if t.name == f"ollie-view-{child.id}"]
        if h.sessions.find(child.id) is None and (tmpdir.exists() or jail):
            leaked.append((delay, "tmpdir" if tmpdir.exists() else "", *jail))
    assert not leaked, f"killed half-way (out of s/, still open: tmpdir, turn running?): {leaked}"


async def test_a_name_that_is_not_utf8_in_the_memory_breaks_no_listing(h):
    """Any session's code writes $OLLIE_MEMORY_DIR directly. A file named with a byte that is not
    UTF-8 made `ls $OLLIE/m` fail (EIO) in every session's view and on the user's mount, and each
    try logged a traceback at ERROR: qid_of encodes the path strictly (UnicodeEncodeError), and
    fuse.py answers that as a bug (EIO, log.exception)."""
    s = await h.new()
    out = await h.ok(
        s,
        r"""cd "$OLLIE_MEMORY_DIR" && touch "$(printf 'x\377')" && echo hi > ok
        ls $OLLIE/m > /dev/null && echo listed; cat $OLLIE/m/"$(printf 'x\377')" && echo read""",
    )
    assert "listed" in out and "read" in out, out


OPEN_MANY = r"""
import errno, os, sys
held, failed = [], None
for _ in range(int(sys.argv[1])):
    try:
        held.append(os.open(os.environ["OLLIE"] + "/m", os.O_RDONLY))
    except OSError as e:
        failed = errno.errorcode[e.errno]
        break
print("opened", len(held), "then", failed)
"""


async def test_a_view_holds_at_most_view_open_max_open_files(h):
    """Every open file of a view may hold what it read or was written until it is closed (a
    snapshot, a prompt of up to 1 MiB), and sandboxed code may raise its descriptor limit and
    fork: the server's memory was bounded only by the descriptors of the jail's processes."""
    s = await h.new()
    code = f"ulimit -n {VIEW_OPEN_MAX + 100} && python3 -c {shlex.quote(OPEN_MANY)} {VIEW_OPEN_MAX + 50}"
    out = await h.ok(s, code)
    assert f"opened {VIEW_OPEN_MAX} then EMFILE" in out, out
    assert "ok" in await h.ok(s, "ls $OLLIE/m > /dev/null && echo ok")  # closed with its processes
