"""Jails: helper processes that start sandboxed programs in fresh namespaces (private; no stable API).

A `Jail` is one process, its PID 1, forked by the fork server: `jaild.py`, which sets the jail up
and opens its first channel, then execs the native init (`jailinit.c`, compiled once with the
system's C compiler; without one, PID 1 stays Python). For each `Confinement` (a Landlock ruleset
with its seccomp program) it opens a channel, a socket of its own, and asks on it to start each
program, which a child of PID 1 confined that way execs: not a fork of ollie's (whose page tables
hold every SDK it imported). Everything a jail started dies when the jail is closed or its owner
exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import site
import socket
import subprocess
import sys
import threading
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..types import ConfigError
from .overlays import take_slot

# Read once: were the file inside a session's writable cwd (ollie's own checkout, a pipx install
# under $HOME), sandboxed code could rewrite what the next jail runs outside the sandbox.
_JAILD = Path(__file__).with_name("jaild.py").read_text()
_JAILINIT = Path(__file__).with_name("jailinit.c").read_bytes()
# Where the fork server's Python (and, in a jail, a ruleset's build) takes its standard library
# from: set, not searched for. Python's search looks for lib/python3X.zip in every directory above
# the interpreter, which a program may write (a pyenv under $HOME, a session working in $HOME).
_PYTHON_HOME = (
    sys.base_prefix if sys.base_prefix == sys.base_exec_prefix else f"{sys.base_prefix}:{sys.base_exec_prefix}"
)
_START_TIMEOUT = 10.0
_SEND_TIMEOUT = 10.0
_BUILD_TIMEOUT = 90.0  # a ruleset's setup (the native init gives its helper 60 s)
_INLINE = 32 << 10  # a spawn request's argv and env up to this size travel in its packet
_CHANNELS = 8  # idle channels kept per jail (one per ruleset: a session's cwd and policy)
MFD_EXEC = 0x10  # Linux 6.3: a memfd that may be executed whatever vm.memfd_noexec says
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/", "/opt/")  # where a `$CC` is taken from: the system's, read-only in jails

log = logging.getLogger(__name__)


class JailError(ConfigError):
    """The jail could not start, or lost a program (its helper died)."""


class SpawnError(JailError):
    """A program could not be started (not found, not executable, its cwd is gone)."""


class GrantChanged(JailError):
    """The jail found a grant changed since it was decided (a directory made again, a symlink
    put on its way): the sandbox is to be decided anew."""


@dataclass(frozen=True, slots=True)
class JailSetup:
    """What is fixed for a jail's life: its network, its PID budget, its private /tmp, what it
    hides, what it keeps read-only whatever a policy grants (the Python that runs the jail),
    where it mounts the view of ollie's files its owner serves ("": none) with the Landlock
    rights its programs get there, and the resource limits of its programs."""

    network: bool
    processes: int
    tmp_size: int
    hide: tuple[str, ...]
    protect: tuple[str, ...] = ()
    view: str = ""
    view_rights: int = 0
    rlimits: tuple[tuple[int, int, int], ...] = ()  # (resource, soft, hard): PID 1's, which its programs inherit


@dataclass(frozen=True, eq=False, slots=True)
class Confinement:
    """What the jail's thread for it applies to itself and so to every program it starts: a
    Landlock ruleset fd (-1: none) and a spec of JSON data (seccomp, jail_rules, expose; see jaild.py)."""

    ruleset: int
    spec: dict[str, Any]


class Stage:
    """A program started in a jail; `exited` resolves to its exit status (negative: the signal).
    Wait for it with `wait`, not by awaiting `exited`: cancelling that awaiter would cancel it."""

    def __init__(self, channel: _Channel, rid: int):
        self._channel, self._rid = channel, rid
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters: list[asyncio.Future[bool]] = []

    async def wait(self, timeout: float | None = None) -> bool:
        """Until the program exits (True) or `timeout` seconds pass (False); cancelling the caller
        leaves the stage alone. The exit wakes the caller directly: through a done callback of
        `exited` (asyncio.wait, shield) it took one more round of the loop, and a round of a loop
        serving 500 sessions lasts up to a hundred milliseconds."""
        if self.exited.done():
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout, _settle, waiter, False) if timeout is not None else None
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _exit(self, status: int | None, error: Exception | None = None) -> None:
        """The jail reported the exit (a status), or the program is lost (an error)."""
        if self.exited.done():
            return
        if error is None:
            self.exited.set_result(status)  # type: ignore[arg-type]
        else:
            self.exited.set_exception(error)
            self.exited.exception()  # retrieved: whoever waits on the stage reads it from the stage
        for waiter in self._waiters:
            _settle(waiter, True)
        self._waiters.clear()

    def kill(self) -> None:
        """SIGKILL the program's process group (the jail does it: the group is not visible here)."""
        if self._rid in self._channel.stages:  # until the jail reports the exit
            self._channel.post(b"kill\0%d\0" % self._rid)


class _Channel:
    """One end of a socket to the jail's PID 1: requests out, JSON replies in by id (a reply that
    is not well-formed ends the channel: a jail's words are checked, never trusted)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.stages: dict[int, Stage] = {}
        self.replies: dict[int, asyncio.Future[tuple[dict[str, Any], list[int]]]] = {}
        self.gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.retiring = False  # the jail said it will end (its PID 1 used its CPU limit): start no more in it
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._loop.add_reader(sock.fileno(), self._receive)

    def next_id(self) -> int:
        return next(self._ids)

    def post(self, message: bytes) -> None:
        try:
            self.sock.send(message)
        except BlockingIOError:
            self._loop.create_task(self.send(message, []))
        except OSError:
            pass  # gone, and what it ran with it

    async def send(self, message: dict[str, Any] | bytes, fds: list[int]) -> None:
        """Send a request: JSON on the control socket, a channel's NUL-separated fields (bytes)."""
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        while True:
            if self.gone.done():
                raise JailError(self.gone.result())
            try:
                socket.send_fds(self.sock, [data], fds)
                return
            except BlockingIOError:  # its queue is full: wait until it reads, dies, or plainly hangs
                writable = self._loop.create_future()
                self._loop.add_writer(self.sock.fileno(), writable.set_result, None)
                try:
                    done, _ = await asyncio.wait(
                        {writable, self.gone}, timeout=_SEND_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    self._loop.remove_writer(self.sock.fileno())
                if not done:
                    self.end("the sandbox helper does not take requests")
            except OSError as e:
                raise JailError(f"the sandbox helper is unreachable: {e.strerror}") from None

    def _receive(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 4)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        try:
            message = json.loads(data) if data else None
            rid = message["id"] if isinstance(message, dict) else None
        except (ValueError, KeyError, TypeError, RecursionError):
            message = rid = None
        if not isinstance(rid, int):
            for fd in fds:
                os.close(fd)
            self.end("the sandbox helper exited" if not data else "the sandbox helper sent garbage")
            return
        assert isinstance(message, dict)
        if rid == 0 and message.get("retire") is True:  # its PID 1 ends once its programs have
            self.retiring = True
        stage = self.stages.pop(rid, None) if ("status" in message or "error" in message) else None
        if stage is not None and not stage.exited.done():
            if isinstance(message.get("status"), int):
                stage._exit(message["status"])
            else:
                stage._exit(None, SpawnError(str(message.get("error"))))
        elif rid in self.replies and not self.replies[rid].done():
            self.replies[rid].set_result((message, fds))
            return
        for fd in fds:
            os.close(fd)

    def close(self) -> None:
        self.end("the sandbox helper was closed")
        self.sock.close()

    def end(self, why: str) -> None:
        if self.gone.done():
            return
        self._loop.remove_reader(self.sock.fileno())
        self.gone.set_result(why)
        for future in self.replies.values():
            if not future.done():
                future.set_result(({"error": why}, []))
        for stage in self.stages.values():
            stage._exit(None, JailError(why))
        self.stages.clear()


class Jail:
    def __init__(self, sock: socket.socket):
        self.namespaces_refused = ""  # why the jail runs without namespaces, when it does
        self.view_fd = -1  # the /dev/fuse descriptor of the jail's view, for its owner to serve (and close)
        self.view_error = ""  # why a view was asked for and not mounted
        self.has_view = False  # its view is mounted and served (set by its owner)
        self._control = _Channel(sock)
        self._channels: dict[Confinement, _Channel] = {}
        # The overlays' slots it holds, by the cwd's cache and the overlay's name: each slot's path
        # and the descriptor whose lock holds it until the jail is gone (`overlays.take_slot`).
        self._slots: dict[tuple[str, str], tuple[str, int]] = {}
        self._control.gone.add_done_callback(lambda _: self._free_slots())
        self.last_used = asyncio.get_running_loop().time()  # a program's start or end, the owner's get

    def touch(self) -> None:
        self.last_used = asyncio.get_running_loop().time()

    @property
    def busy(self) -> bool:
        """A program of it runs (a stage, a tool server)."""
        return any(s.stages for s in self._channels.values() if not s.gone.done())

    @classmethod
    async def start(cls, setup: JailSetup) -> Jail:
        """A new jail, forked by the fork server: at most `_STARTS` start at once on a loop (the
        others wait their turn, which the start's timeout does not count)."""
        async with _start_slot():
            return await cls._start(setup)

    @classmethod
    async def _start(cls, setup: JailSetup) -> Jail:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.send(json.dumps(asdict(setup)).encode())  # the jail's first read: to it alone
            await _FORK_SERVER.fork(theirs)
        except OSError as e:
            ours.close()
            raise JailError(f"cannot start the sandbox helper: {e.strerror}") from None
        finally:
            theirs.close()
        jail = cls(ours)
        hello = jail._control.replies[0] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                message, fds = await hello
        except TimeoutError:
            await jail.close()
            raise JailError(
                f"the sandbox did not start within {_START_TIMEOUT:g} s (is the machine overloaded?)"
            ) from None
        except BaseException:
            await jail.close()
            raise
        if not message.get("ready"):
            await jail.close()
            raise JailError(f"the sandbox could not set up its namespaces: {message.get('error')}{userns_hint()}")
        jail.namespaces_refused = message.get("namespaces", "")
        if fds and message.get("view") and len(fds) == 1:
            jail.view_fd = fds[0]
        else:
            for fd in fds:
                os.close(fd)
            jail.view_error = str(message.get("view_error") or "")
        return jail

    async def spawn(
        self,
        confinement: Confinement,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        *,
        stdin: int,
        stdout: int,
        stderr: int,
    ) -> Stage:
        """Start `argv` under `confinement`; the fds are sent to the jail, and the caller keeps
        (and closes) its own. A failure to start comes as the stage's exit: JailError (SpawnError
        at once for what no program can be given: a NUL byte, a variable's name with '=')."""
        if bad := next((f for f in [cwd, *argv, *env.values()] if "\0" in f), None):
            raise SpawnError(f"a NUL byte in {bad[:60]!r}")
        if bad := next((k for k in env if not k or "=" in k or "\0" in k), None):
            raise SpawnError(f"not a variable's name: {bad[:60]!r}")
        self.touch()
        channel = await self._channel(confinement)
        rid = channel.next_id()
        stage = channel.stages[rid] = Stage(channel, rid)
        stage.exited.add_done_callback(lambda _: self.touch())
        fields = [str(len(argv)), cwd, *argv, *(f"{k}={v}" for k, v in env.items())]
        body = b"".join(os.fsencode(f) + b"\0" for f in fields)
        request, fds = b"spawn\0%d\0" % rid, [stdin, stdout, stderr]
        if len(body) < _INLINE:
            request += body
        else:  # argv and env may not fit in a packet
            fds.append(_memfd(body))
        try:
            await channel.send(request, fds)
        except JailError:
            channel.stages.pop(rid, None)
            raise
        finally:
            if len(fds) > 3:
                os.close(fds[3])
        return stage

    async def confine(self, confinement: Confinement) -> None:
        """Set up `confinement`'s ruleset in the jail (its grants mounted), if it is not yet:
        JailError, GrantChanged if a grant is no longer what was decided."""
        await self._channel(confinement)

    async def _channel(self, confinement: Confinement) -> _Channel:
        channel = self._channels.get(confinement)
        if channel is not None and not channel.gone.done():
            return channel
        control = self._control
        rid = control.next_id()
        reply = control.replies[rid] = asyncio.get_running_loop().create_future()
        memfd = _memfd(json.dumps(confinement.spec).encode())
        names, fds = ["spec"], [memfd]
        if confinement.ruleset >= 0:
            names.append("ruleset")
            fds.append(confinement.ruleset)
        request = {"op": "channel", "id": rid, "fds": names, "slots": self.take_slots(confinement)}
        try:
            await control.send(request, fds)
        finally:
            os.close(memfd)
        try:
            async with asyncio.timeout(_BUILD_TIMEOUT):
                message, received = await reply
        except TimeoutError:
            control.end("the sandbox did not set up a ruleset in time")  # stuck: the next call starts another
            raise JailError("the sandbox did not set up a ruleset in time") from None
        finally:
            control.replies.pop(rid, None)
        if "error" in message or len(received) != 1:
            for fd in received:
                os.close(fd)
            why = f"the sandbox could not confine a program: {message.get('error')}"
            raise GrantChanged(why) if message.get("changed") else JailError(why)
        channel = self._channels[confinement] = _Channel(socket.socket(fileno=received[0]))
        idle = [c for c, s in self._channels.items() if c is not confinement and (s.gone.done() or not s.stages)]
        for old in idle[: max(0, len(self._channels) - _CHANNELS)]:
            self._channels.pop(old).close()  # the oldest idle ones: their rulesets are out of use
        return channel

    def take_slots(self, confinement: Confinement) -> list[list[Any] | None]:
        """The slot of each overlay of `confinement` in this jail, its path and identity (None where
        all are held): the jail's own from its first ruleset with that cache on."""
        slots: list[list[Any] | None] = []
        for name, _, _, _, _, cache in confinement.spec.get("overlays", ()):
            held = self._slots.get((cache, name))
            if held is None and not (self._control.gone.done() or self.namespaces_refused):
                held = take_slot(cache, name)
                if held is not None:
                    self._slots[cache, name] = held
            if held is None:
                slots.append(None)
            else:
                st = os.fstat(held[1])
                slots.append([held[0], st.st_dev, st.st_ino])
        return slots

    def _free_slots(self) -> None:
        for _, fd in self._slots.values():
            os.close(fd)
        self._slots.clear()

    async def close(self) -> None:
        """End the jail and everything in it; returns once the helper is gone."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        control = self._control
        if not control.gone.done():
            try:
                control.sock.shutdown(socket.SHUT_WR)  # PID 1 sees EOF, kills all, exits
            except OSError:
                pass
            try:
                await asyncio.wait_for(asyncio.shield(control.gone), 5)
            except TimeoutError:
                pass
        control.close()

    @property
    def running(self) -> bool:
        """Its PID 1 runs (it may be retiring: see `alive`)."""
        return not self._control.gone.done()

    @property
    def alive(self) -> bool:
        """Running, and taking new programs."""
        return not (self._control.gone.done() or self._control.retiring)


class _ForkServer:
    """The process that forks every jail of this ollie process: `jaild.py` run once, in a session
    of its own (a terminal's ^C is ollie's to handle, not its jails'), with an empty environment
    (it needs nothing of ollie's, least of all its API keys). It has imported what a jail needs,
    so a jail starts as a fork of a small process, not as a new interpreter; and it is asked by a
    packet sent without blocking, so a start costs ollie's loop no fork of its own (large) process.
    It holds nothing of any session: a request is the new jail's socket alone, and the jail reads
    its setup from that socket. It exits when ollie's end of its socket closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = 0  # the pid that started it: a forked ollie starts its own
        self._waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future[bool]] = (
            weakref.WeakKeyDictionary()
        )

    def _running(self) -> socket.socket | None:
        return self._sock if self._owner == os.getpid() else None

    def _ensure(self) -> socket.socket:
        """The server's socket, the server started first if it is not running (blocking: in a thread)."""
        with self._lock:
            if (sock := self._running()) is not None:
                return sock
            if self._process is not None and self._owner == os.getpid():
                self._process.kill()
                self._process.wait()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            native = _native_fds()
            args = [str(theirs.fileno())]
            if native:
                args += [str(native[0]), str(native[1]), sys.executable, str(native[2])]
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-s", "-S", "-P", "-c", _JAILD, *args],
                    env={"PYTHONHOME": _PYTHON_HOME},
                    stdin=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(), *native),
                    start_new_session=True,
                )
            except OSError:
                ours.close()
                raise
            finally:
                theirs.close()
                for fd in native:
                    os.close(fd)
            ours.setblocking(False)
            self._sock, self._owner = ours, os.getpid()
            return ours

    async def fork(self, jail: socket.socket) -> None:
        """Ask for a jail on the socket `jail` (the caller closes its copy)."""
        for attempt in range(2):
            sock = self._running()
            if sock is None:
                sock = await asyncio.to_thread(self._ensure)
            while True:
                try:
                    with self._lock:
                        socket.send_fds(sock, [b"jail"], [jail.fileno()])
                    return
                except BlockingIOError:  # its queue is full: it forks as fast as it can
                    await self._writable(sock)
                except OSError:
                    if attempt:
                        raise
                    with self._lock:
                        if self._sock is sock:
                            self._sock = None  # it died: start another
                            sock.close()
                    break

    async def _writable(self, sock: socket.socket) -> None:
        """Until `sock` takes a packet again, or fails (its server died): one wait a loop, shared
        by the starts that found the queue full (a loop keeps one writer callback a descriptor)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiters.get(loop)
        if waiter is None or waiter.done():
            waiter = self._waiters[loop] = loop.create_future()
            fd = sock.fileno()

            def ready() -> None:
                loop.remove_writer(fd)
                _settle(waiter, True)

            loop.add_writer(fd, ready)
        await asyncio.shield(waiter)  # a start cancelled leaves the others waiting

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._running() else None


_FORK_SERVER = _ForkServer()
_STARTS = 2 * max(2, os.cpu_count() or 1)  # jails starting at once on one event loop
_start_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _start_slot() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _start_slots.get(loop)
    if slots is None:
        slots = _start_slots[loop] = asyncio.Semaphore(_STARTS)
    return slots


# Ubuntu 23.10+ (24.04 by default): a user namespace without capabilities, unless an AppArmor
# profile allows it; Debian before 11: none at all for users.
APPARMOR_USERNS = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
DEBIAN_USERNS = "/proc/sys/kernel/unprivileged_userns_clone"


def userns_hint() -> str:
    """How to allow the user namespaces a jail needs, where a known setting of this kernel forbids
    them ("" if none does)."""
    if os.geteuid() == 0:
        return ""  # root makes its namespaces without a user namespace's leave
    if _sysctl(APPARMOR_USERNS) == "1":
        return (
            f"; AppArmor forbids unprivileged user namespaces here ({APPARMOR_USERNS} is 1, Ubuntu's "
            f"default): allow them for ollie's Python with a profile, e.g. /etc/apparmor.d/ollie holding "
            f"'abi <abi/4.0>, include <tunables/global> profile ollie {os.path.realpath(sys.executable)} "
            "flags=(unconfined) { userns, }' and `sudo apparmor_parser -r /etc/apparmor.d/ollie`, or for every "
            "program `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`"
        )
    if _sysctl(DEBIAN_USERNS) == "0":
        return "; this kernel refuses user namespaces to users: `sudo sysctl kernel.unprivileged_userns_clone=1`"
    return ""


def _sysctl(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _memfd(data: bytes, name: str = "ollie-spec", flags: int = 0) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | flags)
    os.write(fd, data)
    return fd


def _native_init() -> bytes | None:
    """The native init (jailinit.c) built for this machine: the one a wheel carries beside its
    source (setup.py builds it, named by the source's digest), when the package is installed where
    every jail keeps it read-only (`_installed`), or else compiled once with the system's C
    compiler (`$CC` if it leads into the system's directories, else `cc` there: never a program
    found on the user's PATH or in a directory a sandboxed program may write) into ollie's data
    directory, which no jail sees (a
    sandboxed program must not write what every later jail runs outside its sandbox); None without
    either, where the compiler failed (said once, and remembered), or with OLLIE_JAIL_INIT=python:
    a jail's PID 1 then stays Python, 2 MiB where the init takes a twentieth of that."""
    wanted = os.environ.get("OLLIE_JAIL_INIT", "native")
    if wanted == "python":  # asked for: the attack suites run so too (.ci/run)
        return None
    if wanted != "native":
        log.warning("OLLIE_JAIL_INIT=%r: neither 'native' nor 'python'; the native init it is", wanted)
    name = f"ollie-jail-init-{hashlib.sha256(_JAILINIT).hexdigest()[:16]}"
    built = config.data_path() / "jail-init" / name
    failed = built.with_suffix(".failed")
    for path in (Path(__file__).with_name(name), built) if _installed() else (built,):
        try:
            return path.read_bytes()
        except OSError:
            pass
    cc = os.path.realpath(os.environ["CC"]) if os.path.isabs(os.environ.get("CC", "")) else ""
    if cc and not cc.startswith(_SYSTEM_DIRS):
        log.warning("CC=%s is not in the system's directories %s: the jails' init is built with cc", cc, _SYSTEM_DIRS)
    compiler = cc if cc.startswith(_SYSTEM_DIRS) else shutil.which("cc", path=_SYSTEM_PATH)
    if compiler is None or failed.exists():
        return None
    # Names of this process's own: another ollie starting its first jail may be compiling too.
    partial = built.with_name(f".{built.name}.{os.getpid()}")
    source = partial.with_suffix(".c")
    why, remembered = "", True
    try:
        built.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(_JAILINIT)
        for static in (["-static"], []):  # static: no dynamic linker's pages in every jail
            done = subprocess.run(
                [compiler, "-O2", *static, "-o", str(partial), str(source)],
                env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},  # its assembler and linker: the system's too
                cwd="/",
                capture_output=True,
                timeout=30,  # once per machine and version; every first call of this ollie waits for it
            )
            if done.returncode == 0:
                os.replace(partial, built)
                return built.read_bytes()
        why = done.stderr.decode(errors="replace")[-2000:]
    except (OSError, subprocess.SubprocessError) as e:  # no room, a busy machine: tried again next time
        why, remembered = str(e), False
    finally:
        for path in (source, partial):
            with contextlib.suppress(OSError):
                path.unlink()
    again = f"remove {failed} to try again" if remembered else "tried again by the next ollie"
    log.warning("the jails' native init could not be built (PID 1 stays Python; %s): %s", again, why)
    if remembered:  # a compiler that refuses it: not asked again at every start
        with contextlib.suppress(OSError):  # nowhere to remember it: tried again next time
            failed.write_text(why)
    return None


# The Python that starts every jail, outside the sandbox: kept read-only in each jail even when a
# session's cwd contains it (a virtualenv in the project, pyenv under $HOME with the cwd at $HOME).
PYTHON_DIRS = tuple(
    dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)))
)


def user_site_dirs() -> list[str]:
    """The user's site-packages and scripts when the Python running ollie reads them (a system
    Python, where `pip install --user` puts ollie; a virtualenv made with --system-site-packages),
    kept read-only in each jail too: a package, a `.pth` or a usercustomize.py planted there runs
    in the next ollie, outside the sandbox, as one in sys.prefix would; and the `ollie` script's
    directory (`~/.local/bin`) is first on the running ollie's import path, where a planted
    `pygments` would run at its first highlighted code block."""
    if not site.ENABLE_USER_SITE:
        return []
    return [site.getusersitepackages(), os.path.join(site.getuserbase(), "bin")]


def _installed() -> bool:
    """Whether this package lies where every jail keeps it read-only (`PYTHON_DIRS`,
    `user_site_dirs`), not in a checkout (an editable install, a PYTHONPATH), where a session's
    code could plant an init named as the wheel's would be."""
    here = os.path.realpath(os.path.dirname(__file__))
    roots = [*PYTHON_DIRS, *map(os.path.realpath, user_site_dirs())]
    return any(here.startswith(root + "/") for root in roots)


def _native_fds() -> list[int]:
    """Descriptors of the native init, the interpreter and jaild.py, for the fork server to pass to
    every jail (close-on-exec here); [] without the init."""
    init = _native_init()
    if init is None:
        return []
    try:
        exe = _memfd(init, "ollie-jail-init", os.MFD_ALLOW_SEALING | MFD_EXEC)
    except OSError:  # before Linux 6.3
        exe = _memfd(init, "ollie-jail-init", os.MFD_ALLOW_SEALING)
    source = _memfd(_JAILD.encode(), "jaild.py", os.MFD_ALLOW_SEALING)
    fds = [exe, os.open(sys.executable, os.O_PATH | os.O_CLOEXEC), source]
    for fd in (fds[0], fds[2]):
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        )
    return fds
