"""The escape suite, second round: every way out an attacker's review found, tried for real from
inside a sandboxed stage (or hook), each shown to fail, and what must still work shown to work."""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent_helpers import make_core
from ollie import sandbox
from ollie.agent import hooks
from ollie.config import AgentConfig, ConfigError, parse_agent
from ollie.tools import CallContext, execute
from sandbox_helpers import API_KEY, NO_UNIX_SOCKETS, SECRET, UNIX_SOCKETS, write_policy
from test_execute import alive

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")


def errno_of(code: str) -> str:
    """Python that runs `code` and prints the errno name it fails with, or 'ok'."""
    body = "\n".join(" " + line for line in code.splitlines())
    return (
        f"import ctypes, errno, os, socket\ntry:\n{body}\n print('ok')\n"
        "except OSError as e:\n print(errno.errorcode[e.errno])"
    )


SYSCALL = "libc = ctypes.CDLL(None, use_errno=True)\n"


def syscall(nr: int, *args: str) -> str:
    """Python for a raw system call that raises OSError on failure."""
    return f"{SYSCALL}r = libc.syscall({nr}, {', '.join(args)})\nif r < 0: raise OSError(ctypes.get_errno(), 'failed')"


# ---- 1, 2, 6: sockets --------------------------------------------------------------------------


async def test_io_uring_is_refused(run):
    # IORING_OP_SOCKET makes sockets without socket(2), past the filter: no rings at all.
    result = await run(errno_of(syscall(425, "8", "ctypes.create_string_buffer(120)")), "python3")
    assert result.text() == "ENOSYS\n"


@pytest.mark.parametrize(
    "family,kind,proto,expected",
    [
        ("AF_INET", "SOCK_STREAM", 262, "EACCES"),  # MPTCP: Landlock's TCP rules do not cover it
        # UDP in the jail's network of its own, which reaches its loopback alone (with the host's
        # network it is refused: test_granted_ports_allow_tcp_only_and_unrestricted_allows_udp)
        ("AF_INET", "SOCK_DGRAM", 0, "ok"),
        ("AF_INET6", "SOCK_DGRAM", 17, "ok"),
        ("AF_INET", "SOCK_DGRAM", 1, "EACCES"),  # ICMP (ping sockets): not needed
        ("AF_INET", "SOCK_RAW", 1, "EACCES"),
        ("AF_VSOCK", "SOCK_STREAM", 0, "EAFNOSUPPORT"),
        ("AF_NETLINK", "SOCK_RAW", 4, "EACCES"),  # sock_diag lists every socket's path
        ("AF_NETLINK", "SOCK_DGRAM", 15, "EACCES"),  # kobject uevents, audit and the rest: none
        # rtnetlink in the jail's network of its own: its loopback's interfaces (getifaddrs), read
        # without capabilities (with the host's network: test_rtnetlink_is_refused_with_the_hosts_network)
        ("AF_NETLINK", "SOCK_RAW", 0, "ok"),
        ("AF_PACKET", "SOCK_RAW", 0, "EAFNOSUPPORT"),
        ("AF_INET", "SOCK_STREAM", 0, "ok"),  # plain TCP sockets: Landlock decides their ports
        # Unix sockets whose connect(2) the jail's init makes (with the Python init: none at all);
        # never a datagram one, which could send to any socket by path
        ("AF_UNIX", "SOCK_STREAM", 0, "ok" if UNIX_SOCKETS else "EACCES"),
        ("AF_UNIX", "SOCK_SEQPACKET", 0, "ok" if UNIX_SOCKETS else "EACCES"),
        ("AF_UNIX", "SOCK_DGRAM", 0, "EACCES"),
    ],
)
async def test_sockets_by_list(run, family, kind, proto, expected):
    result = await run(errno_of(f"socket.socket(socket.{family}, socket.{kind}, {proto})"), "python3")
    assert result.text() == f"{expected}\n"


async def test_code_makes_no_user_namespace_of_its_own(run):
    """In a user namespace of its own, code would hold every capability over the namespaces it
    makes there: rtnetlink in a new network namespace reaches net/sched, bridges and routes, the
    kernel's paths of many privilege escalations (which allowing rtnetlink for the jail's own
    loopback opened, until now). unshare and clone with CLONE_NEWUSER are refused; clone3, whose
    flags the filter cannot read, is ENOSYS, and threads and posix_spawn fall back to clone."""
    code = (
        "import ctypes, errno, os, socket, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def err(r):\n    return 'ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]\n"
        "print(err(libc.unshare(0x10000000 | 0x40000000)))  # CLONE_NEWUSER | CLONE_NEWNET\n"
        "print(err(libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, 0, 0, 0, 0)))\n"
        "print(err(libc.syscall(435, 0, 0)))  # clone3\n"
        "t = threading.Thread(target=print, args=('a thread',)); t.start(); t.join()\n"
        "print(subprocess.run(['echo', 'a spawn'], capture_output=True, text=True).stdout.strip())\n"
        "print(open('/proc/sys/user/max_user_namespaces').read().strip())\n"
    )
    result = await run(code, "python3")
    assert result.text() == "EPERM\nEPERM\nENOSYS\na thread\na spawn\n0\n", result.text()
    if shutil.which("unshare"):
        result = await run("unshare -Ur true 2>&1 || echo refused")
        assert result.text().endswith("Operation not permitted\nrefused\n"), result.text()


async def test_rtnetlink_reads_the_jails_loopback_and_changes_nothing(run):
    """In a network of the jail's own, rtnetlink lists its loopback alone and changes nothing there
    (no capability); with the host's network (a policy that grants ports), where it would list the
    host's interfaces and addresses, it stays refused."""
    if shutil.which("ip") is not None:
        result = await run("ip -o link show | cut -d: -f2; ip link add ollie0 type dummy 2>&1 || echo refused")
        assert result.text().split() == ["lo", "RTNETLINK", "answers:", "Operation", "not", "permitted", "refused"], (
            result.text()
        )
    # connected to the kernel (Rust's netlink crates connect before they ask), never to a group,
    # which the native init, making the connect with its capabilities, would have joined for it
    code = (
        "import errno, socket, struct\n"
        "def tried(address):\n"
        "    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\n"
        "    try:\n        s.connect(address)\n    except OSError as e:\n        return s, errno.errorcode[e.errno]\n"
        "    return s, 'ok'\n"
        "for address in ((0, 1), (4242, 0)):\n    print(tried(address)[1] in ('EACCES', 'EPERM'))\n"
        "s, how = tried((0, 0))\n"
        "s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + bytes(16))  # RTM_GETLINK, a dump\n"
        "print(how, b'lo\\0' in s.recv(65536))\n"
    )
    result = await run(code, "python3")
    assert result.text() == "True\nTrue\nok True\n", result.text()
    write_policy("net", "network:\n  connect_tcp: [443]\n")
    result = await run(errno_of("socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)"), "python3", sandbox="net")
    assert result.text() == "EAFNOSUPPORT\n"


async def test_granted_ports_are_the_only_ones_tcp_fast_open_and_listen_included(run):
    # sendto(MSG_FASTOPEN) connects without connect(2), and listen(2) on an unbound socket picks
    # a port without bind(2): Landlock sees neither, the seccomp filter refuses both.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    write_policy("net", "network:\n  connect_tcp: [9]\n")
    with listener:
        fast_open = f"socket.socket().sendto(b'hi', socket.MSG_FASTOPEN, ('127.0.0.1', {port}))"
        result = await run(errno_of(fast_open), "python3", sandbox="net")
        assert result.text() == "EACCES\n"
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    result = await run(errno_of("socket.socket().listen()"), "python3", sandbox="net")
    assert result.text() == "EACCES\n"
    write_policy("open", "network:\n  unrestricted: true\n")
    result = await run(errno_of("socket.socket().listen()"), "python3", sandbox="open")
    assert result.text() == "ok\n"


async def test_a_datagram_socketpair_cannot_send_to_a_socket_by_path(run, home):
    target = home / "dgram.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(target))
    with receiver:
        code = f"a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'out', {str(target)!r})"
        result = await run(errno_of(code), "python3")
        assert result.text() == "EACCES\n"
        receiver.setblocking(False)
        with pytest.raises(BlockingIOError):
            receiver.recv(10)
    result = await run(errno_of("socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)"), "python3")
    assert result.text() == "ok\n"


def host_listener(path: Path) -> socket.socket:
    """A Unix socket of the host's, listening at `path`, that accepts without waiting."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(64)
    listener.setblocking(False)
    return listener


def accepted(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
        return True
    except BlockingIOError:
        return False


async def test_a_unix_socket_connects_to_no_socket_file_of_the_hosts(run, tmp_path):
    # The host's socket lies in the cwd, which the jail shows; its path, a relative name, /proc's
    # links and a link to it in the jail's own /tmp all end at the host's file, which is refused.
    host = tmp_path / "cwd" / "host.sock"
    with host_listener(host) as listener:
        tries = [
            repr(str(host)),
            "'host.sock'",
            "'/proc/self/cwd/host.sock'",
            f"'/proc/' + str(os.getpid()) + '/root{host}'",
            "'/tmp/link'",
        ]
        code = f"os.symlink({str(host)!r}, '/tmp/link')\n"
        for target in tries:
            code += f"try:\n socket.socket(socket.AF_UNIX).connect({target}); print('connected')\n"
            code += "except OSError as e:\n print(errno.errorcode[e.errno])\n"
        result = await run(f"import errno, os, socket\n{code}", "python3")
        assert result.text() == "EACCES\n" * len(tries)
        assert not accepted(listener)


async def test_a_policy_that_grants_tmp_shows_no_host_socket_as_the_jails_own(run):
    # The host's /tmp bound over the jail's private one: a socket there is the host's, whatever
    # device /tmp has once the grant is bound.
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="ollie-test-"))
    host = directory / "host.sock"
    write_policy("wide", "filesystem:\n  rw: [/tmp]\n")
    try:
        with host_listener(host) as listener:
            code = f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(host)!r})"
            result = await run(errno_of(code), "python3", sandbox="wide")
            assert result.text() == "EACCES\n"
            assert not accepted(listener)
    finally:
        shutil.rmtree(directory)


# A listener in the jail's /tmp whose backlog is full: the next blocking connect to it waits.
FULL_BACKLOG = """
import socket
server = socket.socket(socket.AF_UNIX); server.bind("/tmp/full"); server.listen(0)
waiting = []
while True:
    s = socket.socket(socket.AF_UNIX); s.setblocking(False)
    try: s.connect("/tmp/full"); waiting.append(s)
    except BlockingIOError: break
"""


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_a_connect_that_waits_keeps_its_sockets_send_timeout(run):
    # A full backlog: the kernel says EAGAIN once SO_SNDTIMEO has passed; the init's wakeups
    # (each second, to see whether the program still waits) must not start it anew.
    code = """
import struct, time
s = socket.socket(socket.AF_UNIX)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 1, 500000))
start = time.monotonic()
try: s.connect("/tmp/full"); print("connected")
except OSError as e: print(type(e).__name__, "within 5 s" if time.monotonic() - start < 5 else "later")
"""
    result = await run(FULL_BACKLOG + code, "python3", timeout=30)
    assert result.text() == "BlockingIOError within 5 s\n"  # EAGAIN, after the 1.5 s asked


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_a_signal_interrupts_a_connect_that_waits(run):
    # The program's own call would return EINTR for a signal it catches (an alarm, a Ctrl-C, a
    # test runner's timeout); the init's answer must not wait for the connect to end first.
    code = """
import signal, threading
events = []
def ring(*_):
    events.append("signal")
    raise TimeoutError
signal.signal(signal.SIGALRM, ring)
later = threading.Timer(5, lambda: [server.accept() for _ in range(len(waiting) + 1)])
later.daemon = True  # the interrupted connect leaves one accept waiting for good
later.start()
signal.alarm(1)
try:
    socket.socket(socket.AF_UNIX).connect("/tmp/full"); events.append("connected")
except TimeoutError:
    events.append("interrupted")
print(events)
"""
    result = await run(FULL_BACKLOG + code, "python3", timeout=30)
    assert result.text() == "['signal', 'interrupted']\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_a_second_nonblocking_connect_says_it_is_under_way(run):
    # On loopback a nonblocking connect says EINPROGRESS; once the backlog is full the handshake
    # waits, and asking again says EALREADY at once, as the kernel does outside the sandbox.
    code = """
import errno, socket
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(0)
pairs = set()
for _ in range(6):
    c = socket.socket(); c.setblocking(False)
    first, again = c.connect_ex(server.getsockname()), c.connect_ex(server.getsockname())
    pairs.add((errno.errorcode.get(first), errno.errorcode.get(again)))
print(("EINPROGRESS", "EALREADY") in pairs)
"""
    result = await run(code, "python3", timeout=30)
    assert result.text() == "True\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_many_connects_that_wait_are_queued_not_refused(run):
    # Eighty threads connect to a full backlog; the init answers sixteen of a stage's at a time,
    # and the rest wait their turn, as they would in the kernel.
    code = """
import socket, threading, time
server = socket.socket(socket.AF_UNIX); server.bind("/tmp/full"); server.listen(0)
results = []
def client():
    try:
        c = socket.socket(socket.AF_UNIX); c.connect("/tmp/full"); results.append("ok")
    except OSError as e:
        results.append(e.strerror)
threads = [threading.Thread(target=client) for _ in range(80)]
for t in threads: t.start()
time.sleep(1)
accepted = [server.accept()[0] for _ in range(80)]
for t in threads: t.join()
print(len(results), set(results))
"""
    result = await run(code, "python3", timeout=60)
    assert result.text() == "80 {'ok'}\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_connects_that_wait_on_another_connect_are_all_taken_up(run):
    # Sixteen threads wait on a full backlog whose server accepts only once a seventeenth connect,
    # to another server, has gone through: the init counts a connect that has waited a second no
    # more against the stage's sixteen at once.
    code = """
import threading
other = socket.socket(socket.AF_UNIX); other.bind("/tmp/other"); other.listen()
results = []
def client():
    c = socket.socket(socket.AF_UNIX); c.connect("/tmp/full"); results.append(c)
threads = [threading.Thread(target=client) for _ in range(16)]
for t in threads: t.start()
time.sleep(0.5)
socket.socket(socket.AF_UNIX).connect("/tmp/other")
for _ in range(len(waiting) + 16): server.accept()
for t in threads: t.join()
print(len(results))
"""
    result = await run(FULL_BACKLOG + "import time\n" + code, "python3", timeout=30)
    assert result.text() == "16\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_a_daemon_of_a_running_stage_outlives_a_connect(run):
    # A process that left its stage's group lives until a stage ends (or another child of PID 1
    # does); a connect's answer is not such an end.
    code = (
        "setsid -f sleep 300; sleep 0.3\n"
        "python3 -c 'import socket; socket.socket().connect_ex((\"127.0.0.1\", 9))'; sleep 0.3\n"
        "pgrep -x sleep >/dev/null && echo alive || echo killed"
    )
    result = await run(code)
    assert result.text() == "alive\n"


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_an_address_rewritten_while_its_connect_is_judged_still_reaches_no_host_socket(run, tmp_path):
    # The init reads the address once, from the program's memory, and connects what it read: a
    # thread that flips the buffer between the jail's own socket and the host's, thousands of
    # times during the calls, gets the jail's or an error, never the host's.
    host = tmp_path / "cwd" / "host.sock"
    code = f"""
import ctypes, os, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
mine = socket.socket(socket.AF_UNIX); mine.bind("/tmp/mine"); mine.listen(4096)
names = [b"/tmp/mine", {str(host).encode()!r}]
addr = ctypes.create_string_buffer(110)
def put(name): ctypes.memmove(addr, b"\\x01\\x00" + name + b"\\x00", len(name) + 3)
put(names[1])
done = False
def flip():
    i = 0
    while not done:
        put(names[i % 2]); i += 1
threading.Thread(target=flip).start()
ours = 0
for _ in range(1500):
    s = socket.socket(socket.AF_UNIX)
    if libc.connect(s.fileno(), addr, 110) == 0:
        ours += 1
        mine.accept()[0].close()
    s.close()
done = True
print("connected to the jail's own" if ours else "never connected")
"""
    with host_listener(host) as listener:
        result = await run(code, "python3", timeout=120)
        assert result.text() == "connected to the jail's own\n"
        assert not accepted(listener)


@pytest.mark.skipif(not UNIX_SOCKETS, reason=NO_UNIX_SOCKETS)
async def test_odd_addresses_get_the_kernels_errors_and_the_jail_serves_on(run):
    # What the init reads is bounded by what it was given room for: a name longer than sun_path,
    # a length past any address, no address, a descriptor that is no socket.
    code = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket(socket.AF_UNIX)
long = ctypes.create_string_buffer(b"\\x01\\x00" + b"/tmp/" + b"x" * 200, 256)
for args in ((s.fileno(), long, 128), (s.fileno(), long, 4096), (s.fileno(), None, 110), (0, long, 110)):
    print(errno.errorcode[ctypes.get_errno()] if libc.connect(*args) else "connected")
"""
    result = await run(code, "python3")
    assert result.text() == "EINVAL\nEINVAL\nEFAULT\nENOTSOCK\n"
    result = await run("echo served on")
    assert result.text() == "served on\n"


async def test_a_program_cannot_take_over_the_supervision_of_its_connect_calls(run):
    # A filter of its own with a listener would be asked before the init's, and could answer
    # "continue": the kernel would then connect a Unix socket to any path. seccomp(2) refuses it.
    code = (
        "class Prog(ctypes.Structure):\n"
        "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
        "allow = ctypes.create_string_buffer(b'\\x06\\x00\\x00\\x00\\x00\\x00\\xff\\x7f')\n"
        "prog = Prog(1, ctypes.addressof(allow))\n"
    )
    nr = {"x86_64": 317, "aarch64": 277}[platform.machine()]
    result = await run(errno_of(code + syscall(nr, "1", "8", "ctypes.byref(prog)")), "python3")
    assert result.text() == ("EPERM\n" if UNIX_SOCKETS else "ok\n")  # without the init's listener, nothing to take over


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a virtualenv (its parent becomes the cwd)")
async def test_the_python_that_runs_the_jail_is_read_only_even_inside_a_writable_cwd(tmp_path):
    # A session whose cwd holds ollie's own virtualenv (or pyenv under $HOME) could otherwise
    # rewrite the interpreter or library the next jail starts with, outside the sandbox.
    prefix = Path(sys.prefix)
    server = execute.factory(str(prefix.parent))()
    marker, other = prefix / "bin" / f"planted-{os.getpid()}", prefix / f"planted-{os.getpid()}"
    code = f"echo x > {marker}; echo x > {other}"  # (a real attack would edit bin/python or the library)
    try:
        ctx = CallContext(cwd=str(prefix.parent))
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        assert result.text().count("Read-only file system") == 2, result.text()
        assert not marker.exists() and not other.exists()
    finally:
        marker.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
        await server.close()


async def test_the_users_site_packages_is_read_only_even_in_a_cwd_of_home(home, monkeypatch):
    # Under a Python that reads the user's site-packages (`pip install --user` on a system Python),
    # a .pth planted there runs in the user's next ollie, outside the sandbox; the directory is
    # made first if missing, so that code working in $HOME cannot make it.
    # The `ollie` script's directory too: first on the running ollie's import path.
    user_site, scripts = home / ".local" / "lib" / "python3" / "site-packages", home / ".local" / "bin"
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "USER_SITE", str(user_site))
    monkeypatch.setattr(site, "USER_BASE", str(home / ".local"))
    server = execute.factory(str(home))()
    code = (
        "mkdir -p .local/lib/python3/site-packages .local/bin/pygments; echo 'import os' > "
        ".local/lib/python3/site-packages/x.pth; echo 'import os' > .local/bin/pygments/__init__.py"
    )
    try:
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, CallContext(cwd=str(home)))
        assert result.text().count("Read-only file system") == 2, result.text()
        assert user_site.is_dir() and not any(user_site.iterdir()) and scripts.is_dir() and not any(scripts.iterdir())
        monkeypatch.setattr(site, "ENABLE_USER_SITE", False)  # a virtualenv's Python: $HOME's to write
        server2 = execute.factory(str(home))()
        try:
            result = await server2.call_tool("execute_code", {"steps": [{"code": code}]}, CallContext(cwd=str(home)))
            assert not result.is_error and (user_site / "x.pth").exists(), result.text()
        finally:
            await server2.close()
    finally:
        await server.close()


async def test_uvs_cache_is_read_only_unless_granted_itself(home, tmp_path, monkeypatch):
    # uv installs packages as hard links into its cache: writable there, ollie's own packages
    # would be writable through it, whatever the virtualenv's mount says.
    cache = home / ".cache" / "uv"
    cache.mkdir(parents=True)
    monkeypatch.setenv("UV_CACHE_DIR", str(cache))
    write_policy("uv", f"filesystem:\n  rw: [{cache}]\n")
    server = execute.factory(str(home))()
    ctx = CallContext(cwd=str(home), policies=("default", "uv"))
    try:
        result = await server.call_tool("execute_code", {"steps": [{"code": "echo x > .cache/uv/planted"}]}, ctx)
        assert "Read-only file system" in result.text() and not (cache / "planted").exists()
        call = {"steps": [{"code": "echo x > .cache/uv/allowed"}], "sandbox": "uv"}
        result = await server.call_tool("execute_code", call, ctx)
        assert not result.is_error and (cache / "allowed").exists()
    finally:
        await server.close()


async def test_without_granted_network_a_jail_has_no_interfaces(run):
    result = await run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert result.text() == "lo\n"


async def test_granted_ports_allow_tcp_only_and_unrestricted_allows_udp(run):
    write_policy("net", "network:\n  connect_tcp: [443]\n")
    udp = errno_of("socket.socket(socket.AF_INET, socket.SOCK_DGRAM)")
    mptcp = errno_of("socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)")
    for code in (udp, mptcp):
        result = await run(code, "python3", sandbox="net")
        assert result.text() == "EACCES\n"
    write_policy("open", "network:\n  unrestricted: true\n")
    result = await run(udp, "python3", sandbox="open")
    assert result.text() == "ok\n"
    result = await run("tail -n +3 /proc/net/dev | wc -l", sandbox="open")
    assert int(result.text()) >= 1  # the host's interfaces


# ---- 3: hooks --------------------------------------------------------------------------------


@pytest.fixture
def project(home, tmp_path, monkeypatch):
    cwd = tmp_path / "project"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


async def hook_run(cfg: AgentConfig, cwd: Path, prompt: str = "go") -> tuple[str, list[str]]:
    """Run one turn with hooks; returns what the model was sent and the info events."""
    core, backend, _, events = await make_core([{"text": "ok"}], cfg=cfg)
    core.session.set_cwd(str(cwd))
    await core.submit(prompt)
    await core.close()
    return backend.requests[0][-1].content, [e.text for e in events if e.kind == "info"]


async def test_hooks_run_confined(project, home):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    cfg = AgentConfig(
        hooks={"preTurn": [f"env; touch written; cat {home}/.ssh/id_rsa; echo hi > /dev/tcp/127.0.0.1/{port}; exit 0"]}
    )
    with listener:
        sent, infos = await hook_run(cfg, project)
    assert API_KEY not in sent and "s3cr3t" not in sent and infos == []
    assert not (project / "written").exists()
    assert "OLLIE_PROMPT=go" in sent  # the payload still comes in


async def test_a_hook_file_the_agent_can_write_is_refused_unless_trusted(project):
    hook = project / "check-tool.sh"  # the README's example: the model can rewrite it
    hook.write_text("#!/bin/sh\necho checked\n")
    hook.chmod(0o755)
    sent, infos = await hook_run(AgentConfig(hooks={"preTurn": ["./check-tool.sh"]}), project)
    assert "checked" not in sent
    assert any(
        "check-tool.sh is a file that sandboxed code can write" in i and "trustWritableHooks" in i for i in infos
    )
    sent, infos = await hook_run(
        AgentConfig(hooks={"preTurn": ["./check-tool.sh"]}, trust_writable_hooks=True), project
    )
    assert "checked" in sent


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
async def test_a_planted_git_fsmonitor_runs_confined(project, home):
    # A hook as plain as `git status` runs whatever core.fsmonitor the agent wrote into .git/config.
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    loot = home / "loot"
    subprocess.run(
        ["git", "config", "core.fsmonitor", f"env > {loot}; env > {project}/loot; false"], cwd=project, check=True
    )
    await hook_run(AgentConfig(hooks={"preTurn": ["git status >/dev/null 2>&1; exit 0"]}), project)
    assert not loot.exists() and not (project / "loot").exists()


async def test_unsandboxed_hooks_are_an_explicit_opt_out(project):
    cfg = parse_agent("x", {"hooks": {"preTurn": "touch written"}, "hookSandbox": False})
    await hook_run(cfg, project)
    assert (project / "written").exists()
    with pytest.raises(ConfigError, match="hookSandbox is a sandbox policy name, or false"):
        parse_agent("x", {"hookSandbox": True})


# ---- 4: ollie's own files --------------------------------------------------------------------


def stored_session_in_home(home: Path, monkeypatch) -> Path:
    """ollie's data directory in $HOME (as by default), holding a stored session with a secret."""
    data = home / ".local" / "share" / "ollie"
    (data / "sessions" / "s1").mkdir(parents=True)
    (data / "sessions" / "s1" / "history.jsonl").write_text(SECRET)
    monkeypatch.setenv("OLLIE_DATA_PATH", str(data))
    return data


async def test_ollies_files_are_hidden_even_inside_a_granted_cwd(home, tmp_path, monkeypatch):
    # A session whose cwd is $HOME can write all of it, but not ollie's configuration (API keys,
    # agent configs whose hooks run outside), its stored sessions, nor the server's socket.
    cfg, data = Path(os.environ["OLLIE_CFG_PATH"]), stored_session_in_home(home, monkeypatch)
    (cfg / "agents").mkdir()
    (cfg / "agents" / "default.json").write_text("{}")
    server = execute.factory(str(home))()
    ctx = CallContext(cwd=str(home), tmpdir=str(tmp_path))
    code = (
        f"cat {cfg}/env; ls {cfg}; echo '{{\"hooks\": {{}}}}' > {cfg}/agents/default.json; "
        f"cat {data}/sessions/s1/history.jsonl; echo ok > {home}/notes.txt"
    )
    result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
    await server.close()
    assert API_KEY not in result.text() and "s3cr3t" not in result.text()
    assert (cfg / "agents" / "default.json").read_text() == "{}"
    assert (home / "notes.txt").read_text() == "ok\n"  # the rest of the cwd is writable


async def test_renaming_a_parent_of_ollies_files_does_not_unhide_them(home, tmp_path):
    # The jail hides by path: were `.config` renamed, the next jail would not find ollie's
    # configuration to hide. The second call runs in a new jail (a new server's).
    cfg = Path(os.environ["OLLIE_CFG_PATH"])
    server = execute.factory(str(home))()
    ctx = CallContext(cwd=str(home), tmpdir=str(tmp_path))
    moves = "mv .config .moved; mv .config/ollie .config/moved; mv .ssh .ssh2"
    result = await server.call_tool("execute_code", {"steps": [{"code": moves}], "timeout": 1}, ctx)
    await server.close()
    assert result.text().count("Device or resource busy") == 2, result.text()
    assert (cfg / "env").exists() and (home / ".ssh2").exists()  # other directories move as ever
    server = execute.factory(str(home))()
    result = await server.call_tool("execute_code", {"steps": [{"code": f"cat {cfg}/env .moved/ollie/env"}]}, ctx)
    assert API_KEY not in result.text() and "the sandbox" not in result.text()
    await server.close()


async def test_the_file_servers_mount_is_hidden_wherever_it_is(fs_server):
    # Through the mount, `a/` holds agent configs (whose hooks may run unsandboxed) and `s/` every
    # session: a jail hides every mount of ollie's file server, not only the one at $OLLIE.
    assert (fs_server.mnt / "ctl").exists()
    server = execute.factory(str(fs_server.root))()
    ctx = CallContext(cwd=str(fs_server.root))
    result = await server.call_tool("execute_code", {"steps": [{"code": f"ls -A {fs_server.mnt}; echo listed"}]}, ctx)
    await server.close()
    assert result.text() == "listed\n"


@pytest.mark.parametrize("below", ["", "sub", "missing/deeper"])
def test_a_replaceable_symlink_to_ollies_files_is_refused(home, tmp_path, monkeypatch, below):
    # With ~/.config/ollie a symlink (dotfile managers make them) and the session in $HOME, sandboxed
    # code could point it elsewhere, and a later session would read its configuration from there:
    # the link the path itself, a directory above it, or above a part not made yet.
    real = home / "dotfiles" / "ollie"
    (real / "sub").mkdir(parents=True)
    link = home / ".config" / "linked"
    link.symlink_to(real)
    monkeypatch.setenv("OLLIE_CFG_PATH", str(link / below) if below else str(link))
    policy = sandbox.load_policy("default", str(home), "")
    with pytest.raises(sandbox.SandboxError, match=f"reached through the symlink {link}.*{real}"):
        sandbox.Sandbox(policy)
    policy = sandbox.load_policy("default", str(tmp_path), "")  # a cwd that cannot touch the link
    jails = sandbox.Jails()

    async def start_and_close():
        await jails.get(sandbox.Sandbox(policy).policy)
        await jails.close()

    asyncio.run(start_and_close())


async def test_a_running_jail_takes_no_ruleset_whose_code_could_replace_a_link_to_ollies_data(
    home, tmp_path, monkeypatch
):
    """ollie's data behind a linked ~/.local/share, and a session whose jail runs: its cwd then
    becomes $HOME (`/cwd ~`). The check was made only when a jail started, so the later ruleset's
    code replaced the link and the next ollie read its data, and ran its jails' native init, from
    the code's directory."""
    real = home / "dots" / "share"
    real.mkdir(parents=True)
    (home / ".local").mkdir()
    (home / ".local" / "share").symlink_to(real)
    monkeypatch.setenv("OLLIE_DATA_PATH", str(home / ".local" / "share" / "ollie"))
    work = home / "work"
    work.mkdir()
    server = execute.factory(str(work))()
    swap = f"rm {home}/.local/share && ln -s {work} {home}/.local/share && echo swapped"
    try:
        first = await server.call_tool("execute_code", {"steps": [{"code": "echo ran"}]}, CallContext(cwd=str(work)))
        assert (first.is_error, first.text()) == (False, "ran\n")
        after = await server.call_tool("execute_code", {"steps": [{"code": swap}]}, CallContext(cwd=str(home)))
    finally:
        await server.close()
    assert after.is_error and f"reached through the symlink {home}/.local/share" in after.text(), after.text()
    assert os.readlink(home / ".local" / "share") == str(real)


async def test_tool_scripts_stay_visible_inside_the_hidden_configuration(run, home):
    tools = Path(os.environ["OLLIE_TOOLS_PATH"])
    (tools / "hello").write_text("#!/bin/sh\necho hello from $0\n")
    (tools / "hello").chmod(0o755)
    result = await run(f"cat {tools}/hello > /dev/null && echo readable; echo x > {tools}/hello")
    assert "readable" in result.text() and "Read-only file system" in result.text()
    assert (tools / "hello").read_text().startswith("#!/bin/sh")


# ---- 7, 8, 9: other processes, terminals, IPC, keys ------------------------------------------


async def test_processes_outside_the_jail_are_out_of_reach(run):
    me = os.getpid()
    result = await run(
        f"prlimit --pid {me} --cpu=1; prlimit --pid 1 --cpu=1:1; cat /proc/{me}/cmdline; ls /proc | grep -c '^[0-9]'"
    )
    text = result.text()
    assert text.count("Operation not permitted") == 2 and f"/proc/{me}/cmdline: No such file" in text
    assert int(text.split()[-1]) < 10  # the jail's own processes only
    assert open(f"/proc/{me}/limits").read().count("unlimited") > 3  # the server's limits untouched


async def test_a_stage_cannot_kill_or_stop_what_started_it(run):
    # Its parent is the jail's PID 1, outside every program's Landlock domain (and the PID
    # namespace's init): killing or stopping it does nothing, and the stage runs on.
    result = await run("echo $PPID; kill -9 $PPID; kill -STOP $PPID; kill -9 1; sleep 0.3; echo survived", timeout=5)
    assert not result.is_error and result.text().startswith("1\n") and result.text().endswith("survived\n"), (
        result.text()
    )
    result = await run("echo next")
    assert result.text() == "next\n"


def _pid_one_of(pid: int) -> int:
    """The host's pid of the jail's PID 1 above a stage's process `pid` (the native init, or
    jaild.py where no C compiler built it)."""
    while not any(
        name in Path(f"/proc/{pid}/cmdline").read_bytes() for name in (b"ollie-jail-init", b"The jail helper")
    ):
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return pid


async def test_a_jail_whose_pid_1_used_its_cpu_limit_ends_after_its_stages(run):
    # PID 1 carries the limits its programs inherit, its own CPU time counted: at the soft limit
    # (SIGXCPU, sent here from outside) it tells ollie, lets its stages end, then exits; the next
    # call starts in a new jail.
    call = asyncio.create_task(run("sleep 4711.75; echo slept", timeout=2))
    pid_one = 0
    for _ in range(200):
        if found := alive("4711.75"):
            pid_one = _pid_one_of(found[0])
            os.kill(pid_one, signal.SIGXCPU)
            break
        await asyncio.sleep(0.025)
    try:
        result = await call
        assert pid_one and "execution timeout" in result.text(), result.text()  # the stage ran on to its end
        for _ in range(200):
            if not Path(f"/proc/{pid_one}").exists() or "Z" in Path(f"/proc/{pid_one}/stat").read_text().split()[2]:
                break
            await asyncio.sleep(0.025)
        else:
            raise AssertionError("PID 1 did not end")
    finally:
        if pid_one and Path(f"/proc/{pid_one}").exists():
            os.kill(pid_one, signal.SIGKILL)
    result = await run("echo next")
    assert result.text() == "next\n"


async def test_a_jail_that_stops_answering_is_restarted(run):
    # No program can stop its jail's PID 1 (above); should it stop all the same (here from outside),
    # the stage's exit goes unreported: the call ends at its timeout, the jail is replaced.
    call = asyncio.create_task(run("sleep 4711.25", timeout=1))
    pid_one = 0
    try:
        for _ in range(200):
            if found := alive("4711.25"):
                pid_one = _pid_one_of(found[0])
                os.kill(pid_one, signal.SIGSTOP)
                break
            await asyncio.sleep(0.025)
        result = await call
    finally:
        if pid_one:
            os.kill(pid_one, signal.SIGKILL)  # the PID namespace's init: everything in the jail dies
    assert pid_one and result.is_error and "the session's sandbox was restarted" in result.text(), result.text()
    result = await run("echo next")
    assert result.text() == "next\n"


async def test_a_stage_holds_only_its_standard_streams(run):
    # Any other descriptor would be the jail's: a channel's socket lets a program answer for PID 1.
    code = "import os\nfds = os.listdir('/proc/self/fd')  # the listing's own fd is closed by now\nprint(sorted(fds))"
    result = await run(code, "python3")
    assert result.text() == "['0', '1', '2', '3']\n"
    code = "import os\nprint([os.readlink(f'/proc/self/fd/{n}') for n in (0, 1, 2)])"
    result = await run(code, "python3")
    assert "socket:" not in result.text() and "pipe:" in result.text()


async def test_garbage_from_a_spawner_ends_its_channel_not_ollie():
    from ollie.sandbox import jail as _jail

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel = _jail._Channel(ours)
    stage = channel.stages[1] = _jail.Stage(channel, 1)
    with theirs:
        theirs.send(b"[" * 60000)  # nested past the JSON decoder's recursion limit
        with pytest.raises(_jail.JailError, match="sent garbage"):
            await asyncio.wait_for(stage.exited, 5)
    assert channel.gone.done()
    channel.close()


async def test_a_hook_whose_jail_stops_answering_cannot_hang_the_session(project, monkeypatch):
    monkeypatch.setattr(hooks, "TIMEOUT", 0.5)
    sent, infos = await hook_run(AgentConfig(hooks={"preTurn": ["kill -STOP $PPID; sleep 30"]}), project)
    assert any("timed out" in i for i in infos)
    sent, infos = await hook_run(AgentConfig(hooks={"preTurn": ["echo after"]}), project)
    assert "after" in sent


async def test_the_jails_pid_1_cannot_be_traced_or_read(run):
    result = await run(
        "readlink /proc/$PPID/fd/3; cat /proc/$PPID/fd/4; cat /proc/$PPID/environ; cat /proc/$PPID/maps | head -1"
    )
    assert result.text().count("Permission denied") >= 3 and "socket:" not in result.text()


async def test_no_thread_of_the_jails_pid_1_can_be_traced_or_read(run):
    # PID 1 holds the jail's capabilities and is in no Landlock domain: were it (or, where it stays
    # Python, the thread per ruleset that starts stages, in that ruleset's domain) traceable, a
    # program could take it over.
    code = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
tids = sorted(map(int, os.listdir('/proc/1/task')))
print(len(tids) >= 1)
for tid in tids:
    attach = libc.ptrace(16, tid, 0, 0)  # PTRACE_ATTACH
    print(tid, attach, os.strerror(ctypes.get_errno()))
    try:
        open(f'/proc/1/task/{tid}/mem', 'rb').read(1)
    except OSError as e:
        print(e.strerror)
"""
    result = await run(code, "python3")
    lines = result.text().splitlines()
    assert lines[0] == "True", result.text()
    assert all(" -1 " in line for line in lines[1::2]), result.text()
    assert all(line in ("Permission denied", "Operation not permitted") for line in lines[2::2]), result.text()


async def test_a_process_cannot_join_another_stages_group(run):
    # Were it to, it would live until that stage ends, not its own.
    waiting = "echo $$ > group; while [ ! -e joined ]; do sleep 0.05; done"
    join = (
        'while [ ! -s group ]; do sleep 0.05; done; python3 -c "import os\n'
        "try:\n os.setpgid(0, int(open('group').read()))\n print('joined')\n"
        'except OSError as e:\n print(e.strerror)"; touch joined'
    )
    call = {"steps": [{"parallel": [{"code": waiting}, {"code": join}]}], "timeout": 10}
    result = await run.server.call_tool("execute_code", call, run.ctx)
    assert result.text() == "Operation not permitted\n", result.text()


async def test_a_process_may_still_lead_a_group_or_a_session_of_its_own(run):
    # What `timeout`, Python's process_group=0 and start_new_session do: joins alone are refused.
    code = (
        'timeout 5 true && python3 -c "import os, subprocess\n'
        "os.setpgid(0, 0); print(os.getpgrp() == os.getpid())\n"
        "p = subprocess.run(['sh', '-c', 'ps -o pgid= -p $$'], process_group=0, capture_output=True, text=True)\n"
        "print(p.returncode)\n"
        "q = subprocess.run(['sh', '-c', 'true'], start_new_session=True); print(q.returncode)\n"
        '"'
    )
    result = await run(code)
    assert result.text().splitlines() == ["True", "0", "0"], result.text()


async def test_prlimit_on_itself_still_works(run):
    result = await run("ulimit -n 64 && ulimit -n")
    assert result.text() == "64\n"


async def test_the_users_terminals_are_out_of_reach(run):
    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        result = await run(f"echo injected > {name}; ls /dev/pts")
        assert "Permission denied" in result.text() and result.text().split()[-1] == "ptmx"  # a new instance
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 100)
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.skipif(shutil.which("ipcmk") is None, reason="needs util-linux's ipcmk")
async def test_sysv_ipc_and_keyrings_are_out_of_reach(run):
    made = subprocess.run(["ipcmk", "-M", "4096"], capture_output=True, text=True, check=True).stdout
    shm_id = made.split()[-1]
    try:
        result = await run(f"ipcs -m | grep -c ' {shm_id} ' ; true")
        assert result.text() == "0\n"
    finally:
        subprocess.run(["ipcrm", "-m", shm_id], check=True)
    add_key = syscall(
        248 if os.uname().machine == "x86_64" else 217, "b'user'", "b'k'", "b'v'", "1", "ctypes.c_int(-3)"
    )
    result = await run(errno_of(add_key), "python3")
    assert result.text() == "EPERM\n"


# ---- 10, 11: limits and the choice of policy --------------------------------------------------


SMALL = (
    "limits:\n  processes: 300\n  memory: 256M\n  file_size: 1M\n  timeout: 5\n  parallel: 4\n"
    "  tmpdir: 1M\n  output: 64K\n"
)


async def test_a_fork_bomb_is_bounded(run):
    write_policy("small", SMALL)
    code = (
        "import os, time\nn = 0\ntry:\n while n < 5000:\n  if os.fork() == 0:\n   time.sleep(60.5)\n"
        "   os._exit(0)\n  n += 1\nexcept OSError as e:\n print('stopped', n < 300, e.strerror)"
    )
    result = await run(code, "python3", sandbox="small")
    assert result.text() == "stopped True Resource temporarily unavailable\n"
    assert alive("sleep(60.5)") == []  # and none of them outlived the stage


async def test_memory_file_size_and_tmpdir_are_bounded(run, tmp_path):
    write_policy("small", SMALL)
    result = await run("bytearray(512 << 20)", "python3", sandbox="small")
    assert result.is_error and "MemoryError" in result.text()
    result = await run("head -c 2M /dev/zero > big", sandbox="small")
    assert result.is_error and (tmp_path / "cwd" / "big").stat().st_size <= 1 << 20
    # the shell's 153 (SIGXFSZ) names the setting: "File size limit exceeded" alone did not
    assert "(a file reached limits.file_size of the sandbox policy: 1 MiB)" in result.text(), result.text()
    result = await run("dd if=/dev/zero of=$TMPDIR/big bs=64k count=64 2>&1; ls $TMPDIR")
    assert "No space left" not in result.text()  # the default allows 1 GiB
    result = await run("for i in 1 2 3; do head -c 512K /dev/zero > $TMPDIR/part$i || exit 1; done", sandbox="small")
    assert result.is_error and "No space left on device" in result.text()


async def test_cpu_time_is_bounded(run):
    write_policy("small", "limits:\n  cpu: 1\n")
    result = await run("while :; do :; done", sandbox="small", timeout=20)
    assert (
        result.is_error and "killed by SIGXCPU (a process used limits.cpu of the sandbox policy: 1 s" in result.text()
    )


async def test_call_shape_is_bounded(run):
    write_policy("small", SMALL)
    result = await run("true", timeout=1e300)
    assert result.is_error and "timeout: at most 600 seconds" in result.text()
    result = await run("true", timeout=601)
    assert result.is_error and "at most 600 seconds (limits.timeout of sandbox policy 'default')" in result.text()
    result = await run("true", timeout=6, sandbox="small")
    assert result.is_error and "at most 5 seconds" in result.text()
    call = {"steps": [{"parallel": [{"code": "touch ran"}] * 5}], "sandbox": "small"}
    result = await run.server.call_tool("execute_code", call, run.ctx)
    assert result.is_error and "5 branches; the sandbox policy allows at most 4 (limits.parallel)" in result.text()
    result = await run("yes", sandbox="small")
    assert result.is_error and "exceeded 64 KiB (limits.output)" in result.text()


async def test_the_model_picks_only_the_policies_its_agent_allows(home, tmp_path):
    write_policy("wide", "filesystem:\n  rw: [/var/tmp]\n")
    server = execute.factory(str(tmp_path))()
    call = {"steps": [{"code": "touch ran"}], "sandbox": "wide"}
    result = await server.call_tool("execute_code", call, CallContext(cwd=str(tmp_path)))
    assert result.is_error and "policy 'wide' is not allowed for this agent; it may use default" in result.text()
    assert not (tmp_path / "ran").exists()
    result = await server.call_tool("execute_code", call, CallContext(cwd=str(tmp_path), policies=("default", "wide")))
    assert not result.is_error and (tmp_path / "ran").exists()
    await server.close()
    core, *_ = await make_core([], cfg=parse_agent("x", {"sandboxes": ["default", "wide"]}))
    assert core.call_context().policies == ("default", "wide")
    await core.close()
    with pytest.raises(ConfigError, match="sandboxes must be a non-empty list of sandbox policy names"):
        parse_agent("x", {"sandboxes": ["../etc"]})


# ---- what still works --------------------------------------------------------------------------


async def test_pseudo_terminals_and_expect_still_work(run):
    result = await run('spawn sh -c "tty; echo from-pty"\nexpect eof', "expect")
    assert not result.is_error and "/dev/pts/" in result.text() and "from-pty" in result.text()


async def test_the_sessions_saved_results_are_readable_not_writable(run, tmp_path):
    results = tmp_path / "session-tmp" / "results"
    results.mkdir()
    (results / "result-1.txt").write_text("the whole result")
    result = await run(f"cat {results}/result-1.txt; echo x > {results}/result-1.txt")
    assert "the whole result" in result.text() and "Read-only file system" in result.text()


# ---- without user namespaces ------------------------------------------------------------------

NO_NAMESPACES = r"""
import asyncio, ctypes, os, platform, struct, sys
# A seccomp filter that refuses unshare(2) with EPERM, as a kernel without user namespaces would.
nr = {"x86_64": 272, "aarch64": 97}[platform.machine()]
code = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7FFF0000)]
prog = b"".join(struct.pack("<HBBI", *c) for c in code)
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.c_void_p)]
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(Fprog(len(code), ctypes.addressof(buf)))) == 0
from ollie import sandbox
from ollie.tools import CallContext, execute
async def main():
    cwd = sys.argv[1]
    server = execute.factory(cwd)()
    ctx = CallContext(cwd=cwd, tmpdir=sys.argv[2])
    bind = "python3 -c 'import socket; socket.create_server((\"127.0.0.1\", 0)); print(\"bound\")'"
    codes = ("echo confined", f"echo confined; cat {sys.argv[3]}", f"echo confined; {bind}")
    if sys.argv[4:] == ["as if no seccomp filter were built here"]:
        server._seccomp_told = False  # its notice comes first, as on a machine without one
        codes = (f"echo confined; {bind}",)
    for code in codes:
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        print(repr(result.text()), result.is_error)
    await server.close()
asyncio.run(main())
"""


def test_without_namespaces_the_sandbox_refuses_unless_best_effort_and_says_so(home, tmp_path):
    cwd, scratch = tmp_path / "cwd", tmp_path / "scratch"
    cwd.mkdir()
    scratch.mkdir()
    argv = [sys.executable, "-c", NO_NAMESPACES, str(cwd), str(scratch), str(home / ".ssh" / "id_rsa")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=os.environ).stdout
    first = out.splitlines()[0]
    assert "the sandbox cannot isolate this: namespaces are refused" in first and "best_effort" in first
    assert "confined" not in first.split("best_effort")[-1]  # nothing ran
    write_policy(None, "general:\n  best_effort: true\n")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=os.environ).stdout
    first, second, third = out.splitlines()
    assert "[sandbox: namespaces are refused" in first and "Landlock and seccomp alone" in first
    assert "confined" in first and first.endswith("False")
    assert "confined" in second and "Permission denied" in second and "s3cr3t" not in second  # Landlock holds
    # On the host's network (no namespace of its own), no port is the code's to serve on.
    assert "confined" in third and "PermissionError" in third and "bound" not in third.replace("confined", "")


def test_without_namespaces_the_first_call_has_every_port_refused_whatever_else_it_is_told(home, tmp_path):
    """The first call of a session whose jail found namespaces refused ran under the sandbox made
    for a network of the jail's own (TCP free) when another notice came first (no seccomp filter
    for the machine): on the host's network, every port open."""
    cwd, scratch = tmp_path / "cwd", tmp_path / "scratch"
    cwd.mkdir()
    scratch.mkdir()
    write_policy(None, "general:\n  best_effort: true\n")
    flag = "as if no seccomp filter were built here"
    argv = [sys.executable, "-c", NO_NAMESPACES, str(cwd), str(scratch), str(home / "x"), flag]
    [first] = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=os.environ).stdout.splitlines()
    assert "namespaces are refused" in first and "no seccomp filter" in first, first
    assert "PermissionError" in first and "bound" not in first.replace("confined", ""), first


async def test_a_cwd_that_another_session_swapped_for_a_symlink_is_refused(home, tmp_path):
    # Session X works in /p, session Y in /p/sub. X's code can replace sub with a link to anywhere;
    # Y's next sandbox (after a restart, a policy change) must not grant where the link points.
    p, precious = tmp_path / "p", tmp_path / "precious"
    (p / "sub").mkdir(parents=True)
    precious.mkdir()
    (precious / "file").write_text("original\n")
    (tmp_path / "tmp-x").mkdir()
    (tmp_path / "tmp-y").mkdir()

    async def stage(cwd, tmpdir, code):
        server = execute.factory(str(cwd))()  # a fresh server: a fresh sandbox, as after a restart
        ctx = CallContext(cwd=str(cwd), session_id=tmpdir.name, tmpdir=str(tmpdir))
        try:
            return await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        finally:
            await server.close()

    assert (
        "swapped"
        in (await stage(p, tmp_path / "tmp-x", "mv sub sub.old && ln -s ../precious sub && echo swapped")).text()
    )
    result = await stage(p / "sub", tmp_path / "tmp-y", "echo pwned > file; echo rc=$?")
    assert result.is_error and f"is reached through a symlink ({p}/sub)" in result.text()
    assert (precious / "file").read_text() == "original\n"


async def test_the_memory_and_the_plans_are_the_only_data_shown_and_writable(home, tmp_path, monkeypatch):
    # Every session's code keeps memories and plans ($OLLIE_MEMORY_DIR, $OLLIE_PLANS_DIR, m/ and pl/
    # on the mount); the rest of ollie's data (stored sessions, transcripts) stays hidden, even from
    # a session whose cwd holds it.
    data = stored_session_in_home(home, monkeypatch)
    server = execute.factory(str(home))()
    ctx = CallContext(cwd=str(home), tmpdir=str(tmp_path))
    code = (
        'echo remembered > "$OLLIE_MEMORY_DIR/m.md" && echo planned > "$OLLIE_PLANS_DIR/p.md" && echo wrote; '
        f'cat {data}/sessions/s1/history.jsonl; ls -A {data}; ln -s {data}/sessions "$OLLIE_MEMORY_DIR/s"; '
        'cat "$OLLIE_MEMORY_DIR/s/s1/history.jsonl"'
    )
    result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
    await server.close()
    assert "wrote" in result.text() and "s3cr3t" not in result.text()
    assert (data / "memory" / "m.md").read_text() == "remembered\n"
    assert (data / "plans" / "p.md").read_text() == "planned\n"
    assert oct((data / "memory").stat().st_mode & 0o777) == "0o700"


async def test_a_link_one_session_plants_in_the_shared_dirs_leads_no_other_session_anywhere(home, tmp_path):
    # Session A cannot reach B's project; were a link A left in the plans followed by B's code (its
    # own task_complete, say), B would write A's words into B's project, a git hook for instance.
    proj_a, proj_b = tmp_path / "a", tmp_path / "b"
    for d in (proj_a, proj_b, tmp_path / "tmp-a", tmp_path / "tmp-b"):
        d.mkdir()

    async def stage(cwd, tmpdir, code):
        server = execute.factory(str(cwd))()
        ctx = CallContext(cwd=str(cwd), session_id=tmpdir.name, tmpdir=str(tmpdir))
        try:
            return await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        finally:
            await server.close()

    planted = f'ln -s {proj_b}/hook "$OLLIE_PLANS_DIR/plan.md" && ln -s {proj_b} "$OLLIE_MEMORY_DIR/b" && echo planted'
    assert "planted" in (await stage(proj_a, tmp_path / "tmp-a", planted)).text()
    result = await stage(
        proj_b,
        tmp_path / "tmp-b",
        'echo "#!/bin/sh" > "$OLLIE_PLANS_DIR/plan.md"; echo x > "$OLLIE_MEMORY_DIR/b/hook2"; '
        'ls "$OLLIE_MEMORY_DIR/b/"',
    )
    assert "Too many levels of symbolic links" in result.text()
    assert sorted(os.listdir(proj_b)) == []


async def test_a_linked_virtualenv_is_read_only_whole_and_a_link_leading_out_of_it_refused(home, tmp_path):
    """Red-team passes, stop 57: a wheel's data files are uv's hard links too (ipykernel's
    `share/jupyter/kernels/python3/kernel.json`, whose argv Jupyter runs in your other projects),
    and were writable beside the read-only `lib`; and code that moved `lib/python3.11` aside and
    linked it back had your next `uv pip install` link the packages where `lib` was not kept
    (kept there, code could point the link elsewhere for the next session)."""
    store = home / ".cache" / "store"
    store.mkdir(parents=True)
    for name in ("METADATA", "kernel.json", "pkg.py"):
        (store / name).write_text(f"{name} from the store\n")
    cwd = home / "work" / "project"
    (cwd / ".venv" / "share" / "kernels").mkdir(parents=True)
    os.link(store / "kernel.json", cwd / ".venv" / "share" / "kernels" / "kernel.json")
    site = cwd / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    os.link(store / "METADATA", site / "pkg-1.0.dist-info" / "METADATA")

    async def run(code: str):
        server = execute.factory(str(cwd))()
        try:
            return await server.call_tool("execute_code", {"steps": [{"code": code}]}, CallContext(cwd=str(cwd)))
        finally:
            await server.close()

    tried = await run(
        "{ echo PLANTED >> .venv/share/kernels/kernel.json; } 2>&1 | grep -o 'Read-only file system'; "
        "echo mine > own.txt && echo writable"
    )
    assert tried.text() == "Read-only file system\nwritable\n", tried.text()
    # code moves lib/python3.11 aside and links it back; your install then links through it
    (site.parent).rename(cwd / "stash")
    site.parent.symlink_to("../../stash")
    os.link(store / "pkg.py", site / "pkg.py")
    refused = await run("echo PLANTED >> stash/site-packages/pkg.py")
    assert refused.is_error and "the sandbox cannot keep a shared store's links read-only here" in refused.text()
    assert f"holds a symlink leading out of it ({cwd}/.venv/lib/python3.11 -> {cwd}/stash)" in refused.text()
    assert "PLANTED" not in "".join(f.read_text() for f in store.iterdir())


async def test_installs_hard_linked_from_a_shared_store_are_read_only_in_the_jail(home, tmp_path):
    """uv installs a virtualenv's packages as hard links from its cache, pnpm a project's from its
    store: written through the cwd's name, a file changed in every other virtualenv, `uv tool`
    (ollie's own among them) and pnpm project linking it, run outside the sandbox. Those stay
    read-only; a virtualenv of copies, and node_modules around .pnpm (vite's cache), do not."""
    store = home / ".cache" / "store"
    store.mkdir(parents=True)
    (store / "pkg.py").write_text("X = 'from the store'\n")
    (store / "dep.js").write_text("module.exports = 1\n")
    (store / "METADATA").write_text("Name: pkg\n")
    cwd = home / "work" / "project"
    site = cwd / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    os.link(store / "pkg.py", site / "pkg.py")
    os.link(store / "METADATA", site / "pkg-1.0.dist-info" / "METADATA")
    # what a red-team pass did to hide them: pyvenv.cfg a link (Python follows it, a check of it
    # did not), and a crowd of entries in site-packages ahead of the linked ones (a sample missed them)
    (cwd / ".venv" / "real.cfg").write_text("home = /usr/bin\nuv = 0.5.0\n")
    (cwd / ".venv" / "pyvenv.cfg").symlink_to("real.cfg")
    for n in range(200):
        (site / f"aaa{n}").mkdir()
    pnpm = cwd / "node_modules" / ".pnpm" / "dep@1.0.0" / "node_modules" / "dep"
    pnpm.mkdir(parents=True)
    os.link(store / "dep.js", pnpm / "index.js")
    copies = cwd / "venv" / "lib" / "python3.11" / "site-packages"
    (copies / "own-1.0.dist-info").mkdir(parents=True)
    (copies / "own-1.0.dist-info" / "METADATA").write_text("Name: own\n")
    (cwd / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (copies / "own.py").write_text("X = 1\n")
    code = (
        f"PYTHONPATH={site} python3 -c 'import pkg; print(pkg.X)'; "
        f"for f in {site}/pkg.py {pnpm}/index.js; do "
        "{ echo 'PLANTED' >> $f; } 2>&1 | grep -o 'Read-only file system'; done; "
        f"echo 'mine' >> {copies}/own.py && mkdir node_modules/.vite && echo writable"
    )
    server = execute.factory(str(cwd))()
    try:
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, CallContext(cwd=str(cwd)))
    finally:
        await server.close()
    assert result.text() == "from the store\nRead-only file system\nRead-only file system\nwritable\n", result.text()
    assert "PLANTED" not in (store / "pkg.py").read_text() + (store / "dep.js").read_text()
