"""The Landlock sandbox: policies (files, overlays, templates, names) and the escape suite, every
attempt made for real through execute_code under the default policy."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ollie import config, paths, sandbox
from ollie.sandbox import caches as caches_module
from ollie.sandbox import gitidentity, linked, userconfig
from ollie.sandbox.linked import LinkedLayout, linked_installs
from ollie.tools import CallContext, execute
from sandbox_helpers import API_KEY, NO_UNIX_SOCKETS, SECRET, UNIX_SOCKETS, write_policy
from test_execute import alive

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

# ---- the escape suite: each attempt fails under the default policy -------------------------------


async def test_cannot_write_outside_the_cwd(run, tmp_path, home):
    (tmp_path / "existing").write_text("original")
    result = await run(
        f"echo x > {home}/.bashrc; mkdir {tmp_path}/d; echo x > {tmp_path}/new; echo x > /usr/x; rm {tmp_path}/existing"
    )
    assert result.is_error and "Read-only file system" in result.text()  # refused by mount, before Landlock
    assert not (home / ".bashrc").exists() and not (tmp_path / "d").exists() and not (tmp_path / "new").exists()
    assert (tmp_path / "existing").read_text() == "original"


async def test_cannot_read_secrets_under_home(run, home):
    cfg = os.environ["OLLIE_CFG_PATH"]
    for code in (f"cat {home}/.ssh/id_rsa", f"cat {cfg}/env", f"ls {home}", f"grep -r s3cr3t {home}"):
        result = await run(code)
        assert result.is_error, code
        assert "s3cr3t" not in result.text() and API_KEY not in result.text()
    result = await run(f"ls -a {home}")
    assert result.is_error and ".ssh\n" not in result.text()


@pytest.mark.skipif(os.geteuid() != 0, reason="the point is that even root cannot")
async def test_root_cannot_read_etc_shadow(run):
    for code in ("cat /etc/shadow", "cat /etc/gshadow", "ls /etc/ssh", "cat /etc/sudoers"):
        result = await run(code)
        assert result.is_error and ("Permission denied" in result.text() or "No such file" in result.text()), code
    result = await run("grep CapEff /proc/self/status")  # root inside holds no capabilities
    assert result.text().split() == ["CapEff:", "0000000000000000"]


async def test_cannot_write_through_a_symlink_pointing_outside(run, tmp_path, home):
    target = home / "target"
    target.write_text("original")
    result = await run(f"ln -s {target} link && echo changed > link")
    assert result.is_error and target.read_text() == "original"
    result = await run(f"ln -s {home}/.ssh/id_rsa key && cat key")
    assert result.is_error and "s3cr3t" not in result.text()


async def test_a_call_stays_confined_when_its_policy_leaves_the_cache(home, tmp_path):
    # Sessions differ in $TMPDIR, so a busy server builds many sandboxes and drops the oldest
    # while a call may still be running under it: its next stage must still be confined.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), tmpdir=str(tmp_path))
    outside = home / "escaped"
    call = asyncio.create_task(
        server.call_tool(
            "execute_code",
            {"steps": [{"code": "touch started; sleep 0.5"}, {"code": f"echo escaped > {outside}"}]},
            ctx,
        )
    )
    while not (cwd / "started").exists():
        await asyncio.sleep(0.01)
    for i in range(40):  # other sessions: each its own tmpdir, so its own sandbox
        other = tmp_path / f"session-{i}"
        other.mkdir()
        result = await server.call_tool(
            "execute_code", {"steps": [{"code": "true"}]}, CallContext(cwd=str(cwd), tmpdir=str(other))
        )
        assert not result.is_error, result.text()
    result = await call
    assert result.is_error and not outside.exists(), result.text()
    await server.close()


async def test_cannot_connect_to_a_loopback_listener(run):
    """The host's loopback is not the jail's: a listener of the host's is nowhere to be found."""
    connected = asyncio.Event()
    server = await asyncio.start_server(lambda r, w: connected.set(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run(f"echo hi > /dev/tcp/127.0.0.1/{port}")
        assert result.is_error and "Connection refused" in result.text()
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        result = await run(code, "python3")
        assert result.is_error and "ConnectionRefusedError" in result.text()
        # MPTCP: Landlock's TCP rules do not cover it, the seccomp filter refuses the socket.
        code = f"import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).connect(('127.0.0.1', {port}))"
        result = await run(code, "python3")
        assert result.is_error and "PermissionError" in result.text()
        assert not connected.is_set()
    finally:
        server.close()
        await server.wait_closed()


SERVE_AND_ASK = """
import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
client = socket.create_connection(server.getsockname(), timeout=5)
peer, _ = server.accept()
client.sendall(b"ping")
print(peer.recv(4).decode(), server.getsockname()[1] != 0)
for where in (("10.255.255.1", 80), ("1.1.1.1", 443)):
    try:
        socket.create_connection(where, timeout=2)
        print("reached", where)
    except OSError as e:
        print(type(e).__name__)
"""


async def test_a_server_of_its_own_on_any_port_serves_its_clients_and_nothing_outside_is_reached(run):
    """A test's server (a port the kernel picks, or a fixed one) and its clients, as `make test`
    runs them: the jail's own loopback carries them (Landlock refused every TCP port, and seccomp
    listen(2)); its network namespace has no way out."""
    Path(run.ctx.cwd, "serve.py").write_text(SERVE_AND_ASK)
    for port in (0, 8765):
        result = await run(f"python3 serve.py {port}")
        assert not result.is_error, result.text()
        assert result.text().splitlines() == ["ping True", "OSError", "OSError"], result.text()


async def test_multiprocessing_works_on_a_dev_shm_of_the_jails_own(run):
    """Python's multiprocessing (Queue, Pool, ProcessPoolExecutor: `pytest -n`) needs POSIX
    semaphores in /dev/shm, which the jail kept read-only: every one failed with EROFS. The jail
    has its own now; the host's stays out of sight, and nothing written in the jail's reaches it."""
    host = Path("/dev/shm") / f"ollie-host-{os.getpid()}"
    host.write_text("the host's")
    try:
        code = (
            "import multiprocessing as mp, concurrent.futures as cf, os\n"
            "q = mp.Queue(); q.put(1); print(q.get())\n"
            "with mp.Pool(2) as p: print(p.map(abs, [-1, -2]))\n"
            "with cf.ProcessPoolExecutor(2) as e: print(list(e.map(abs, [-3])))\n"
            f"print(os.path.exists('{host}'))\n"
            f"open('/dev/shm/ollie-jail-{os.getpid()}', 'w').write('x')\n"
        )
        result = await run(code, "python3")
        assert result.text() == "1\n[1, 2]\n[3]\nFalse\n", result.text()
        assert not Path(f"/dev/shm/ollie-jail-{os.getpid()}").exists()
    finally:
        host.unlink()


async def test_a_grant_under_dev_shm_is_shown_over_the_jails_own(run):
    """Over the jail's private /dev/shm, a directory a policy grants there is the host's again (it
    was refused as "no longer the file ollie granted", the jail's tmpfs in its place)."""
    granted = Path("/dev/shm") / f"ollie-granted-{os.getpid()}"
    granted.mkdir()
    try:
        write_policy("wide", f"filesystem:\n  rw: ['{granted}']\n")
        result = await run(f"echo shared > {granted}/f && ls /dev/shm", sandbox="wide")
        assert result.text() == f"{granted.name}\n", result.text()
        assert (granted / "f").read_text() == "shared\n"
    finally:
        shutil.rmtree(granted)


async def test_cannot_reach_unix_sockets(run, tmp_path):
    # Landlock does not govern connecting to a socket by path (tmux, ssh-agent, docker, ollie's own
    # server): the jail's init makes every connect(2) itself and refuses a socket file that is not
    # on the jail's own /tmp or /dev/shm (the Python init refuses to make Unix sockets at all),
    # unless the policy says network.unix. The cwd, which the jail shows, holds the host's socket.
    sock = tmp_path / "cwd" / "sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen()
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({str(sock)!r}); print('connected')"
    with listener:
        result = await run(code, "python3")
        assert result.is_error and "PermissionError" in result.text() and "connected" not in result.text()
        result = await run(
            "import socket; a, b = socket.socketpair(); a.send(b'pair'); print(b.recv(4).decode())", "python3"
        )
        assert result.text() == "pair\n"  # in-process socket pairs still work
        write_policy("unix", "network:\n  unix: true\n")
        result = await run(code, "python3", sandbox="unix")
        assert result.text() == "connected\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_programs_of_a_jail_talk_over_unix_sockets(run, tmp_path):
    # What test suites do: a server on a socket in $TMPDIR (by path, relative, from a thread, by
    # the program's own /proc links), an abstract one, one in /dev/shm, and multiprocessing's
    # forkserver (Python 3.14's default) and Manager.
    (tmp_path / "cwd" / "talk.py").write_text(
        """
import multiprocessing, os, socket, tempfile, threading

def square(x):
    return x * x

def talk(address):
    client = socket.socket(socket.AF_UNIX)
    client.connect(address)
    client.send(b"hi")
    return server.accept()[0].recv(2).decode()

if __name__ == "__main__":
    directory = tempfile.mkdtemp()
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.path.join(directory, "server.sock"))
    server.listen()
    print(talk(os.path.join(directory, "server.sock")))
    os.chdir(directory)
    print(talk("server.sock"))
    heard = []
    thread = threading.Thread(target=lambda: heard.append(talk("server.sock")))
    thread.start()
    thread.join()
    print(heard[0])
    found = os.open("server.sock", os.O_PATH)
    print(talk(f"/proc/self/fd/{found}"), talk(f"/dev/fd/{found}"))
    server = socket.socket(socket.AF_UNIX)
    server.bind("\\0ollie-test")
    server.listen()
    print(talk("\\0ollie-test"))
    server = socket.socket(socket.AF_UNIX)
    server.bind("/dev/shm/server.sock")
    server.listen()
    print(talk("/dev/shm/server.sock"))
    with multiprocessing.get_context("forkserver").Pool(2, maxtasksperchild=1) as pool:
        print(sum(pool.map(square, range(10))))
    with multiprocessing.Manager() as manager:
        shared = manager.dict(answer=42)
        print(shared["answer"])
"""
    )
    result = await run("python3 talk.py", timeout=60)
    assert result.text() == "hi\nhi\nhi\nhi hi\nhi\nhi\n285\n42\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_a_later_policys_programs_talk_over_unix_sockets_too(run, home):
    # A second ruleset in the running jail is built by a helper of the init, not by jaild.py's
    # first process: its channel must come with its supervised program too.
    write_policy("wide", f"filesystem:\n  ro: [{home}]\n")
    code = (
        "import socket\nserver = socket.socket(socket.AF_UNIX)\nserver.bind('/tmp/s')\nserver.listen()\n"
        "socket.socket(socket.AF_UNIX).connect('/tmp/s')\nprint('talked')"
    )
    assert (await run("true")).text() == ""  # the jail runs, with the default policy's channel
    result = await run(code, "python3", sandbox="wide")
    assert result.text() == "talked\n"


async def test_the_hosts_tmp_is_out_of_sight(run, tmp_path):
    # Other sessions' scratch directories, the file server's token and pid files, anything of
    # the user's kept under /tmp: a jail has a /tmp of its own.
    secret = Path(f"/tmp/ollie-test-secret-{os.getpid()}")
    secret.write_text(SECRET)
    other_session = Path(os.environ["OLLIE_TMP_PATH"]) / "other-session"
    other_session.mkdir(parents=True)
    (other_session / "history.jsonl").write_text(SECRET)
    try:
        result = await run(
            f"cat {secret}; cat {other_session}/history.jsonl; ls /tmp; echo mine > /tmp/written; cat /tmp/written"
        )
        assert "s3cr3t" not in result.text() and result.text().count("No such file") == 2
        assert "mine" in result.text() and not Path("/tmp/written").exists()
        listing = result.text().split("No such file or directory\n")[-1]
        assert secret.name not in listing and "ns." not in listing
    finally:
        secret.unlink()


async def test_cannot_signal_the_server_nor_the_jail(run):
    result = await run(f"kill -TERM {os.getpid()}; kill -KILL 1; echo tried")
    assert "No such process" in result.text()  # the server is not in the jail's PID namespace
    assert "not permitted" in result.text()  # PID 1 is the jail, outside the sandbox's Landlock domain
    result = await run("echo still here")
    assert result.text() == "still here\n"


async def test_cannot_read_api_keys_from_the_environment(run):
    result = await run("env; cat /proc/$PPID/environ; cat /proc/1/environ; tr '\\0' '\\n' < /proc/self/environ")
    assert API_KEY not in result.text()
    assert "Permission denied" in result.text()  # the server's own environ is out of reach


async def test_cannot_leave_a_process_running(run):
    code = "setsid sleep 4242.1 & (trap '' HUP TERM; exec -a keepalive-4242 sleep 4242.2) & disown; echo bye"
    result = await run(code)
    assert result.text() == "bye\n"
    assert alive("4242") == []


# ---- what the default policy allows -----------------------------------------------------------


async def test_reads_the_system_and_writes_cwd_and_tmpdir(run, tmp_path):
    result = await run(
        "ls /usr/bin | grep -c . ; head -1 /etc/passwd; echo made > file; mkdir -p d/e; "
        "echo tmp > $TMPDIR/t; cat file $TMPDIR/t; rm -r d"
    )
    assert not result.is_error, result.text()
    lines = result.text().splitlines()
    assert int(lines[0]) > 10 and lines[1].startswith("root:") and lines[2:] == ["made", "tmp"]
    assert (tmp_path / "cwd" / "file").read_text() == "made\n"


async def test_interpreters_run(run):
    for language, code in (
        ("python3", "import json, ssl; print('py')"),
        ("perl", "use POSIX; print qq(pl\\n)"),
        ("bash", "python3 -c 'print(1)' && jq -n 1 && date -u +%Y >/dev/null && echo sh"),
    ):
        result = await run(code, language)
        assert not result.is_error, result.text()


# ---- policies -----------------------------------------------------------------------------------


async def test_named_policy_overlays_the_global_one(run, tmp_path, monkeypatch):
    shared, extra = tmp_path / "shared", tmp_path / "extra"
    shared.mkdir()
    extra.mkdir()
    write_policy(None, f"filesystem:\n  rw: [{shared}, /no/such/dir]\n")
    write_policy("wide", "filesystem:\n  rw: ['{VAR_FOR_TEST}/extra', '{UNSET_FOR_TEST}/']\nenv: [MY_VAR]\n")
    monkeypatch.setenv("VAR_FOR_TEST", str(tmp_path))
    monkeypatch.setenv("MY_VAR", "passed")
    result = await run(f"echo a > {shared}/a && echo b > {extra}/b && echo $MY_VAR")
    assert result.is_error and not (extra / "b").exists()  # default: the global file only
    assert (shared / "a").exists()
    result = await run(f"echo b > {extra}/b && echo $MY_VAR", sandbox="wide")
    assert not result.is_error and result.text() == "passed\n"


async def test_network_rules_open_exactly_the_listed_ports(run):
    listener = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port, other_port = listener.getsockname()[1], other.getsockname()[1]
    with listener, other:
        write_policy("net", f"network:\n  connect_tcp: [{port}]\n  bind_tcp: [18765]\n")
        connect = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])))"
        result = await run(f'python3 -c "{connect}" {port} && echo ok', sandbox="net")
        assert result.text() == "ok\n"
        result = await run(f'python3 -c "{connect}" {other_port}', sandbox="net")
        assert result.is_error and "PermissionError" in result.text()
        result = await run(
            "import socket; socket.socket().bind(('127.0.0.1', 18765)); print('bound')", "python3", sandbox="net"
        )
        assert result.text() == "bound\n"
        write_policy("open", "network:\n  unrestricted: true\n")
        result = await run(f'python3 -c "{connect}" {other_port} && echo ok', sandbox="open")
        assert result.text() == "ok\n"


@pytest.mark.parametrize(
    "text,message",
    [
        ("filesystem: [a]\n", "filesystem must be a mapping"),
        ("filesystem:\n  rw: /tmp\n", "filesystem.rw must be a list of paths"),
        ("filesystem:\n  write: [/tmp]\n", "unknown key filesystem.write"),
        ("shell: bash\n", "unknown key 'shell'"),
        ("filesystem:\n  rw: [relative/dir]\n", "'relative/dir' is not an absolute path"),
        ("network:\n  connect_tcp: [http]\n", "network.connect_tcp must be a list of port numbers"),
        ("env: PATH\n", "env must be a list of variable names"),
        ("filesystem: {rw: [\n", "invalid YAML"),
        ("limits:\n  processes: 10\n", "limits.processes must be at least 300"),
        ("limits:\n  memory: lots\n", "limits.memory must be a size such as 512M or 2G (or unlimited)"),
        ("limits:\n  cpu: -1\n", "limits.cpu must be a positive number"),
        ("limits:\n  disk: 1G\n", "unknown key limits.disk"),
    ],
)
async def test_bad_policy_files_are_reported(run, text, message):
    path = write_policy("bad", text)
    result = await run("echo never", sandbox="bad")
    assert result.is_error and message in result.text() and "never" not in result.text(), result.text()
    assert str(path) in result.text() or "sandbox " in result.text()


async def test_policies_are_built_once_and_rebuilt_when_edited(home, tmp_path):
    boxes = sandbox.Sandboxes()
    first = await boxes.get_async("default", str(tmp_path), str(tmp_path))
    assert await boxes.get_async("default", str(tmp_path), str(tmp_path)) is first
    write_policy(None, "env: [EXTRA]\n")
    second = await boxes.get_async("default", str(tmp_path), str(tmp_path))
    assert second is not first and "EXTRA" in second.policy.env


async def test_sessions_of_one_cwd_share_its_decisions_and_each_reads_only_its_own_scratch(home, tmp_path):
    # The policy's grants for a cwd are decided once for every session there; each session's own
    # scratch directory is decided for it alone, and the other sessions' stay out of its reach.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    scratch = {sid: tmp_path / f"scratch-{sid}" for sid in ("a", "b")}
    for sid, d in scratch.items():
        d.mkdir()
        (d / "result").write_text(f"{sid}'s\n")
    servers = {sid: execute.factory(str(cwd))() for sid in scratch}
    try:
        for sid, other in (("a", "b"), ("b", "a")):
            ctx = CallContext(cwd=str(cwd), session_id=sid, tmpdir=str(scratch[sid]))
            code = f"cat {scratch[sid]}/result; cat {scratch[other]}/result; echo x > {scratch[sid]}/new"
            result = await servers[sid].call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
            text = result.text()
            assert f"{sid}'s\n" in text and f"{other}'s" not in text, text  # the other's is hidden
            assert "Read-only file system" in text and not (scratch[sid] / "new").exists(), text
        assert len(sandbox._DECISIONS) >= 1
    finally:
        for server in servers.values():
            await server.close()


async def test_shared_decisions_are_made_anew_once_a_granted_path_is_another_file(home, tmp_path):
    # A session's first call always judged the grants as they are then; sharing keeps that: a
    # path of the policy replaced (here the shared writable directory) is decided again.
    cwd, shared, mine, theirs = (tmp_path / n for n in ("cwd", "shared", "mine", "theirs"))
    for d in (cwd, shared, mine, theirs):
        d.mkdir()
    first = await sandbox.Sandboxes().get_async("default", str(cwd), "", (), (str(mine),), (str(shared),))
    decisions = [d for d in sandbox._DECISIONS.values() if d.policy.cwd == str(cwd)]
    again = await sandbox.Sandboxes().get_async("default", str(cwd), "", (), (str(theirs),), (str(shared),))
    assert len(decisions) == 1 and [d for d in sandbox._DECISIONS.values() if d.policy.cwd == str(cwd)] == decisions
    identity = os.stat(shared)
    exposed = {e[0]: tuple(e[-2:]) for e in again.confinement.spec["expose"]}
    assert exposed[str(shared)] == (identity.st_dev, identity.st_ino)
    assert str(theirs) in exposed and str(mine) not in exposed  # decided for each session
    shared.rename(tmp_path / "old")
    shared.mkdir()
    after = await sandbox.Sandboxes().get_async("default", str(cwd), "", (), (str(theirs),), (str(shared),))
    assert [d for d in sandbox._DECISIONS.values() if d.policy.cwd == str(cwd)] != decisions  # decided anew
    new = os.stat(shared)
    exposed = {e[0]: tuple(e[-2:]) for e in after.confinement.spec["expose"]}
    assert exposed[str(shared)] == (new.st_dev, new.st_ino) != (identity.st_dev, identity.st_ino)
    assert str(theirs) in exposed and str(mine) not in exposed
    assert str(mine) in {e[0] for e in first.confinement.spec["expose"]}


async def test_a_granted_path_made_after_the_decisions_is_granted_to_the_next_session(home, tmp_path):
    # A path the policy names that does not exist is left out; once made (rustup installs
    # ~/.cargo while the server runs), the next session gets it, in this cwd and in another,
    # as it did when every session read the policy itself.
    cache = home / "late-cache"
    write_policy(None, "filesystem:\n  rw: ['{HOME}/late-cache']\n")
    cwd, other = tmp_path / "cwd", tmp_path / "other"
    for d in (cwd, other):
        d.mkdir()
    before = await sandbox.Sandboxes().get_async("default", str(cwd), "")
    assert str(cache) not in {e[0] for e in before.confinement.spec["expose"]}
    cache.mkdir()
    for where in (cwd, other):
        after = await sandbox.Sandboxes().get_async("default", str(where), "")
        assert str(cache) in {e[0] for e in after.confinement.spec["expose"]}, where


async def test_a_running_sessions_read_only_grants_are_looked_at_again_at_most_once_a_recheck(
    home, tmp_path, monkeypatch
):
    # A running session's sandbox is told when a path it grants read-only is replaced, or one its
    # policy names is made; the paths are looked at once a RECHECK seconds at most, each once
    # however many sessions name it (code that can replace such a path makes each session build
    # its sandbox anew that often).
    conf, made, cwd = home / "conf", home / "made", tmp_path / "cwd"
    (cwd / "vendor").mkdir(parents=True)
    conf.write_text("one\n")
    write_policy(None, f"filesystem:\n  ro: ['{conf}', '{made}', '{{CWD}}/vendor']\n  rw: ['{home}/cache']\n")
    box = await sandbox.Sandboxes().get_async("default", str(cwd), "")
    named = dict(box.named)
    st = os.stat(conf)  # a file: which one, and its size and change time (changed in place, judged again)
    assert named[str(conf)] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    assert named[str(made)] is None and named[f"{home}/cache"] is None  # missing: granted once made
    # each call looks at its cwd itself; what lies in it, the cwd's rule covers
    assert str(cwd / "vendor") in box.policy.paths["ro"]
    assert str(cwd) not in named and str(cwd / "vendor") not in named
    (home / "cache").mkdir()
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    await sandbox._look_again_if_due()
    assert box.stale
    box = await sandbox.Sandboxes().get_async("default", str(cwd), "")
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    await sandbox._look_again_if_due()  # looked at now, not again for RECHECK seconds
    assert not box.stale
    (home / "conf.new").write_text("two\n")
    (home / "conf.new").rename(conf)
    await sandbox._look_again_if_due()
    assert not box.stale
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    await sandbox._look_again_if_due()
    assert box.stale
    made.mkdir()
    again = await sandbox.Sandboxes().get_async("default", str(cwd), "")
    exposed = {e[0]: tuple(e[-2:]) for e in again.confinement.spec["expose"]}
    assert exposed[str(conf)] == (os.stat(conf).st_dev, os.stat(conf).st_ino) and str(made) in exposed
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    await sandbox._look_again_if_due()
    assert not again.stale


async def test_a_granted_path_made_while_the_decisions_are_made_is_granted_to_the_next_session(
    home, tmp_path, monkeypatch
):
    # Made after the policy was read and before its paths were looked at: the decisions then
    # stand for a policy without it, and must not take it for a path that was always there.
    cache, cwd = home / "racing-cache", tmp_path / "cwd"
    cwd.mkdir()
    write_policy(None, "filesystem:\n  rw: ['{HOME}/racing-cache']\n")
    read = sandbox.load_policy

    def read_then_make(*args):
        policy = read(*args)
        cache.mkdir(exist_ok=True)
        return policy

    monkeypatch.setattr(sandbox, "load_policy", read_then_make)
    await sandbox.Sandboxes().get_async("default", str(cwd), "")
    after = await sandbox.Sandboxes().get_async("default", str(cwd), "")
    assert str(cache) in {e[0] for e in after.confinement.spec["expose"]}
    # and the shared decisions were made anew with it, for the sessions after to share whole
    [shared] = [d for d in sandbox._DECISIONS.values() if d.policy.cwd == str(cwd)]
    assert str(cache) in shared.policy.paths["rw"]


async def test_a_session_gets_what_its_policy_names_now_though_decisions_are_shared(home, tmp_path, monkeypatch):
    # Each session reads the policy for itself: a variable its templates name changed since (the
    # env file edited), or the policy file revoked a grant with its time kept (`cp -p`), and the
    # next session in the same cwd gets what a decision of its own would give.
    mine, theirs, secret, cwd = (tmp_path / n for n in ("mine", "theirs", "secret", "cwd"))
    for d in (mine, theirs, secret, cwd):
        d.mkdir()

    async def exposed(scratch: str) -> set[str]:
        (tmp_path / scratch).mkdir()
        box = await sandbox.Sandboxes().get_async("default", str(cwd), "", (), (str(tmp_path / scratch),))
        fresh = sandbox.Sandbox(sandbox.load_policy("default", str(cwd), "", (), (str(tmp_path / scratch),)))
        assert box.confinement.spec["expose"] == fresh.confinement.spec["expose"]
        return {e[0] for e in box.confinement.spec["expose"]}

    path = write_policy(None, f"filesystem:\n  rw: ['{{MY_DATA}}']\n  ro: ['{secret}']\n")
    monkeypatch.setenv("MY_DATA", str(mine))
    assert {str(mine), str(secret)} <= await exposed("s1")
    monkeypatch.setenv("MY_DATA", str(theirs))
    assert str(theirs) in await exposed("s2") and str(mine) not in await exposed("s3")
    before = path.stat()
    path.write_text("filesystem:\n  rw: ['{MY_DATA}']\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert str(secret) not in await exposed("s4")


async def test_sessions_in_other_cwds_share_only_what_does_not_depend_on_the_cwd(home, tmp_path):
    # Sessions in cwds of their own share the policy's decisions but for their cwd and the grants
    # reached through a symlink: one in a session's cwd (where its code may plant it) is refused
    # for that session, though a session elsewhere was granted the path.
    a, b, target = (tmp_path / n for n in ("a", "b", "target"))
    for d in (a, b, target, target / "data"):
        d.mkdir()
    (b / "link").symlink_to(target)
    write_policy(None, f"filesystem:\n  ro: ['{b}/link/data']\n")
    scratch = [tmp_path / f"scratch-{n}" for n in range(3)]
    for d in scratch:
        d.mkdir()
    first = await sandbox.Sandboxes().get_async("default", str(a), "", (), (str(scratch[0]),))
    assert str(target / "data") in {e[0] for e in first.confinement.spec["expose"]}
    with pytest.raises(sandbox.SandboxError, match="through the symlink"):
        await sandbox.Sandboxes().get_async("default", str(b), "", (), (str(scratch[1]),))
    # what a session elsewhere gets is what a decision of its own would give, in the same order
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shared = await sandbox.Sandboxes().get_async("default", str(elsewhere), "", (), (str(scratch[2]),))
    alone = sandbox.Sandbox(sandbox.load_policy("default", str(elsewhere), "", (), (str(scratch[2]),)))
    assert shared.confinement.spec["expose"] == alone.confinement.spec["expose"]
    assert str(elsewhere) in {e[0] for e in shared.confinement.spec["expose"]}
    assert str(a) not in {e[0] for e in shared.confinement.spec["expose"]}  # another session's cwd


def test_templates_expand(home, tmp_path):
    write_policy(None, "filesystem:\n  ro: ['{HOME}/.ssh', '{XDG_CONFIG_HOME}', '{OLLIE_CFG_PATH}']\n")
    policy = sandbox.load_policy("default", str(tmp_path), str(tmp_path))
    assert {str(home / ".ssh"), str(home / ".config"), os.environ["OLLIE_CFG_PATH"]} <= set(policy.paths["ro"])
    assert str(tmp_path) in policy.paths["rwx"]  # {CWD} and {TMPDIR}


def test_kernel_without_landlock_is_refused_unless_best_effort(home, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)  # the one thing this kernel cannot show
    policy = sandbox.load_policy("default", str(tmp_path), str(tmp_path))
    with pytest.raises(sandbox.SandboxError, match="no Landlock.*best_effort"):
        sandbox.Sandbox(policy)
    write_policy(None, "general:\n  best_effort: true\n")
    box = sandbox.Sandbox(sandbox.load_policy("default", str(tmp_path), str(tmp_path)))
    assert box.policy.best_effort


def test_an_architecture_without_ollies_seccomp_filter_is_refused_unless_best_effort(home, tmp_path, monkeypatch):
    monkeypatch.setattr("platform.machine", lambda: "riscv64")  # no filter is built for it: none would apply
    policy = sandbox.load_policy("default", str(tmp_path), "")
    with pytest.raises(sandbox.SandboxError, match="seccomp filter for x86_64 and aarch64, not for this riscv64"):
        sandbox.Sandbox(policy)
    write_policy(None, "general:\n  best_effort: true\n")
    assert sandbox.Sandbox(sandbox.load_policy("default", str(tmp_path), "")).confinement.spec["seccomp"] == ""


def test_a_kernel_that_forbids_user_namespaces_is_named_with_the_fix(tmp_path, monkeypatch):
    from ollie.sandbox import jail

    monkeypatch.setattr("os.geteuid", lambda: 1000)  # root needs no user namespace's leave
    apparmor, debian = tmp_path / "apparmor", tmp_path / "debian"
    monkeypatch.setattr(jail, "APPARMOR_USERNS", str(apparmor))
    monkeypatch.setattr(jail, "DEBIAN_USERNS", str(debian))
    assert jail.userns_hint() == ""  # neither setting exists: nothing known forbids them
    apparmor.write_text("1\n")
    hint = jail.userns_hint()
    assert "AppArmor forbids unprivileged user namespaces" in hint and "userns," in hint
    assert "sysctl kernel.apparmor_restrict_unprivileged_userns=0" in hint
    apparmor.write_text("0\n")
    debian.write_text("0\n")
    assert "sysctl kernel.unprivileged_userns_clone=1" in jail.userns_hint()


async def test_best_effort_without_a_seccomp_filter_says_so_in_the_first_result(run, monkeypatch):
    write_policy(None, "general:\n  best_effort: true\n")
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    server = execute.factory(run.ctx.cwd)()
    try:
        first = await server.call_tool("execute_code", {"steps": [{"code": "echo hi"}]}, run.ctx)
        second = await server.call_tool("execute_code", {"steps": [{"code": "echo hi"}]}, run.ctx)
    finally:
        await server.close()
    assert first.text().startswith("[sandbox: no seccomp filter for this riscv64") and first.text().endswith("hi\n")
    assert second.text() == "hi\n"


async def test_a_program_is_found_once_a_recheck_for_a_path_and_paths_no_session_asks_for_are_forgotten(
    monkeypatch, tmp_path
):
    # What a stage's interpreter lookup found is shared by every session of its PATH for RECHECK
    # seconds (a program installed meanwhile is seen then); a PATH no session asked for since is
    # dropped, so that sessions whose PATHs keep changing do not pile them up in the server.
    monkeypatch.setattr(sandbox, "_FOUND", {})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = str(bin_dir)
    assert await sandbox.find_program(path, ("tool",)) is None
    (bin_dir / "tool").write_text("#!/bin/sh\n")
    (bin_dir / "tool").chmod(0o755)
    assert await sandbox.find_program(path, ("tool",)) is None  # within RECHECK: what was found
    when, found = sandbox._FOUND[path]
    for n in range(100):
        sandbox._FOUND[f"/gone/{n}"] = (when - sandbox.RECHECK, {("tool",): None})
    sandbox._FOUND[path] = (when - sandbox.RECHECK, found)
    assert await sandbox.find_program(path, ("tool",)) == str(bin_dir / "tool")
    assert list(sandbox._FOUND) == [path]


def test_the_git_identity_is_read_as_git_reads_it_and_nothing_else(home):
    """The identity the sandbox's git gets: the last one set wins, an [include]'s in its place, a
    setting on its section's line counts, a section git would not take hides what follows it,
    and an includeIf's identity comes with its condition (a ./ pattern made absolute)."""
    (home / "id").mkdir()
    (home / "id" / "base").write_text("[user]\n\tname = From Include\n\temail = old@example.com\n")
    (home / "id" / "work").write_text('[user] email = "w@corp.example" # work\n[credential]\n\thelper = SECRET\n')
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Ada\n"
        "[include]\n\tpath = id/base\n"
        "[user] email = ada@example.com ; mine\n"
        '[url "x\\"y"]\n\tname = Mallory\n'
        '[includeIf "gitdir:./work/"]\n\tpath = ~/id/work\n'
        '[includeIf "onbranch:main"]\n\tpath = id/missing\n'
    )
    text = Path(gitidentity.global_config(())).read_text()
    work = Path(text.split('path = "')[1].split('"')[0]).read_text()
    assert text.startswith('[user]\n\temail = "ada@example.com"\n\tname = "From Include"\n[includeIf "gitdir:')
    assert f'[includeIf "gitdir:{home}/work/"]' in text and "onbranch" not in text and "Mallory" not in text
    assert work == '[user]\n\temail = "w@corp.example"\n'
    assert gitidentity.global_config((str(home),)) == ""  # a policy that grants it: git reads the real one
    (home / ".gitconfig").write_text("[core]\n\teditor = vi\n")
    assert gitidentity.global_config(()) == os.devnull  # no identity: nothing for git to read


def test_the_git_identity_read_is_bounded_and_shows_nothing_of_ollies_files(home):
    """~/.gitconfig is the code's to write when a session works in $HOME, and every session's
    sandbox build reads it: an include of ollie's hidden configuration gives nothing, includes past
    the sixteenth files are not read, and a header of a million blanks is parsed at once (its
    pattern took 25 minutes: each split of the blanks between two of its parts was tried)."""
    cfg = Path(os.environ["OLLIE_CFG_PATH"])
    (cfg / "who.ini").write_text("[user]\n\tname = HIDDEN-NAME\n")
    (home / "late").write_text("[user]\n\temail = late@example.com\n")
    lines = ["[user]\n\tname = Ada\n", f"[include]\n\tpath = {cfg}/who.ini\n"]
    lines += ["[include]\n\tpath = ~/nothing-here\n"] * 14 + ["[include]\n\tpath = ~/late\n"]
    (home / ".gitconfig").write_text("".join(lines))
    assert Path(gitidentity.global_config(())).read_text() == '[user]\n\tname = "Ada"\n'
    (home / ".gitconfig").write_text("[a" + " " * (1 << 19) + "x\n[user] name = Bo\n")
    assert Path(gitidentity.global_config(())).read_text() == '[user]\n\tname = "Bo"\n'


def test_no_file_of_ollies_own_mount_is_read_for_a_sandbox(home, fs_server):
    """Code working in $HOME writes ~/.gitconfig and ~/.npmrc, which every session's sandbox build
    reads in the builder's thread: an include, or a link, into ollie's own mount (here a session's
    `statewait`) had the builder's thread, every session's, read a file whose reading acts
    (`fifo.out` pops a session's queued prompt, `worktree` commits) or waits (5 s each, 17 a build:
    a session's first call took 80 s); its server is ollie itself."""
    sid = fs_server.new_session()
    wait = fs_server.mnt / "s" / sid / "statewait"
    (home / ".cargo").mkdir()
    (home / ".cargo" / "config.toml").symlink_to(wait)
    (home / ".gitconfig").write_text("[user]\n\tname = Ada\n" + f"[include]\n\tpath = {wait}\n" * 3)
    t0 = time.monotonic()
    assert userconfig.secret_free(str(home / ".cargo" / "config.toml")) is False
    assert Path(gitidentity.global_config(())).read_text() == '[user]\n\tname = "Ada"\n'
    assert time.monotonic() - t0 < 2


def test_a_file_on_a_memory_file_system_costs_no_look_at_the_mount_table(monkeypatch):
    """Every configuration a sandbox reads is asked whether it lies on ollie's mount. A file system
    with an anonymous device (tmpfs here; an overlay root in a container, btrfs) is not FUSE: its
    type says so, and the mount table, which the question read for each of them, stays unread."""
    fd, name = tempfile.mkstemp(dir="/dev/shm")
    read: list[str] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: read.append(str(path)) or real_open(path, *a, **k))
    try:
        st = os.fstat(fd)
        assert os.major(st.st_dev) == 0
        assert paths.on_server_mount(fd, st) is False
        assert read == []
    finally:
        os.close(fd)
        os.unlink(name)


def test_a_cache_no_session_used_for_a_month_is_trimmed(home, tmp_path):
    """Every cwd's code gets a cache in ollie's data (a test's temporary cwd too): each use marks
    it, and one unused for KEEP_DAYS is removed, what its code wrote with it, through no link."""
    caches = config.data_dir("sandbox-cache")
    used = Path(caches_module.cache_dir(str(tmp_path / "project")))
    old = caches / "gone-0123456789abcdef"
    (old / "go-build" / "ab").mkdir(parents=True)
    (old / "go-build" / "ab" / "entry").write_text("built")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the cache's")
    (old / "link").symlink_to(outside)
    deep = caches / "aaa-deep-0123456789ab"  # deeper than rmtree recurses, looked at first: it stopped the trim
    subprocess.run(["mkdir", "-p", str(deep / "/".join(["d"] * 1100))], check=True)  # (makedirs recurses too)
    month_ago = time.time() - (caches_module.KEEP_DAYS + 1) * 86400
    for path in (old, used, deep):
        os.utime(path, (month_ago, month_ago))
    assert Path(caches_module.cache_dir(str(tmp_path / "project"))) == used  # used again: marked
    assert old.name in caches_module.trim(caches, time.time())
    assert not old.exists() and not deep.exists() and used.is_dir()
    assert (outside / "keep").read_text() == "not the cache's"


_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())


def _exchange(cache: str, stop) -> None:
    """Sandboxed code in its cache: its directory `d` and a link `l` swapped as fast as it goes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    while not stop.is_set():  # renameat2(AT_FDCWD, d, AT_FDCWD, l, RENAME_EXCHANGE)
        libc.syscall(_RENAMEAT2, -100, f"{cache}/d".encode(), -100, f"{cache}/l".encode(), 2)


@pytest.mark.skipif(_RENAMEAT2 is None, reason="renameat2's number is known for x86_64 and aarch64")
def test_the_trim_opens_nothing_a_link_in_a_cache_leads_to(home, tmp_path):
    """The trim removes what sandboxed code wrote in its cache (code can make its cache look a month
    unused: it sets its times). shutil.rmtree looked at a directory, then opened its name following
    links: a directory swapped for a link between the two (one trim in four) had ollie open what
    the code chose, blocking (a FIFO held the trim's thread for good; a device may act)."""
    import multiprocessing

    caches = config.data_dir("sandbox-cache")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opened, stop_rescue = [], threading.Event()

    def rescue() -> None:  # a writer for the FIFO: its open succeeds only while the trim has it open
        while not stop_rescue.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                opened.append(1)
            except OSError:
                time.sleep(0.001)

    rescuer = threading.Thread(target=rescue, daemon=True)
    rescuer.start()
    month_ago = time.time() - (caches_module.KEEP_DAYS + 1) * 86400
    try:
        for n in range(40):
            cache = caches / f"c{n}-0123456789abcdef"
            (cache / "x" / "d" / "sub").mkdir(parents=True)  # below the cache's top: its mtime stays
            (cache / "x" / "l").symlink_to(fifo)
            os.utime(cache, (month_ago, month_ago))
            stop = multiprocessing.get_context("fork").Event()
            swapper = multiprocessing.get_context("fork").Process(target=_exchange, args=(f"{cache}/x", stop))
            swapper.start()
            time.sleep(0.01)
            caches_module.trim(caches, time.time())
            stop.set()
            swapper.join()
    finally:
        stop_rescue.set()
        rescuer.join()
    assert not opened, "the trim opened the code's FIFO"


async def test_the_files_the_systems_pip_conf_names_are_read_with_it_but_not_its_directory(run, home, monkeypatch):
    """A system pip.conf that caps packages with `constraint = FILE` (as an admin does beside it, in
    /etc/xdg/pip) is no use without that file, which pip stops on; a client certificate's key
    beside it, or a constraints file naming an index with its password, stays out. The user's own
    pip.conf names none: sandboxed code may write it, to have any file read by later sessions."""
    system = home / "etc-xdg-pip"  # (as /etc/xdg/pip, which a test may not write)
    system.mkdir()
    monkeypatch.setattr(userconfig, "_SYSTEM_PIP", (str(system / "pip.conf"),))
    monkeypatch.setattr(userconfig, "CONFIGS", (*userconfig.CONFIGS, str(system / "pip.conf")))
    (system / "constraints.txt").write_text("torch<=2.14.1\n")
    (system / "private.txt").write_text("--index-url https://me:hunter2@pypi.corp.example/simple\n")
    (system / "client.pem").write_text("-----BEGIN PRIVATE KEY----- s3cr3t\n")
    (system / "pip.conf").write_text(
        f"[global]\nconstraint = {system}/constraints.txt\n  {system}/private.txt\nclient-cert = {system}/client.pem\n"
    )
    outside = home / "other-project-notes.txt"
    outside.write_text("not the session's to read\n")
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nconstraint = {outside}\n")
    result = await run(f"cd {system}; cat pip.conf constraints.txt private.txt client.pem {outside}; ls")
    text = result.text()
    assert "torch<=2.14.1" in text and "client-cert" in text, text
    assert "hunter2" not in text and "s3cr3t" not in text and "not the session's" not in text, text
    assert text.count("Permission denied") == 4, text


def test_a_tools_configuration_is_granted_only_without_a_secret(tmp_path):
    """cargo's, npm's, pip's and Maven's configurations are read by the sandbox unless one holds a
    token, a password, a secret or a credential, under any key, or a URL with a password."""
    cases = {
        "[net]\ngit-fetch-with-cli = true\n": True,
        "[global]\nindex-url = https://pypi.example/simple\n": True,
        '[registries.corp]\ntoken = "abc"\n': False,
        "//registry.npmjs.org/:_authToken=npm_abc\n": False,
        "[global]\nindex-url = https://me:pw@pypi.example/simple\n": False,
        "_password=cGFzcw==\n": False,
        "GITHUB_API_KEY = x\n": False,
        # hatch's index password; cargo's and yarn's switches that only name one are none
        '[publish.index]\nuser = "alice"\nauth = "hunter2hunter2"\n': False,
        "[registries.corp]\nauth-required = true\n": True,
        "npmAlwaysAuth: true\n": True,
        'npmScopes:\n  corp:\n    npmAuthIdent: "ada:hunter2xyz"\n': False,  # yarn's user and password
        # what a red-team pass got past a check of the keys alone
        '[registries]\nmy = { index = "sparse+https://r.example/", token = "cio" }\n': False,
        '[registry]\n"\\u0074oken" = "cio"\n': False,
        '[http]\nproxy = "alice:hunter2@proxy:3128"\n': False,
        '[env]\nGH_PAT = "ghp_abc"\n': False,
        '[env]\nFOO = "bar"\n': False,  # cargo's variables for builds, whatever they hold
        'key="-----BEGIN PRIVATE KEY-----\\nMIIE"\n': False,
        "registry=https://npm_abc@r.example/\n": False,
        '[target.x86_64-unknown-linux-gnu]\nrustflags = ["-C", "link-arg=-fuse-ld=mold"]\n': True,
        # names of secrets that hold none: cargo's recommended providers, a mirror named pypi-…
        '[registry]\nglobal-credential-providers = ["cargo:token", "cargo:libsecret"]\n': True,
        '[registry]\nglobal-credential-providers = [\n  "cargo:token",\n]\n': True,
        '[registries.corp]\ncredential-provider = "cargo:token"\nindex = "sparse+https://r.example/"\n': True,
        "[global]\nindex-url = https://art.example/api/pypi/pypi-remote/simple\n": True,
        # ... but not a provider of the user's, whose arguments may be anything, nor what follows
        '[registry]\nglobal-credential-providers = ["/bin/fetch --token abc"]\n': False,
        '[registry]\nglobal-credential-providers = ["cargo:token"] # token abc\n': False,
        '[registry]\ncredential-provider = "cargo:token"\ntoken = "abc"\n': False,
        "[pypi]\npassword = pypi-AgEIcHlwaS5vcmcCJGE0ZjQ5YjE5LWZjYmMtNDk3OC1iYjg5\n": False,
        "upload = pypi-AgEIcHlwaS5vcmcCJGE0ZjQ5YjE5LWZjYmMtNDk3OC1iYjg5\n": False,
        # cargo's [env] in TOML's other spellings, which a red-team pass read through the sandbox
        '[env.FOO]\nvalue = "bar"\n': False,
        'env.FOO = "bar"\n': False,
        'env = { FOO = "bar" }\n': False,
        '["env"]\nFOO = "bar"\n': False,
        "[ 'env' ]\nFOO = 'bar'\n": False,
        "[build]\njobs = 4\n[environment-free]\nx = 1\n": True,
        # Maven's own settings.xml, whose comments show placeholders where the secrets go
        "<!--\n    <proxy>\n      <password>proxypass</password>\n    </proxy>\n     | NOTE: You should either specify"
        " username/password OR privateKey/passphrase, since these pairings are\n      <password>repopwd</password>\n"
        "      <privateKey>/path/to/private/key</privateKey>\n-->\n<settings/>\n": True,
        "<server><id>corp</id><password>hunter2</password></server>\n": False,
        "<server><password>{COQLCE6DU6GtcS5P=}</password></server>\n": False,  # encrypted, still left out
        "      <password>repopwd</password> <password>hunter2</password>\n": False,
        "<!-- <password>hunter2</password> -->\n": False,  # a password in a comment is one still
        # what a red-team pass read through the sandbox: a token in a URL's path or query, a user
        # before an @ however the host goes on, TOML 1.1's \x, a BOM before [env], UTF-16, and a
        # shell's secrets named otherwise
        "registry=https://npm.fury.io/q7Zk2Lm9Pw4Rt8Vb/acme/\n": False,
        "[global]\nindex-url = https://dl.cloudsmith.io/Xy7Qp3Lm9Vb2Rt6Z/acme/private/python/simple/\n": False,
        "find-links = https://acme.blob.core.windows.net/wheels/index.html?sv=2022-11-02&sp=rl&sig=Zq3p%2BhT\n": False,
        "SLACK_WEBHOOK_URL=https://hooks.slack.com/services/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\n": False,
        "index-url = https://build:Winter2024'@pypi.corp.example/simple\n": False,
        "proxy = http://svc:Spring2025@[fd00::3128]:3128\n": False,
        "registry=https://build:Winter2024@${NPM_HOST}/\n": False,
        'export http_proxy="http://svc-build:Winter2024@$PROXY_HOST:3128/"\n': False,
        '[registries.corp]\n"tok\\x65n" = "cio0f3c9a7e5b2d41c8"\n': False,
        '\ufeff[env]\nFOO = "bar"\n': False,
        "export MYSQL_PWD='hunter2-db'\n": False,
        "export SSHPASS='hunter2-ssh'\n": False,
        "export BORG_PASSPHRASE='correct horse battery staple'\n": False,
        # from a second red-team pass: an Authorization header, a key named *_KEY, a key's prefix
        '[http "https://git.corp.example/"]\n\textraHeader = Authorization: Basic YnVpbGQ6V2lu\n': False,
        "<httpHeaders><property><name>Authorization</name><value>Bearer q7Zk2lM9</value></property>\n": False,
        "export NEW_RELIC_LICENSE_KEY=eu01xx0123456789abcdef\n": False,
        "STRIPE=sk_live_51HqBOMq7Zk2lM9pW4rT8vB\n": False,
        "export DB_PW=x\n": False,
        "helper = ghp_16C7e42F292c6912E7710c838347Ae178B4a\n": False,  # a prefix, whatever line it is on
        "index-url = https://example.com/0123456789abcdef0123456789abcdef/simple\n": False,  # hex, not a digest's
        "url = ssh://me:hunter2@host/repo\n": False,
        "PSWD=y\n": False,
        "CREDS=z\n": False,
        '[credential "https://host/q7Zk2Lm9Pw4Rt8Vb"]\n\thelper = cache\n': False,
        '[credential]\n\thelper = "!f() { echo password=abc; }; f"\n': False,
        # ... and what holds none: an email, git's ssh user, a credential helper by name, a wheel's
        # digest in its URL
        "[user]\n\tname = CI Bot\n\temail = ci@example.com\n": True,
        '[url "git@github.com:"]\n\tinsteadOf = https://github.com/\n': True,
        '[url "ssh://git@github.com/"]\n\tinsteadOf = https://github.com/\n': True,
        'cd "$(pwd)" && HERE=`pwd`\n': True,
        '[credential "https://source.developers.google.com"]\n\thelper = gcloud.sh\n': True,
        (
            "foo @ https://files.pythonhosted.org/packages/3b/00/"
            "2344469e0f1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9/f.whl\n"
        ): True,
        "email=me@example.com\nregistry=https://registry.npmjs.org/\n": True,
        "# If this is an xterm set the title to user@host:dir\n": True,
        # ... nor a shell's $PWD, a prompt's \\u, a registry's plain URL
        'echo "${USER}: ${PWD}"; cd "$OLDPWD"\n': True,
        "PS1='\\u:\\w\\$ '\n": True,
        "registry=https://registry.npmjs.org/\n": True,
    }
    for n, (text, granted) in enumerate(cases.items()):
        (tmp_path / f"c{n}").write_text(text)
        assert userconfig.secret_free(str(tmp_path / f"c{n}")) is granted, text
    (tmp_path / "utf16").write_text("//registry.npmjs.org/:_authToken=npm_abc\n", encoding="utf-16")
    assert not userconfig.secret_free(str(tmp_path / "utf16"))  # its words hidden between NULs
    (tmp_path / "blank").write_text("\n" * 65000 + "[net]\n")  # was 6.5 s of the builder's thread: each
    t0 = time.monotonic()  # line's start tried the rest of the blank lines for an [env]
    assert userconfig.secret_free(str(tmp_path / "blank")) and time.monotonic() - t0 < 2
    (tmp_path / "big").write_text("x = 1\n" * 20000)
    os.mkfifo(tmp_path / "fifo")
    assert not userconfig.secret_free(str(tmp_path / "big")) and not userconfig.secret_free(str(tmp_path / "fifo"))


_HOMES = """
import asyncio, os, resource, sys, tempfile
from pathlib import Path
from ollie.tools import CallContext, execute

async def main():
    held = []
    for _ in range(12):  # each with a $HOME of its own, as a test suite's tests
        d = Path(tempfile.mkdtemp(dir=sys.argv[1]))
        for var, sub in (("HOME", "home"), ("OLLIE_CFG_PATH", "cfg"), ("OLLIE_DATA_PATH", "data"), ("p", "p")):
            (d / sub).mkdir()
            os.environ[var] = str(d / sub)
        server = execute.factory(str(d / "p"))()
        ctx = CallContext(cwd=str(d / "p"), session_id="s", tmpdir=str(d / "data"))
        result = await server.call_tool("execute_code", {"steps": [{"code": "true"}]}, ctx)
        assert not result.is_error, result.text()
        await server.close()
        held.append(len(os.listdir("/proc/self/fd")))
    print(max(held), held[-1])

resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
asyncio.run(main())
"""


def test_a_copy_that_cannot_be_written_whole_leaves_nothing_behind(tmp_path):
    """A configuration's copy (or a git identity file) is written under a temporary name, then
    renamed: one cut short by a full disk (here the file size limit) left its half in ollie's data,
    one more at each build that tried again."""
    script = (
        "import resource, signal, sys\nfrom pathlib import Path\nfrom ollie.paths import write_new\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "try:\n    write_new(Path(sys.argv[1]) / 'npmrc', b'x' * 100_000)\n"
        "except OSError as e:\n    print(e.errno)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "27", out.stderr  # EFBIG
    assert os.listdir(tmp_path) == []


def test_an_app_at_the_usual_descriptor_limit_keeps_its_descriptors(tmp_path):
    """Each policy's grants are decided once and their descriptors kept (some seventy a decision)
    for the next session. A test suite embedding ollie gives each test a $HOME of its own, so each
    test's policy was decided anew and kept: at the usual soft limit of 1,024, sixteen of them held
    all but fifty. Decisions now hold a quarter of the limit at most."""
    scratch = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ollie-test-homes-"))
    try:
        out = subprocess.run([sys.executable, "-c", _HOMES, str(scratch)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        most, last = map(int, out.stdout.split())
        assert most <= 1024 // 4 + 80 and last <= most, out.stdout
    finally:
        shutil.rmtree(scratch)


def test_what_the_look_for_linked_installs_reads_is_bounded(tmp_path):
    """Code that writes the cwd can fill a virtualenv with entries for the builder's thread to look
    at: past a few in its lib, it counts as linked (kept read-only) rather than looked through."""
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "own-1.0.dist-info").mkdir(parents=True)
    (site / "own-1.0.dist-info" / "METADATA").write_text("Name: own\n")
    assert linked_installs(str(tmp_path)) == ()  # copies only: writable
    for n in range(8):
        (tmp_path / ".venv" / "lib" / f"python3.{n}x").mkdir()
    assert linked_installs(str(tmp_path)) == (f"{tmp_path}/.venv",)


def test_the_look_for_linked_installs_is_bounded_for_the_cwd_as_a_whole(tmp_path, monkeypatch):
    """The bound on a site-packages' entries held for each of them: eight pythons in each of two
    virtualenvs had the builder's thread look at 16 times as many (320,000 entries, 4 s a build)."""
    monkeypatch.setattr(linked, "_MOST", 100)
    for venv, python in ((".venv", "python3.11"), ("venv", "python3.12")):
        site = tmp_path / venv / "lib" / python / "site-packages"
        site.mkdir(parents=True)
        for n in range(60):
            (site / f"pkg{n}.py").write_text("")
    assert linked_installs(str(tmp_path)) == (f"{tmp_path}/venv",)  # counted as linked: not looked through


def _linked_venv(cwd: Path, store: Path) -> Path:
    """A virtualenv as uv makes one: its package's METADATA and a data file hard links into `store`."""
    store.mkdir(exist_ok=True)
    (store / "METADATA").write_text("Name: pkg\n")
    (store / "kernel.json").write_text("{}\n")
    site = cwd / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    os.link(store / "METADATA", site / "pkg-1.0.dist-info" / "METADATA")
    (cwd / ".venv" / "share" / "kernels").mkdir(parents=True)
    os.link(store / "kernel.json", cwd / ".venv" / "share" / "kernels" / "kernel.json")
    (cwd / ".venv" / "lib64").symlink_to("lib")  # as venv makes them: links that stay inside
    (cwd / ".venv" / "bin").mkdir()
    (cwd / ".venv" / "bin" / "python").symlink_to(sys.executable)
    return site


def test_a_linked_virtualenv_is_kept_whole_and_one_a_link_leads_out_of_is_refused(tmp_path):
    """A wheel's data files (`share/jupyter/kernels/python3/kernel.json`, run by Jupyter in your
    other projects) are hard links too: the virtualenv is kept whole. A symlink code planted in one
    before your next install led the install's links where it points (`lib/python3.11` moved to
    `stash/`, linked back); keeping that place was not enough, since code could then point a link
    of the chain elsewhere for the next session (red-team passes, stop 57): refused, saying why."""
    cwd, store = tmp_path / "project", tmp_path / "store"
    site = _linked_venv(cwd, store)
    assert linked_installs(str(cwd)) == (f"{cwd}/.venv",)
    (cwd / "stash").mkdir()
    site.parent.rename(cwd / "stash" / "python3.11")
    (cwd / "L1").symlink_to("stash/python3.11")
    site.parent.symlink_to("../../L1")
    (site / "other-1.0.dist-info").mkdir()  # your next install, through the link (what makes it looked at again)
    link = f"{cwd}/.venv/lib/python3.11 -> {cwd}/stash/python3.11"
    with pytest.raises(LinkedLayout, match=re.escape(f"holds a symlink leading out of it ({link})")):
        linked_installs(str(cwd))
    # ... and so is a cwd inside a linked virtualenv (a sub-agent's may be any directory of its parent's)
    (cwd / ".venv" / "lib" / "python3.11").unlink()
    (cwd / "stash" / "python3.11").rename(cwd / ".venv" / "lib" / "python3.11")
    (site / "other-1.0.dist-info").rmdir()
    assert linked_installs(str(cwd)) == (f"{cwd}/.venv",)
    for inside in (cwd / ".venv", cwd / ".venv" / "share" / "kernels"):
        with pytest.raises(LinkedLayout, match=re.escape(f"{inside} lies in {cwd}/.venv, a virtualenv whose")):
            linked_installs(str(inside))


def test_what_was_looked_at_is_looked_at_again_once_its_times_are_set_back(tmp_path):
    """A jail running while you install (the site-packages writable in it) could set the
    site-packages' mtime back: the look of before, kept by it, said nothing was linked."""
    cwd = tmp_path / "project"
    site = cwd / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    (site / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\n")
    assert linked_installs(str(cwd)) == ()
    before = site.stat()
    (site / "pkg-1.0.dist-info" / "METADATA").unlink()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "METADATA").write_text("Name: pkg\n")
    os.link(tmp_path / "store" / "METADATA", site / "pkg-1.0.dist-info" / "METADATA")
    os.utime(site, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert linked_installs(str(cwd)) == (f"{cwd}/.venv",)


def test_a_linked_virtualenv_behind_a_link_is_kept_where_it_is_outside_the_cwd(tmp_path):
    """Your `.venv`, a link to a virtualenv outside the project, is kept where it is; one into the
    project, which code could point elsewhere or remove, is refused."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    _linked_venv(tmp_path / "venvs", tmp_path / "store")
    (cwd / ".venv").symlink_to(tmp_path / "venvs" / ".venv")
    assert linked_installs(str(cwd)) == (f"{tmp_path}/venvs/.venv",)
    _linked_venv(cwd / "stash", tmp_path / "store2")
    (cwd / "venv").symlink_to("stash/.venv")
    with pytest.raises(LinkedLayout, match=re.escape(f"{cwd}/venv is a symlink to {cwd}/stash/.venv, a virtualenv")):
        linked_installs(str(cwd))
    unlinked = tmp_path / "unlinked"
    (unlinked / ".venv" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (unlinked / ".venv" / "share").symlink_to(tmp_path)  # nothing linked yet: nothing kept
    assert linked_installs(str(unlinked)) == ()
