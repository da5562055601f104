"""The FUSE mount of a Namespace, through mfusepy and the system's libfuse3.

libfuse runs its own threads; each operation is handed to the server's asyncio loop with
`run_coroutine_threadsafe` and the FUSE thread waits for it. A wait that takes long (a blocked
`statewait`) moves to an eventfd that the answer writes, waited on in poll(2) called through ctypes,
without the GIL: thousands of blocked readers cost no CPU while they wait. A killed reader gets
EINTR at once and its coroutine is cancelled: the mount has `intr`, so the kernel tells libfuse
about the signal, libfuse sends SIGUSR1 to the thread serving the request, and that ends its poll
(poll is never restarted after a signal handler), whereupon `fuse_interrupted()` says why.

A request made by the loop's own thread (code in the server touching the mount, e.g. a PATH lookup
through `x/`) could never be answered, since answering needs that thread: it fails with EDEADLK
instead of hanging the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import errno as E
import itertools
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .namespace import FsError, Handle, Namespace, OpenMode

if TYPE_CHECKING:
    from .remote import RemoteNamespace

log = logging.getLogger("ollie.fs.fuse")

FAST_WAIT = 0.05  # seconds an answer is awaited the plain way before the wait moves to an eventfd
# A signal that lands just before the poll starts is not lost: libfuse sends it again each second
# until the request ends. The poll's timeout is one more check, for a mount without `intr`.
INTERRUPT_CHECK = 5.0
# Names may be cached briefly (the kernel updates its cache on rm and mv through the mount; a
# session killed through ctl answers ENOENT at its next getattr); attributes never are, so sizes
# are honest (`tail -f chat`, polling `reply`'s size); failed lookups never are, so a new session
# shows at once.
ENTRY_TIMEOUT = 1.0
# Each request holds a libfuse thread until answered, and a `statewait` read blocks for up to 5 s:
# libfuse's default of 10 threads would let ten waiting readers stall the whole mount, and 256
# stalled it at about 250 (issue 15). A blocked thread costs no CPU (see above) and about 27 KiB
# of the server's memory (its stack and buffer are reserved, not touched), so the cap is set far
# above what the documented target needs (2,000 blocked readers; bench/blocked_readers.py).
# Threads left idle after a burst end beyond MAX_IDLE_THREADS, enough that readers waking together
# are not served by threads made anew (setting it also silences libfuse 3.14's spurious "Ignoring
# invalid max threads value 4294967295" about its own default).
MAX_THREADS = 10000
MAX_IDLE_THREADS = 256


def _mfusepy():
    import mfusepy

    return mfusepy


def _flags_to_mode(flags: int) -> OpenMode:
    acc = flags & os.O_ACCMODE
    mode = {os.O_RDONLY: OpenMode.READ, os.O_WRONLY: OpenMode.WRITE}.get(acc, OpenMode.READ | OpenMode.WRITE)
    if flags & os.O_TRUNC:
        mode |= OpenMode.TRUNC
    if flags & os.O_APPEND:
        mode |= OpenMode.APPEND
    return mode


class Operations:
    """mfusepy operations over a Namespace (raw_fi: we set direct_io per open file)."""

    use_ns = True

    def __init__(
        self,
        ns: Namespace | RemoteNamespace,
        loop: asyncio.AbstractEventLoop,
        ready: threading.Event,
        same_pids: bool = True,
    ):
        self.ns = ns
        self.loop = loop
        # Made on the loop's thread. A mount made in another PID namespace (a jail's) reports its
        # callers' ids there, which say nothing of ours; nor can the loop reach such a mount.
        self.loop_tid = threading.get_native_id() if same_pids else -1
        self.ready = ready
        self.handles: dict[int, Handle] = {}
        self._next_fh = itertools.count(1)
        self._uid, self._gid = os.getuid(), os.getgid()
        self._interrupted = _mfusepy()._libfuse.fuse_interrupted

    # ---- bridging ----------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if _mfusepy().fuse_get_context()[2] == self.loop_tid:  # FUSE reports the caller's thread id
            coro.close()
            log.debug("refused a request from the loop thread (EDEADLK)")
            raise _mfusepy().FuseOSError(E.EDEADLK)
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            try:
                return fut.result(FAST_WAIT)
            except concurrent.futures.TimeoutError:
                pass
            _wait_long(fut, self._interrupted)
            return fut.result(0)
        except FsError as e:
            raise _mfusepy().FuseOSError(e.errno) from None
        except concurrent.futures.CancelledError:
            raise _mfusepy().FuseOSError(E.EINTR) from None
        except OSError as e:
            if isinstance(e, _mfusepy().FuseOSError):
                raise
            raise _mfusepy().FuseOSError(e.errno or E.EIO) from None

    def _handle(self, fi) -> Handle:
        try:
            return self.handles[fi.fh]
        except KeyError:
            raise _mfusepy().FuseOSError(E.EBADF) from None

    def _add(self, handle: Handle, fi) -> int:
        fh = next(self._next_fh)
        self.handles[fh] = handle
        fi.fh = fh
        fi.direct_io = handle.direct_io
        fi.noflush = fi.flags & os.O_ACCMODE == os.O_RDONLY  # nothing written: nothing to act on at close
        return 0

    # ---- operations ------------------------------------------------------------------------------
    def init(self, path: str) -> None:
        self.ready.set()

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        if isinstance(self.ns, Namespace):  # a local tree's stat only reads: no hop (a hop costs ~0.1 ms)
            try:
                st = self.ns.stat_now(path)
            except FsError as e:
                raise _mfusepy().FuseOSError(e.errno) from None
        else:
            st = self._run(self.ns.stat(path))
        mtime = int(st.mtime * 1e9)
        return {
            "st_mode": st.st_mode,
            "st_nlink": 2 if st.is_dir else 1,
            "st_size": st.size,
            "st_uid": self._uid,
            "st_gid": self._gid,
            "st_mtime": mtime,
            "st_ctime": mtime,
            "st_atime": mtime,
            "st_blocks": (st.size + 511) // 512,
            "st_blksize": 4096,
        }

    def readdir(self, path: str, fh: int):
        entries = self._run(self.ns.list(path))
        return [".", "..", *((st.name, {"st_mode": st.st_mode}, 0) for st in entries)]

    def open(self, path: str, fi) -> int:
        return self._add(self._run(self.ns.open(path, _flags_to_mode(fi.flags))), fi)

    def create(self, path: str, mode: int, fi) -> int:
        return self._add(self._run(self.ns.create(path, mode & 0o777)), fi)

    def read(self, path: str, size: int, offset: int, fi) -> bytes:
        return self._run(self._handle(fi).read(offset, size))

    def write(self, path: str, data: bytes, offset: int, fi) -> int:
        return self._run(self._handle(fi).write(offset, data))

    def flush(self, path: str, fi) -> int:
        self._run(self._handle(fi).flush())
        return 0

    def release(self, path: str, fi) -> int:
        handle = self.handles.pop(fi.fh, None)
        if handle is not None:  # nothing to report to anyone: don't make the closer wait for it
            asyncio.run_coroutine_threadsafe(handle.release(), self.loop)
        return 0

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        handle = self.handles.get(fh.fh) if fh is not None else None  # ftruncate(2): that open file
        self._run(handle.truncate(length) if handle is not None else self.ns.truncate(path, length))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._run(self.ns.mkdir(path, mode & 0o777))
        return 0

    def unlink(self, path: str) -> int:
        self._run(self.ns.remove(path))
        return 0

    def rmdir(self, path: str) -> int:
        self._run(self.ns.remove(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._run(self.ns.rename(old, new))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        return 0  # modes are the namespace's; accepting keeps `cp -p` and editors happy

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: Any = None) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}


class _Poll(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_POLLIN = 1
_libc_poll: Any = None


def _poll(fd: int, timeout: float) -> int:
    """poll(2) on one fd, through ctypes: the GIL is released while it waits, and a signal to this
    thread ends it (-1, EINTR), where Python's select would retry."""
    global _libc_poll
    if _libc_poll is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.poll.argtypes = [ctypes.POINTER(_Poll), ctypes.c_ulong, ctypes.c_int]
        libc.poll.restype = ctypes.c_int
        _libc_poll = libc.poll
    pfd = _Poll(fd, _POLLIN, 0)
    return int(_libc_poll(ctypes.byref(pfd), 1, int(timeout * 1000)))


class _Wakeup:
    """An eventfd that the future's completion writes (from the loop's thread), closed once."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._lock = threading.Lock()

    def set(self, _fut: Any = None) -> None:
        with self._lock:
            if self.fd >= 0:
                os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        with self._lock:
            os.close(self.fd)
            self.fd = -1


def _wait_long(fut: concurrent.futures.Future, interrupted: Any) -> None:
    """Wait for `fut` without the GIL; on an interrupt, cancel it and fail with EINTR."""
    wakeup = _Wakeup()
    try:
        fut.add_done_callback(wakeup.set)  # done already: called at once
        while not fut.done():
            if interrupted():
                fut.cancel()
                raise _mfusepy().FuseOSError(E.EINTR)
            _poll(wakeup.fd, INTERRUPT_CHECK)
    finally:
        wakeup.close()


def _fuse_class() -> Any:
    base: Any = _mfusepy().FUSE

    class FUSE(base):
        def truncate_fuse_3(self, path, length, fip):
            """mfusepy drops the open file of an ftruncate(2); pass it on (vim truncates the
            descriptor it opened, and a/ configs and prompts are buffered per open file)."""
            return self.ftruncate(path, length, fip)

    return FUSE


# A jail's view serves one session's code: a few waiting readers (statewait) at once is plenty.
VIEW_THREADS = 16


def serve_connection(ns: Namespace, fd: int, name: str) -> threading.Thread:
    """Serve `ns` on `fd`, the /dev/fuse descriptor of a mount made elsewhere (in a jail's
    namespaces), from a thread of its own, until the mount goes away (its jail ends): then libfuse
    stops and closes `fd`. No `intr`: its signal would need a handler, settable only from the main
    thread; a blocked read ends by itself (statewait within 5 s)."""
    ops = Operations(ns, asyncio.get_running_loop(), threading.Event(), same_pids=False)

    def run() -> None:
        try:
            _fuse_class()(
                ops,
                f"/dev/fd/{fd}",
                raw_fi=True,
                foreground=True,
                attr_timeout=0,
                entry_timeout=ENTRY_TIMEOUT,
                negative_timeout=0,
                max_threads=VIEW_THREADS,
                max_idle_threads=1,
            )
        except BaseException as e:  # noqa: BLE001 - a view that fails leaves its jail's $OLLIE failing
            log.warning("%s: the view stopped: %s", name, e)

    thread = threading.Thread(target=run, name=f"ollie-view-{name}", daemon=True)
    thread.start()
    return thread


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Mount:
    """A namespace (local, or another server's over 9P) mounted at `path` by a FUSE thread;
    `unmount()` ends it."""

    def __init__(self, ns: Namespace | RemoteNamespace, path: str):
        self.ns = ns
        self.path = os.path.abspath(path)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    async def start(self, timeout: float = 10.0) -> None:
        clear_stale(self.path)
        os.makedirs(self.path, exist_ok=True)
        # libfuse interrupts a request by sending SIGUSR1 to the thread serving it. mfusepy enables
        # `intr` after libfuse would have installed its handler, so without ours the signal kills
        # the server. A Python-level no-op (not SIG_IGN, which children would inherit) is enough:
        # the waiting thread sees fuse_interrupted() on its next check.
        signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        loop = asyncio.get_running_loop()
        ready = threading.Event()
        ops = Operations(self.ns, loop, ready)
        done = loop.create_future()

        def run() -> None:
            try:
                _fuse_class()(
                    ops,
                    self.path,
                    raw_fi=True,
                    foreground=True,
                    fsname="ollie",
                    subtype="ollie",
                    intr=True,
                    attr_timeout=0,
                    entry_timeout=ENTRY_TIMEOUT,
                    negative_timeout=0,
                    max_threads=MAX_THREADS,
                    max_idle_threads=MAX_IDLE_THREADS,
                )
            except BaseException as e:  # noqa: BLE001 - reported to start() / the log
                self._error = e
            finally:
                ready.set()
                loop.call_soon_threadsafe(_resolve, done)

        self._thread = threading.Thread(target=run, name="ollie-fuse", daemon=True)
        self._thread.start()
        if not await asyncio.to_thread(ready.wait, timeout) or self._error or done.done():
            raise OSError(f"cannot mount {self.path}: {self._error or 'FUSE did not start'}")
        self._done = done

    async def unmount(self, meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
        """Detach the mount, run `meanwhile` (closing the sessions: a jail's mount namespace holds a
        copy of this mount, and the file system ends only once the last copy goes), then wait for
        the file system to end."""
        if self._thread is None:
            if meanwhile is not None:
                await meanwhile()
            return
        await asyncio.to_thread(fusermount_u, self.path)
        if meanwhile is not None:
            await meanwhile()
        await asyncio.wait_for(asyncio.shield(self._done), 10)
        self._thread = None


def fusermount_u(path: str) -> None:
    """Unmount, lazily: a process still inside the mount must not keep the server alive."""
    subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)


def clear_stale(path: str) -> None:
    """A server killed with -9 leaves its mount behind ("Transport endpoint is not connected")."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == E.ENOTCONN:
            fusermount_u(path)
