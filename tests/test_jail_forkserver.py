"""Jails forked from one server: what one jail's start leaves in the server (nothing of a session),
what a jail keeps of the server (nothing but its own socket), starts off the event loop and bounded,
and idle jails closed and started again. Every other sandbox test runs its jails through the same
fork server: the attack suites (test_sandbox*.py, test_view_attacks.py) are its confinement tests."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ollie import sandbox
from ollie.sandbox import jail as jail_mod
from ollie.sandbox.jail import Jail, JailSetup
from ollie.tools import CallContext, ToolResult, execute
from sandbox_helpers import write_policy
from test_execute import alive

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

MARKER = "ollie-secret-marker-7f3a9c"


def _setup(hide: tuple[str, ...] = ()) -> JailSetup:
    return JailSetup(network=False, processes=512, tmp_size=1 << 24, hide=hide)


def _session_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[3])


def _jail_processes(server: int) -> set[int]:
    """The processes forked from the fork server (its session: jails never leave it; stages do)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != server:
            try:
                if _session_of(int(name)) == server:
                    found.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _memory_holds(pid: int, needle: bytes) -> bool | None:
    """Whether the writable memory of `pid` (heap, anonymous and data mappings) holds `needle`;
    None if the process is gone (a jail's first process exits once its PID 1 runs)."""
    try:
        return _scan(pid, needle)
    except (ProcessLookupError, FileNotFoundError):
        return None


def _scan(pid: int, needle: bytes) -> bool:
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "w" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


async def test_the_fork_server_keeps_nothing_of_a_jail_and_a_jail_nothing_of_another(tmp_path):
    """A jail's setup (what it hides: paths of the user's) goes to that jail alone: the server never
    reads it, so neither it nor a jail forked after holds it in memory, and the server keeps no
    descriptor of any jail."""
    secret_dir = tmp_path / MARKER
    secret_dir.mkdir()
    first = await Jail.start(_setup((str(secret_dir),)))
    server = jail_mod._FORK_SERVER.pid
    assert server is not None
    first_procs = _jail_processes(server)
    assert first_procs, "the jail's PID 1 runs in the fork server's session"
    assert any(_memory_holds(p, MARKER.encode()) for p in first_procs), "the scan finds what a jail holds"
    second = await Jail.start(_setup())
    second_procs = _jail_processes(server) - first_procs
    assert second_procs
    await first.close()
    scanned = {pid: _memory_holds(pid, MARKER.encode()) for pid in [server, *second_procs]}
    assert scanned[server] is False
    assert [pid for pid in second_procs if scanned[pid] is False], "the second jail's PID 1 was scanned"
    assert not [pid for pid, held in scanned.items() if held], "a process holds another jail's setup"
    # The server holds its socket to ollie, the standard three and what it passes every jail (the
    # native init, the interpreter, jaild.py), nothing of a jail; no jail process holds its socket.
    server_fds = {fd: os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")}
    passed = {"/memfd:ollie-jail-init (deleted)", os.path.realpath(sys.executable), "/memfd:jaild.py (deleted)"}
    others = {link for fd, link in server_fds.items() if int(fd) > 2 and not link.startswith("socket:")}
    assert others == passed
    sockets = [link for link in server_fds.values() if link.startswith("socket:")]
    assert len(sockets) == 1
    server_socket = sockets[0]
    for pid in second_procs:
        links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert server_socket not in links
    await second.close()


async def test_a_stage_sees_no_descriptor_and_no_process_of_another_jail(run, tmp_path):
    other = execute.factory(str(tmp_path / "cwd"))()
    ctx = CallContext(cwd=str(tmp_path / "cwd"), session_id="other", tmpdir="")
    try:
        assert not (
            await other.call_tool("execute_code", {"steps": [{"code": "echo theirs > /tmp/mine"}]}, ctx)
        ).is_error
        result = await run("echo fds: $(ls /proc/self/fd | tr '\\n' ' '); cat /tmp/mine")
        assert "theirs" not in result.text() and "No such file" in result.text()
        assert "fds: 0 1 2 3\n" in result.text()  # 3: the directory ls reads
    finally:
        await other.close()


async def test_a_stage_started_from_the_fork_server_is_confined(run, home):
    """The confinement as the attack suites test it, in brief: no secret, no network, no host /tmp."""
    result = await run(f"cat {home}/.ssh/id_rsa; exec 3<>/dev/tcp/1.1.1.1/80 && echo connected")
    assert result.is_error and "s3cr3t" not in result.text() and "connected" not in result.text()


async def test_stages_run_as_batch_work_and_leave_the_server_as_it_was(run):
    """Sandboxed programs are scheduled as batch work (SCHED_BATCH) at a lower priority (nice
    JAIL_NICE, their autogroup's too where the kernel has autogroups): a burst of them, hundreds of
    sessions' stages at once, neither preempts the server's loop at each wakeup nor keeps it from a
    CPU when it has work. They cannot take the priority back, nor change the jails' autogroup (which
    every session's jail shares). The server is left as it was."""
    from ollie.sandbox.jaild import JAIL_NICE

    result = await run(
        "cut -d' ' -f41 /proc/self/stat; cut -d' ' -f41 /proc/1/stat; cut -d' ' -f19 /proc/self/stat; "
        "renice -n 0 -p $$ 2>&1 | grep -q denied && echo refused; cat /proc/self/autogroup 2>/dev/null; "
        "(echo 19 > /proc/self/autogroup) 2>/dev/null && echo lowered || echo kept"  # one session slowing all
    )
    assert not result.is_error, result.text()
    lines = result.text().splitlines()
    assert lines[:2] == [str(os.SCHED_BATCH)] * 2  # the stage and its jail's PID 1
    assert lines[2:4] == [str(JAIL_NICE), "refused"]
    if os.path.exists("/proc/self/autogroup"):  # the kernel schedules by autogroup: the jails' is below ours
        assert lines[4].endswith(f"nice {JAIL_NICE}")
    assert lines[-1] == "kept"  # the jails' autogroup, every session's, is not a stage's to lower
    assert os.sched_getscheduler(0) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, 0) == 0


async def test_a_stage_is_a_process_group_of_its_own_in_the_jails_session(run):
    """A stage leads a process group of its own (killed when it ends) but stays in the session of
    its jail and of the fork server: where the kernel schedules by autogroup (a share of the CPU
    per session), every jail together weighs as one program against ollie's loop, not one a stage."""
    result = await run("cut -d' ' -f1,5,6 /proc/$$/stat; cut -d' ' -f6 /proc/1/stat")
    assert not result.is_error, result.text()
    stage, jail_session = result.text().splitlines()
    pid, group, session = stage.split()
    assert group == pid and session != pid
    assert session == jail_session


async def test_jail_starts_never_fork_on_the_event_loop(monkeypatch, tmp_path):
    """The loop's thread forks nothing to start a jail: the fork server does (its own start, once,
    runs in a thread); many starts at once all succeed."""
    loop_thread = threading.get_ident()
    forked_on_loop: list[str] = []
    real_popen_init = subprocess.Popen.__init__
    real_fork = os.fork

    def popen_init(self, *args, **kwargs):
        if threading.get_ident() == loop_thread:
            forked_on_loop.append("Popen")
        real_popen_init(self, *args, **kwargs)

    def fork():
        if threading.get_ident() == loop_thread:
            forked_on_loop.append("fork")
        return real_fork()

    monkeypatch.setattr(subprocess.Popen, "__init__", popen_init)
    monkeypatch.setattr(os, "fork", fork)
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    jails = await asyncio.gather(*(Jail.start(_setup()) for _ in range(24)))
    between = ticks
    done.set()
    await ticking
    try:
        assert all(j.alive for j in jails)
        assert not forked_on_loop
        assert between > len(jails), "the loop ran other tasks while the jails started"
    finally:
        await asyncio.gather(*(j.close() for j in jails))


async def test_concurrent_starts_are_bounded(monkeypatch):
    monkeypatch.setattr(jail_mod, "_STARTS", 3)
    monkeypatch.setattr(jail_mod, "_start_slots", jail_mod.weakref.WeakKeyDictionary())
    running = most = 0
    real_start = Jail._start.__func__  # type: ignore[attr-defined]

    async def counted(cls, setup):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            return await real_start(cls, setup)
        finally:
            running -= 1

    monkeypatch.setattr(Jail, "_start", classmethod(counted))
    jails = await asyncio.gather(*(Jail.start(_setup()) for _ in range(12)))
    try:
        assert most == 3 and all(j.alive for j in jails)
    finally:
        await asyncio.gather(*(j.close() for j in jails))


async def test_calls_that_come_while_a_jail_starts_share_it(monkeypatch, tmp_path, home):
    starts = 0
    real_start = Jail.start.__func__  # type: ignore[attr-defined]

    async def counted(cls, setup):
        nonlocal starts
        starts += 1
        return await real_start(cls, setup)

    monkeypatch.setattr(Jail, "start", classmethod(counted))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir="")
    try:
        results = await asyncio.gather(
            *(server.call_tool("execute_code", {"steps": [{"code": "true"}]}, ctx) for _ in range(4))
        )
        assert not any(r.is_error for r in results) and starts == 1
    finally:
        await server.close()


async def test_a_dead_fork_server_is_started_again():
    first = await Jail.start(_setup())
    server = jail_mod._FORK_SERVER.pid
    assert server is not None
    os.kill(server, 9)
    await asyncio.sleep(0.1)
    second = await Jail.start(_setup())
    try:
        assert second.alive and first.alive  # a running jail does not depend on the server
        assert jail_mod._FORK_SERVER.pid not in (None, server)
    finally:
        await first.close()
        await second.close()


async def test_starts_that_find_the_fork_servers_queue_full_wait_for_room_and_ask_once_more(monkeypatch):
    """A start that finds the fork server's queue full waits until it takes a packet again (no
    retry every few ms meanwhile), and a start cancelled then leaves the others waiting."""
    server = jail_mod._ForkServer()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    server._sock, server._owner = ours, os.getpid()
    jails = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
    sent = 0
    real_send_fds = socket.send_fds

    def counted(*args: Any) -> int:
        nonlocal sent
        sent += 1
        return real_send_fds(*args)

    try:
        while True:  # the server's queue, full
            try:
                ours.send(b"filler")
            except BlockingIOError:
                break
        monkeypatch.setattr(jail_mod.socket, "send_fds", counted)
        cancelled, waiting = (asyncio.create_task(server.fork(pair[1])) for pair in jails)
        await asyncio.sleep(0.3)
        assert not waiting.done() and sent == 2  # one try each, then a wait
        cancelled.cancel()
        theirs.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while theirs.recv(64) == b"filler":  # the server takes its queue
                pass
        await asyncio.wait_for(waiting, 5)
        assert sent == 3 and cancelled.cancelled()
        packet, fds, _, _ = socket.recv_fds(theirs, 64, 1)
        assert packet == b"jail" and os.path.sameopenfile(fds[0], jails[1][1].fileno())
        for fd in fds:
            os.close(fd)
    finally:
        for sock in (ours, theirs, *(s for pair in jails for s in pair)):
            sock.close()


@pytest.fixture
def looked_at_every_call(monkeypatch):
    """Running sessions' paths looked at again at every call (`sandbox.RECHECK` 0), from the next."""
    monkeypatch.setattr(sandbox, "RECHECK", 0)
    monkeypatch.setattr(sandbox, "_next_look", 0.0)


def one_session(cwd: Path, **context: Any) -> tuple[Any, Callable[..., Awaitable[ToolResult]]]:
    """An execute server working in `cwd`, and a call of `execute_code` in it."""
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir="", **context)

    async def call(code: str, policy: str = "default", language: str = "bash") -> ToolResult:
        step = {"code": code, "language": language}
        return await server.call_tool("execute_code", {"steps": [step], "sandbox": policy}, ctx)

    return server, call


def session_writing(tmp_path: Path, granted: Path) -> tuple[Any, Callable[..., Awaitable[ToolResult]]]:
    """`one_session` in a cwd of its own, its policy letting code write `granted` (made here)."""
    cwd = tmp_path / "cwd"
    for d in (cwd, granted):
        d.mkdir()
    write_policy(None, f"filesystem:\n  rw: ['{granted}']\n")
    return one_session(cwd)


async def output(call: Callable[..., Awaitable[ToolResult]], code: str) -> str:
    result = await call(code)
    assert not result.is_error, result.text()
    return result.text()


async def test_an_idle_jail_is_closed_and_started_again_on_the_next_call(monkeypatch, tmp_path, home):
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "0.5")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    server, call = one_session(cwd)
    try:
        await output(call, "echo kept > /tmp/x")
        assert await output(call, "cat /tmp/x") == "kept\n"  # the same jail while in use
        await output(call, "sleep 1.2")  # a running stage keeps its jail, however long
        assert await output(call, "cat /tmp/x") == "kept\n"
        await asyncio.sleep(1.5)
        assert not server._jails._jails, "the idle jail was closed"
        assert (await output(call, "cat /tmp/x 2>&1 || echo gone")).endswith("gone\n")  # a new jail, a new /tmp
    finally:
        await server.close()


async def test_a_grant_made_again_while_the_jail_was_closed_is_decided_anew(monkeypatch, tmp_path, home):
    # The session's sandbox was decided with the tool directory as it was (a grant the jail
    # mounts from under ollie's hidden configuration); its jail, closed while idle, starts again
    # and finds it another directory: the call has its sandbox decided anew, instead of every
    # call failing for the session's life ("no longer the file ollie granted").
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "0.3")
    tools, cwd = Path(os.environ["OLLIE_TOOLS_PATH"]), tmp_path / "cwd"
    cwd.mkdir()
    (tools / "note").write_text("one\n")
    server, call = one_session(cwd)
    try:
        assert await output(call, f"cat {tools}/note") == "one\n"
        await asyncio.sleep(0.8)
        assert not server._jails._jails, "the idle jail was closed"
        tools.rename(tools.with_name("tools.old"))
        tools.mkdir()
        (tools / "note").write_text("two\n")
        assert await output(call, f"cat {tools}/note") == "two\n"
    finally:
        await server.close()


async def test_a_grant_put_behind_a_symlink_to_itself_is_refused_as_a_first_call_would(monkeypatch, tmp_path, home):
    # The same directory, now reached through a symlink (its identity unchanged, so the session's
    # sandbox and the shared decisions look fresh): the next jail refuses to mount it, and the
    # sandbox is decided anew, which refuses it with the reason a new session's first call would
    # give, at every call.
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "0.3")
    data = home / "data"
    server, call = session_writing(tmp_path, data)
    try:
        await output(call, f"echo one > {data}/f")
        await asyncio.sleep(0.8)
        assert not server._jails._jails, "the idle jail was closed"
        data.rename(home / "old")
        data.symlink_to(home / "old")
        for _ in range(2):
            result = await call("echo ran")
            assert result.is_error and f"grants {data} through the symlink" in result.text(), result.text()
    finally:
        await server.close()


@pytest.mark.parametrize("idle", ["600", "0"])  # 0: jails are never closed for idleness
async def test_a_working_directory_made_again_while_its_jail_runs_is_the_one_the_next_call_sees(
    tmp_path, home, monkeypatch, idle
):
    # `rm -rf proj && git clone ... proj` beside a live session: its running jail shows the old
    # directory (gone), its sandbox grants the old inode; the next call works in the new one.
    monkeypatch.setenv("OLLIE_JAIL_IDLE", idle)
    cwd = tmp_path / "proj"
    cwd.mkdir()
    (cwd / "old-file").write_text("")
    server, call = one_session(cwd)
    try:
        assert await output(call, "echo kept > /tmp/x; ls") == "old-file\n"
        [old] = server._jails._jails.values()
        cwd.rename(tmp_path / "proj.old")
        cwd.mkdir()
        (cwd / "new-file").write_text("")
        assert await output(call, "ls; echo written > written") == "new-file\n"
        assert (cwd / "written").read_text() == "written\n"
        assert (await output(call, "cat /tmp/x 2>&1 || echo gone")).endswith("gone\n")  # a new jail
        for _ in range(50):  # the old jail, and its /tmp, go at once (not at the idle time)
            if not old.running:
                break
            await asyncio.sleep(0.05)
        assert not old.running
        if idle == "0":  # jails never closed for idleness: nothing left to look at them later
            await asyncio.sleep(0.6)
            assert server._jails._timer is None
    finally:
        await server.close()


async def test_a_writable_grant_made_again_while_its_jail_runs_is_the_one_the_next_call_writes(tmp_path, home):
    # `rm -rf ~/.cache/pip` beside a live session, pip making it again: the jail showed the old,
    # deleted directory, and what the session's pip wrote there was lost.
    cache = home / "cache"
    server, call = session_writing(tmp_path, cache)
    try:
        await output(call, f"echo one > {cache}/f")
        cache.rename(home / "cache.old")
        cache.mkdir()
        await output(call, f"echo two > {cache}/f")
        assert (cache / "f").read_text() == "two\n"
        cache.rename(home / "cache.gone")  # removed: left out of the next sandbox, as a new one's
        result = await call(f"echo three > {cache}/f")
        assert result.is_error and (home / "cache.gone" / "f").read_text() == "two\n", result.text()
    finally:
        await server.close()


async def test_a_hooks_working_directory_made_again_is_the_one_its_next_hook_sees(tmp_path, home):
    from ollie.agent import hooks

    cwd = tmp_path / "proj"
    cwd.mkdir()
    (cwd / "old-file").write_text("")
    runner = hooks.Runner("hooks")
    try:
        assert (await hooks.run_command("ls", {}, str(cwd), {}, 20, runner))[:2] == (0, "old-file\n")
        cwd.rename(tmp_path / "proj.old")
        cwd.mkdir()
        (cwd / "new-file").write_text("")
        assert (await hooks.run_command("ls", {}, str(cwd), {}, 20, runner))[:2] == (0, "new-file\n")
    finally:
        await runner.close()


async def test_a_read_only_grant_replaced_or_made_while_a_session_lives_is_granted_to_its_next_call(
    looked_at_every_call, tmp_path, home
):
    # `ldconfig`, `update-ca-certificates` or a DHCP client replace /etc/ld.so.cache, the CA
    # bundle or /etc/resolv.conf by a rename; rustup makes ~/.cargo/bin. A session whose sandbox
    # was decided before kept the old file's Landlock rule (reads refused: no DNS, no TLS trust)
    # or no rule at all, for its whole life. Now its next call gets a new ruleset, in the same
    # jail (its /tmp kept), once the paths are looked at again (at most once a RECHECK seconds).
    conf, toolchain, cwd = home / "resolv.conf", home / "toolchain", tmp_path / "cwd"
    cwd.mkdir()
    conf.write_text("nameserver 10.0.0.1\n")
    write_policy(None, f"filesystem:\n  ro: ['{conf}', '{toolchain}']\n")
    server, call = one_session(cwd)
    try:
        assert await output(call, f"cat {conf}; echo kept > /tmp/x") == "nameserver 10.0.0.1\n"
        [box] = server._sandboxes._cache.values()
        for _ in range(3):  # nothing changed: the same sandbox, not one built at each call
            await output(call, "true")
        assert list(server._sandboxes._cache.values()) == [box]
        (home / "resolv.conf.new").write_text("nameserver 10.0.0.2\n")
        (home / "resolv.conf.new").rename(conf)
        toolchain.mkdir()
        (toolchain / "cargo").write_text("installed\n")
        assert await output(call, f"cat {conf} {toolchain}/cargo /tmp/x") == "nameserver 10.0.0.2\ninstalled\nkept\n"
    finally:
        await server.close()


@pytest.fixture
async def mount(tmp_path: Path) -> Any:
    """A FUSE mount served by this test's event loop, as `ollie srv` serves its own."""
    from ollie.vfs.fuse import Mount
    from ollie.vfs.namespace import Namespace, StaticDir
    from ollie.vfs.stores import TextFile

    mount = Mount(Namespace(StaticDir({"word": TextFile(lambda: "word\n")})), str(tmp_path / "mnt"))
    await mount.start()
    try:
        yield mount
    finally:
        await mount.unmount()


def _asked_by_the_loop(caplog: Any) -> list[str]:
    """The mount's requests that came from its own event loop (refused by its guard, 0.1-0.2 s late)."""
    return [r.getMessage() for r in caplog.records if "from the loop thread" in r.getMessage()]


async def test_what_code_in_home_plants_for_other_sessions_stalls_no_event_loop(
    mount, looked_at_every_call, tmp_path, home, caplog
):
    # Code of a session working in $HOME points the missing toolchain paths other sessions'
    # policy names at ollie's own mount (served by this very loop, as `ollie srv` serves its) and
    # makes ~/.gitconfig a FIFO. Another session's paths are looked at again and its sandbox is
    # built anew: nothing is asked of the mount by the loop (which would wait on itself until
    # its guard refuses), the FIFO is not waited on (the loop hung for good), the session keeps
    # working, and its sandbox is built anew once, not at every look.
    from ollie.sandbox.policy import _HOME_TOOLCHAINS

    proj = tmp_path / "proj"
    proj.mkdir()
    victim, vcall = one_session(proj)
    attacker, acall = one_session(home)
    try:
        await output(vcall, "echo kept > /tmp/x")
        [before] = victim._sandboxes._cache.values()
        homes = [p.replace("{HOME}/", "") for p in _HOME_TOOLCHAINS if p.startswith("{HOME}/")]
        plant = [f"mkdir -p $(dirname ~/{p}) && ln -s {mount.path}/nothing-{n} ~/{p}" for n, p in enumerate(homes)]
        plant[homes.index(".cargo/bin")] = f"mkdir -p ~/.cargo && ln -s {mount.path} ~/.cargo/bin"
        await output(acall, "; ".join([*plant, "mkfifo ~/.gitconfig"]))
        boxes = []
        for _ in range(4):
            assert await asyncio.wait_for(output(vcall, "cat /tmp/x"), 30) == "kept\n"
            boxes.append(next(iter(victim._sandboxes._cache.values())))
        assert before is not boxes[0] and boxes == [boxes[0]] * 4, "built anew once, then kept"
        new = tmp_path / "new"
        new.mkdir()
        newcomer, ncall = one_session(new)
        try:
            assert await asyncio.wait_for(output(ncall, "echo first"), 30) == "first\n"
        finally:
            await newcomer.close()
        assert not _asked_by_the_loop(caplog)
    finally:
        await victim.close()
        await attacker.close()


async def test_a_writable_grant_or_cwd_linked_into_the_servers_own_mount_stalls_no_event_loop(
    mount, tmp_path, home, caplog
):
    # Each call looks at its cwd and the directories it may write: never through a link, which
    # could lead into ollie's own mount. A cache made a link is refused as a new session's would
    # be (its jails kept); once made again, the call works there; a cwd made a link is refused.
    cache = home / ".cache" / "pip"
    write_policy(None, "filesystem:\n  rw: ['{HOME}/.cache/pip']\n")
    cache.mkdir(parents=True)
    proj = tmp_path / "proj"
    proj.mkdir()
    server, call = one_session(proj)
    try:
        await output(call, f"echo one > {cache}/f")
        cache.rename(cache.with_name("pip.old"))
        cache.symlink_to(mount.path)
        for _ in range(2):
            refused = await call("true")
            assert refused.is_error and "through the symlink" in refused.text(), refused.text()
        cache.unlink()
        cache.mkdir()
        await output(call, f"echo two > {cache}/f")
        assert (cache / "f").read_text() == "two\n"
        proj.rename(tmp_path / "proj.old")
        proj.symlink_to(mount.path)
        refused = await call("true")
        assert refused.is_error and "is reached through a symlink" in refused.text(), refused.text()
        assert not _asked_by_the_loop(caplog)
    finally:
        await server.close()


async def test_a_program_linked_into_the_servers_own_mount_on_the_path_stalls_no_event_loop(
    mount, looked_at_every_call, tmp_path, home, caplog
):
    # A session's PATH holds ~/.local/bin (a toolchain grant); code working in $HOME links a
    # `bash`, a `python3` and an `sh` there into ollie's own mount. The interpreters of the
    # session's stages and hooks are looked up off the loop: nothing is asked of the mount by the
    # loop that serves it, and the programs further on the PATH run.
    from ollie.agent import hooks

    local_bin, proj = home / ".local" / "bin", tmp_path / "proj"
    local_bin.mkdir(parents=True)
    proj.mkdir()
    path = {"PATH": f"{local_bin}:/usr/bin:/bin"}
    victim, vcall = one_session(proj, env=path)
    attacker, acall = one_session(home)
    runner = hooks.Runner("hooks")
    try:
        assert await output(vcall, "echo one") == "one\n"
        await output(acall, "; ".join(f"ln -s {mount.path}/{p} ~/.local/bin/{p}" for p in ("bash", "python3", "sh")))
        for _ in range(2):
            assert await output(vcall, "echo two") == "two\n"
        three = await vcall("print('three')", language="python3")
        assert not three.is_error and three.text() == "three\n", three.text()
        assert (await hooks.run_command("echo four", {}, str(proj), path, 20, runner))[:2] == (0, "four\n")
        assert not _asked_by_the_loop(caplog)
    finally:
        await runner.close()
        await victim.close()
        await attacker.close()


async def test_a_sandboxed_mcp_server_started_after_code_in_home_planted_links_stalls_no_event_loop(
    mount, tmp_path, home, monkeypatch, caplog
):
    # Code of a session working in $HOME pointed the toolchain paths the `tools` policy names, and
    # ~/.local/bin on the PATH, at ollie's own mount, and made ~/.gitconfig a FIFO. A stdio MCP
    # server is then started, sandboxed, for another session: its policy is read, its sandbox
    # decided and its PATH searched off the loop, so nothing is asked of the mount by the loop
    # that serves it (which would wait on itself until its guard refused), and the server works.
    from ollie.agent.env import build_agent_env
    from ollie.config import AgentConfig
    from ollie.sandbox.policy import _HOME_TOOLCHAINS
    from ollie.tools import Dispatcher

    for n, p in enumerate(p.replace("{HOME}/", "") for p in _HOME_TOOLCHAINS if p.startswith("{HOME}/")):
        (home / p).parent.mkdir(parents=True, exist_ok=True)
        (home / p).symlink_to(mount.path if p == ".cargo/bin" else f"{mount.path}/nothing-{n}")
    os.mkfifo(home / ".gitconfig")
    monkeypatch.setenv("PATH", f"{home}/.local/bin:/usr/bin:/bin")
    proj = tmp_path / "proj"
    proj.mkdir()
    calc = Path(__file__).parent / "mcp_servers" / "calc.py"
    d = Dispatcher()
    try:
        env = await build_agent_env(
            AgentConfig(mcp_servers={"calc": {"command": sys.executable, "args": [str(calc)]}}), d, str(proj)
        )
        assert env.infos == []
        added = await asyncio.wait_for(d.dispatch("add", {"a": 2, "b": 40}, CallContext(cwd=str(proj))), 60)
        assert added.text() == "42", added.text()
    finally:
        await d.close()
    assert not _asked_by_the_loop(caplog)


async def test_a_hook_named_through_a_link_into_the_servers_own_mount_stalls_no_event_loop(
    mount, tmp_path, home, caplog
):
    # An agent's hook is `./hooks/word`, a file of the project; the session's code made ./hooks a
    # link into ollie's own mount. Whether sandboxed code could rewrite the hook's file is decided
    # where the link is followed off the loop: nothing is asked of the mount by the loop that
    # serves it (at each hook of each turn), and the turn goes on.
    from ollie.config import AgentConfig
    from test_sandbox_escapes import hook_run

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hooks").symlink_to(mount.path)
    sent, _ = await asyncio.wait_for(hook_run(AgentConfig(hooks={"preTurn": ["./hooks/word"]}), proj), 60)
    assert sent.endswith("go"), sent
    assert not _asked_by_the_loop(caplog)


async def test_a_link_planted_on_a_missing_grant_leaves_running_sessions_what_they_had(
    looked_at_every_call, tmp_path, home, monkeypatch
):
    # Code working in $HOME plants a link where a grant the policy names is missing: a new session
    # is refused (the link could be pointed anywhere), a running one keeps its sandbox, which
    # grants no more, rather than failing every call from then on; it is not built again at
    # every look after.
    write_policy(None, "filesystem:\n  rw: ['{HOME}/.cache/pip']\n")
    proj, other = tmp_path / "proj", tmp_path / "other"
    for d in (proj, other):
        d.mkdir()
    victim, vcall = one_session(proj)
    attacker, acall = one_session(home)
    newcomer, ncall = one_session(other)
    try:
        await output(vcall, "true")
        await output(acall, "mkdir -p ~/.cache ~/.ssh && ln -s ~/.ssh ~/.cache/pip")
        refused = await ncall("true")
        assert refused.is_error and "through the symlink" in refused.text(), refused.text()
        [box] = victim._sandboxes._cache.values()
        build, builds = sandbox._build, []
        monkeypatch.setattr(sandbox, "_build", lambda *a: builds.append(a) or build(*a))
        for _ in range(3):
            out = await output(vcall, f"ls {home}/.cache/pip/ 2>&1 || echo refused")
            assert out.endswith("refused\n"), out
        assert list(victim._sandboxes._cache.values()) == [box] and not box.stale
        assert len(builds) == 1, "tried again at every look"
    finally:
        await victim.close()
        await attacker.close()
        await newcomer.close()


async def test_a_toolchain_made_in_home_reaches_a_session_whose_decisions_a_home_session_made(
    looked_at_every_call, tmp_path, home
):
    # The decisions a session working in $HOME made are shared with a session working elsewhere:
    # what the first session's cwd covers is still looked at again for the second.
    proj = tmp_path / "proj"
    proj.mkdir()
    at_home, hcall = one_session(home)
    in_proj, pcall = one_session(proj)
    try:
        await output(hcall, "true")  # decides first
        await output(pcall, "true")
        (home / ".cargo" / "bin").mkdir(parents=True)
        (home / ".cargo" / "bin" / "cargo").write_text("installed\n")
        assert await output(pcall, f"cat {home}/.cargo/bin/cargo") == "installed\n"
    finally:
        await at_home.close()
        await in_proj.close()


async def test_a_read_only_grant_replaced_is_granted_to_the_next_hook(looked_at_every_call, tmp_path, home):
    from ollie.agent import hooks

    conf, cwd = home / "hosts", tmp_path / "cwd"
    cwd.mkdir()
    conf.write_text("one\n")
    write_policy("hooks", f"filesystem:\n  ro: ['{conf}']\n")
    runner = hooks.Runner("hooks")
    try:
        assert (await hooks.run_command(f"cat {conf}", {}, str(cwd), {}, 20, runner))[:2] == (0, "one\n")
        (home / "hosts.new").write_text("two\n")
        (home / "hosts.new").rename(conf)
        assert (await hooks.run_command(f"cat {conf}", {}, str(cwd), {}, 20, runner))[:2] == (0, "two\n")
    finally:
        await runner.close()


async def test_a_link_in_a_jails_own_tmp_is_no_changed_grant(monkeypatch, tmp_path, home):
    # Code plants a symlink in its private /tmp where a later policy's grant (a host directory
    # under /tmp) is to be mounted: its own call fails, and no policy of any session is decided
    # anew for it (the grant itself did not change).
    shared, cwd = tmp_path / "host-shared", tmp_path / "cwd"
    for d in (shared, cwd):
        d.mkdir()
    write_policy("build", f"filesystem:\n  rw: ['{shared}']\n")
    anew: list[int] = []
    monkeypatch.setattr(sandbox, "decide_anew", lambda: anew.append(1))
    server, call = one_session(cwd, policies=("default", "build"))
    try:
        planted = await call(f"mkdir -p {shared.parent} && rmdir {shared} 2>/dev/null; ln -s /etc {shared} && echo ok")
        assert planted.text() == "ok\n", planted.text()
        result = await call(f"ls {shared}", "build")
        assert result.is_error and "symbolic links" in result.text(), result.text()
        assert anew == []
    finally:
        await server.close()


def test_jail_idle_reads_the_variable(monkeypatch):
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "30")
    assert sandbox.jail_idle() == 30
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "0")
    assert sandbox.jail_idle() == 0
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "soon")
    assert sandbox.jail_idle() == 600
    monkeypatch.delenv("OLLIE_JAIL_IDLE")
    assert sandbox.jail_idle() == 600


async def test_the_fork_server_exits_with_its_owner(tmp_path):
    """Its socket's other end closed (ollie gone), the server exits; its jails' own sockets decide theirs."""
    code = (
        "import asyncio, os\n"
        "from ollie.sandbox.jail import Jail, JailSetup, _FORK_SERVER\n"
        "async def main():\n"
        "    await Jail.start(JailSetup(False, 512, 1 << 24, ()))\n"
        "    print(_FORK_SERVER.pid, flush=True)\n"
        "asyncio.run(main())\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the fork server outlived its owner")


async def test_an_idle_jail_with_the_view_is_closed_and_its_successor_serves_the_view(h, monkeypatch):
    """The view of a jail closed for idleness goes with it; the next call's jail mounts its own."""
    monkeypatch.setenv("OLLIE_JAIL_IDLE", "0.3")
    me = await h.new()
    assert (await h.ok(me, "echo kept > /tmp/x; cat $OLLIE/s/$OLLIE_SESSION_ID/state")).strip()
    await asyncio.sleep(1.0)
    out = await h.ok(me, "cat /tmp/x 2>/dev/null || echo gone; ls $OLLIE/s")
    assert out.split() == ["gone", me.id]


async def test_waiting_for_a_stage_times_out_returns_at_its_exit_and_leaves_it_alone_when_cancelled(home):
    """`Stage.wait`: False once its timeout passes, True at the exit; a cancelled wait (a turn
    interrupted) neither cancels nor ends the stage, whose exit then still comes."""
    cwd = str(home)  # not under /tmp, which a jail hides
    boxes, jails = sandbox.Sandboxes(), sandbox.Jails()
    box = await boxes.get_async("default", cwd, "")
    jail = await jails.get(box.policy)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        sleep = ["/bin/sleep", "30"]
        stage = await jail.spawn(box.confinement, sleep, cwd, box.environ(), stdin=null, stdout=null, stderr=null)
        assert await stage.wait(0.05) is False
        waiting = asyncio.ensure_future(stage.wait())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not stage.exited.done(), "a cancelled wait ended the stage"
        stage.kill()
        assert await asyncio.wait_for(stage.wait(), 10) is True
        assert stage.exited.result() == -9
        assert await stage.wait(0) is True  # once exited, at once
    finally:
        os.close(null)
        await jails.close()


def _native_inits() -> list[int]:
    server = jail_mod._FORK_SERVER.pid
    assert server is not None
    return [
        p for p in _jail_processes(server) if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"ollie-jail-init")
    ]


async def test_between_stages_a_jails_pid_1_is_the_native_init_and_holds_a_few_pages(run):
    """Once its setup is done, a jail's PID 1 is the native init (jailinit.c), not a Python process:
    a few pages of its own (a Python PID 1 kept over 2 MiB), one thread."""
    result = await run("echo $PPID")
    assert result.text() == "1\n"
    inits = _native_inits()
    assert inits, "no jail runs the native init"
    for pid in inits:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert int(status["RssAnon"].split()[0]) < 256, status["RssAnon"]  # KiB
        assert status["Threads"].strip() == "1"


async def test_a_new_ruleset_is_set_up_while_a_stage_of_another_runs(run, tmp_path):
    """A call in another cwd needs a ruleset of its own, whose mounts and rules only Python sets up:
    the native init runs jaild.py for it in a child of its own while the first stage runs on, and
    binds the new cwd writable. A third ruleset builds on what the second left (the mounts' state
    handed from one build to the next); no builder outlives its build."""
    first = asyncio.create_task(run("sleep 0.6; echo first > mine; cat mine"))
    for _ in range(200):
        if alive("sleep 0.6"):
            break
        await asyncio.sleep(0.01)

    async def call_in(cwd: Path) -> str:
        cwd.mkdir()
        ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=run.ctx.tmpdir, policies=run.ctx.policies)
        code = "echo here > mine; cat mine; pwd; echo $PPID"
        result = await run.server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        return result.text()

    for name in ("second", "third"):  # writable only if the build bound it so (the jail's root is read-only)
        assert await call_in(tmp_path / name) == f"here\n{tmp_path / name}\n1\n"
    assert (await first).text() == "first\n"
    assert len(_native_inits()) >= 1 and not [p for p in _native_inits() if _children_of(p) != []]


def _children_of(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def no_compiler(monkeypatch):
    """A fork server of its own that finds no C compiler: every jail's PID 1 stays jaild.py."""
    monkeypatch.setattr(jail_mod, "_native_init", lambda: None)
    server = jail_mod._ForkServer()
    monkeypatch.setattr(jail_mod, "_FORK_SERVER", server)
    yield server
    if server._sock is not None:
        server._sock.close()  # the server exits with its socket
    if server._process is not None:
        server._process.wait(10)


async def test_without_a_c_compiler_pid_1_stays_python_and_serves_the_same(no_compiler, run):
    result = await run("echo $PPID; yes | head -1; echo x > mine; cat mine; echo no > /etc/x", timeout=5)
    assert "\n1\ny\nx\n" in result.text() and "Read-only file system" in result.text(), result.text()
    timed_out = await run("sleep 30", timeout=0.5)
    assert "execution timeout" in timed_out.text()  # the kill request, as jaild.py reads it
    processes = _jail_processes(no_compiler.pid)
    assert processes
    cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in processes]
    assert not [c for c in cmdlines if c.startswith(b"ollie-jail-init")]
    assert [c for c in cmdlines if b"The jail helper" in c]


async def test_a_ruleset_whose_builder_dies_fails_its_call_and_a_new_jail_serves_the_next(run, tmp_path):
    """The native init answers for a build that ends without answering (its Python killed here as
    soon as it shows; it may not have read the request yet, or may have): the call fails saying
    so. What the build mounted before it died is on record nowhere, so the jail retires: the next
    call is served by a new one."""
    assert (await run("echo warm")).text() == "warm\n"
    server = jail_mod._FORK_SERVER.pid
    assert server is not None

    async def kill_builder() -> bool:
        for _ in range(2000):
            for pid in _jail_processes(server):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"build" in argv[4:7]:
                    os.kill(pid, signal.SIGKILL)
                    return True
            await asyncio.sleep(0.0005)
        return False

    for attempt in range(30):  # until one build is caught before it answers
        cwd = tmp_path / f"other{attempt}"
        cwd.mkdir()
        ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=run.ctx.tmpdir, policies=run.ctx.policies)
        jails = [j for j in run.server._jails._jails.values() if j.alive]
        killer = asyncio.create_task(kill_builder())
        result = await run.server.call_tool("execute_code", {"steps": [{"code": "echo built"}]}, ctx)
        killed = await killer
        if result.is_error:
            assert killed and "could not set up the ruleset (its helper died)" in result.text(), result.text()
            break
    else:
        pytest.fail("no build was caught before it answered")
    assert len(jails) == 1
    for _ in range(200):  # its retirement comes on the control socket, after the answer
        if not jails[0].alive:
            break
        await asyncio.sleep(0.01)
    assert not jails[0].alive
    assert (await run("echo still")).text() == "still\n"
    assert [j for j in run.server._jails._jails.values() if j.alive] not in ([], jails)


async def test_what_no_program_can_be_given_is_refused_before_the_jail_sees_it():
    """A NUL byte would split the request's fields (an argument turned into the environment)."""
    jail = await Jail.start(_setup())
    confinement = jail_mod.Confinement(-1, {"seccomp": "", "expose": [], "jail_rules": []})
    streams = {"stdin": 0, "stdout": 1, "stderr": 2}
    try:
        with pytest.raises(jail_mod.SpawnError, match="a NUL byte in 'a"):
            await jail.spawn(confinement, ["/bin/echo", "a\0b"], "/", {}, **streams)
        with pytest.raises(jail_mod.SpawnError, match="not a variable's name: 'A=B'"):
            await jail.spawn(confinement, ["/bin/echo"], "/", {"A=B": "c"}, **streams)
    finally:
        await jail.close()


def test_the_native_init_is_built_with_the_systems_compiler_not_one_on_the_path(tmp_path, monkeypatch):
    """A program a sandboxed stage planted on the user's PATH (a project's .venv/bin) is never run
    to build it: `cc`, and the assembler and linker it runs, come from the system's directories."""
    if shutil.which("cc", path=jail_mod._SYSTEM_PATH) is None:
        pytest.skip("no C compiler")
    planted = tmp_path / "bin"
    planted.mkdir()
    for name in ("cc", "gcc", "as", "ld"):
        (planted / name).write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-{name}\nexit 1\n")
        (planted / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ['PATH']}")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    built = jail_mod._native_init()
    assert built is not None and built.startswith(b"\x7fELF")
    assert not list(tmp_path.glob("ran-*"))
    assert jail_mod._native_init() == built  # the second time, the one built


def test_the_init_a_wheel_carries_is_taken_and_none_of_other_source(tmp_path, monkeypatch):
    """An installed wheel holds the init beside jail.py (setup.py), named by its source's digest:
    taken as it is, with no compiler asked (none is, where the wheel is all there is); a file
    named for other source (a package upgraded in place) is never run, nor one beside a checkout's
    jail.py (an editable install), where a session's code could have planted it."""
    package = tmp_path / "lib" / "package"
    package.mkdir(parents=True)
    monkeypatch.setattr(jail_mod, "__file__", str(package / "jail.py"))
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    monkeypatch.setattr(jail_mod, "_SYSTEM_PATH", str(tmp_path / "no-compiler"))
    monkeypatch.delenv("CC", raising=False)
    digest = hashlib.sha256(jail_mod._JAILINIT).hexdigest()[:16]
    (package / "ollie-jail-init-0123456789abcdef").write_bytes(b"\x7fELF of other source")
    assert jail_mod._native_init() is None
    (package / f"ollie-jail-init-{digest}").write_bytes(b"\x7fELF the wheel's")
    assert jail_mod._native_init() is None  # a checkout: no sys.prefix, no user site above it
    monkeypatch.setattr(jail_mod, "PYTHON_DIRS", (os.path.realpath(tmp_path),))  # installed there
    assert jail_mod._native_init() == b"\x7fELF the wheel's"
    assert not (tmp_path / "data").exists()


async def test_the_fork_server_takes_its_standard_library_from_where_ollies_python_has_it():
    """Not from a search up the interpreter's directories, which looks for lib/python3X.zip in
    each (a file a program can plant where Python lives under $HOME): PYTHONHOME set, alone."""
    jail = await Jail.start(_setup())
    try:
        pid = jail_mod._FORK_SERVER.pid
        assert Path(f"/proc/{pid}/environ").read_bytes() == f"PYTHONHOME={jail_mod._PYTHON_HOME}\0".encode()
        flags = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:5]
        assert flags == [b"-s", b"-S", b"-P", b"-c"]  # not -I, which would ignore PYTHONHOME
    finally:
        await jail.close()


def test_without_a_data_directory_to_build_in_the_init_is_left_out(tmp_path, monkeypatch):
    """ollie run where its data directory cannot be written (here it is a file): no native init,
    no error; every jail's PID 1 stays Python."""
    (tmp_path / "data").write_text("not a directory")
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    assert jail_mod._native_init() is None


def test_ollie_jail_init_python_keeps_pid_1_python_and_a_typo_is_named(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("OLLIE_JAIL_INIT", "python")
    assert jail_mod._native_init() is None
    monkeypatch.setenv("OLLIE_JAIL_INIT", "pyhton")
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    jail_mod._native_init()
    assert "OLLIE_JAIL_INIT='pyhton': neither 'native' nor 'python'" in caplog.text


def test_a_compiler_that_refuses_the_init_is_remembered_and_one_that_cannot_run_is_not(tmp_path, monkeypatch):
    """A compile that failed is not tried at every start (a `.failed` file says why); one that could
    not run at all (no such program, no room, a timeout on a busy machine) is tried by the next ollie."""
    if shutil.which("cc", path=jail_mod._SYSTEM_PATH) is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    monkeypatch.setenv("CC", "/usr/bin/ollie-no-such-cc")
    assert jail_mod._native_init() is None
    assert not list((tmp_path / "data" / "jail-init").glob("*.failed"))
    monkeypatch.setenv("CC", "/bin/false")
    assert jail_mod._native_init() is None
    assert len(list((tmp_path / "data" / "jail-init").glob("*.failed"))) == 1
    monkeypatch.delenv("CC")  # the system's cc would build it: not asked, the failure is remembered
    assert jail_mod._native_init() is None
    assert sorted(p.suffix for p in (tmp_path / "data" / "jail-init").iterdir()) == [".failed"]  # nothing left over


def test_a_cc_outside_the_systems_directories_is_not_run(tmp_path, monkeypatch, caplog):
    """`$CC` in a directory a session's code may write (a project's toolchain) would run outside
    the sandbox and build what every jail runs as its PID 1: the system's cc builds it instead."""
    if shutil.which("cc", path=jail_mod._SYSTEM_PATH) is None:
        pytest.skip("no C compiler")
    planted = tmp_path / "cc"
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\nexit 1\n")
    planted.chmod(0o755)
    monkeypatch.setenv("CC", str(planted))
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    built = jail_mod._native_init()
    assert built is not None and built.startswith(b"\x7fELF") and not (tmp_path / "ran").exists()
    assert f"CC={planted} is not in the system's directories" in caplog.text
