"""The FUSE mount of a Namespace, served on the server's asyncio loop.

The loop reads the kernel's requests from the mount's /dev/fuse descriptor itself (`fuse_kernel.py`
has the protocol), a batch per wakeup, and runs each as the 9P server runs its requests: those
that only read the tree (lookup, getattr) at once, the others as a task, answered when it ends;
but the open and reads of a file whose content is at hand (File.open_now, Handle.read_now: a
session's `state`, `reply`, `chat`) at once too, since a task waits its turn behind all the loop
has to do. A
blocked reader (`statewait`, a long read) is one task, like any other awaiting coroutine: no thread,
no stack, no CPU while it waits, and no limit but memory. A killed reader gets EINTR at once: the
kernel sends FUSE_INTERRUPT naming its request, and the task serving it is cancelled.

Earlier this mount ran on libfuse (through mfusepy), one thread per request, each handing its
operation to the loop and waiting: under 2,000 blocked readers the hand-offs and the threads'
contention for the GIL put a read of `state` at 52-94 ms at the 99th percentile (issue 15). A
thread reading /dev/fuse for the loop (one hand-off per batch) took a third more CPU than reading
on the loop (33% of a core against 24%) and put the median at 1.3-1.6 ms against 0.8-1.1 ms.

A request made by the loop's own thread (code in the server touching the mount, e.g. a PATH lookup
through one of its directories) could never be answered, since answering needs that thread: a guard
thread reads a request the loop leaves unread for a while, and refuses the loop's own with EDEADLK
instead of hanging the server. A jail's view (`serve_connection`) cannot get the loop's requests: a thread of
its own reads it and hands its requests to the loop in batches.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno as E
import itertools
import logging
import os
import select
import stat as S
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from . import fuse_kernel as K
from .namespace import FsError, Handle, Namespace, OpenMode, Stat, Tree

log = logging.getLogger("ollie.vfs.fuse")

# Names may be cached briefly (the kernel updates its cache on rm and mv through the mount; a
# session killed through ctl answers ENOENT at its next getattr); attributes never are, so sizes
# are honest (`tail -f chat`, polling `reply`'s size); failed lookups never are, so a new session
# shows at once.
ENTRY_TIMEOUT = 1  # seconds

NO_REPLY = frozenset({K.FORGET, K.BATCH_FORGET, K.INTERRUPT})
# What the kernel may send for a process it no longer sees (pid 0 on a view): the rest of a view's
# requests come from its jail's processes, and pid 0 there is one outside the jail's PID namespace
# (the server itself, reaching in through /proc/<pid>/root: the loop would wait on its own view).
HOUSEKEEPING = NO_REPLY | {K.INIT, K.DESTROY, K.RELEASE, K.RELEASEDIR, K.FLUSH}
# What FUSE_INTERRUPT may cancel: reads, which are what waits (statewait, a long read). Anything
# else runs to its end, so that a signal cannot cut a kill, a rename or a session's making in half.
CANCELLABLE = frozenset({K.READ, K.READDIR})
# A listing's inode numbers are not stat's (which are node ids, given on lookup): libfuse said so too.
UNKNOWN_INO = 0xFFFFFFFF
VIEW_OPEN_MAX = 1024  # files a session's view may have open at once
BATCH = 256  # requests read per wakeup of the loop at most, so that other work is not starved
UNMOUNT_LINGER = 1.0  # seconds a detached mount's users have to let it go before it is ended
GUARD_TICK = 0.1  # seconds; the loop's own request to the mount fails (EDEADLK) within two


def _flags_to_mode(flags: int) -> OpenMode:
    acc = flags & os.O_ACCMODE
    mode = {os.O_RDONLY: OpenMode.READ, os.O_WRONLY: OpenMode.WRITE}.get(acc, OpenMode.READ | OpenMode.WRITE)
    if flags & os.O_TRUNC:
        mode |= OpenMode.TRUNC
    if flags & os.O_APPEND:
        mode |= OpenMode.APPEND
    return mode


def _name(arg: bytes) -> str:
    return os.fsdecode(arg.split(b"\0", 1)[0])


class Connection:
    """One FUSE connection (a /dev/fuse descriptor) serving `ns` on `loop`, until the mount goes.

    Nodes are paths: a lookup gives the path a node id, kept until the kernel forgets it (a rename
    moves the ids under the old path to the new one)."""

    def __init__(
        self,
        ns: Tree,
        fd: int,
        loop: asyncio.AbstractEventLoop,
        name: str,
        same_pids: bool = True,
        max_open: int | None = None,
    ):
        self.ns = ns
        self.max_open = max_open  # files and directories open at once (None: as the kernel allows)
        # Its requests run in (a copy each of) the context it is made in, not its reading thread's:
        # a view's names whose budget what its open files hold is charged to (stores.HELD).
        self.context = contextvars.copy_context()
        self._opens = 0  # opens under way
        self.fd = fd
        self.loop = loop
        self.name = name
        # Made on the loop's thread. A mount made in another PID namespace (a jail's) reports its
        # callers' ids there, which say nothing of ours: a caller from outside it shows as pid 0.
        self.same_pids = same_pids
        self.loop_tid = threading.get_native_id() if same_pids else -1
        # A tree in this process: its stat only reads, so it is answered without a task.
        self.local = ns if isinstance(ns, Namespace) else None
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self._paths: dict[int, str] = {1: "/"}
        self._ids: dict[str, int] = {"/": 1}
        self._lookups: dict[int, int] = {}
        self._dirs_kind: dict[int, bool] = {1: True}
        self._next_id = itertools.count(2)
        self._handles: dict[int, Handle] = {}
        self._dirs: dict[int, list[Any]] = {}  # fh -> [path, entries or None]
        self._next_fh = itertools.count(1)
        self._tasks: dict[int, asyncio.Task[None]] = {}  # by request, for FUSE_INTERRUPT
        self._cancellable: set[int] = set()  # requests FUSE_INTERRUPT cancels (CANCELLABLE's)
        self._releases: set[asyncio.Task[None]] = set()
        self._pending: list[bytes] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = False
        self._uid, self._gid = os.getuid(), os.getgid()
        self._interrupted: set[int] = set()  # interrupts that came before their request was dispatched
        # The mount's own connection is read by the loop itself (one wakeup per batch of requests,
        # and no thread to contend with for the GIL), with a guard thread for the loop's own
        # requests; a view's by a thread of its own (a jail's mount cannot be the loop's request).
        self._on_loop = same_pids
        self._last_read = 0.0
        os.set_blocking(fd, not self._on_loop)
        self._thread = threading.Thread(
            target=self._guard if self._on_loop else self._read_requests, name=f"ollie-{name}", daemon=True
        )
        self._sync: dict[int, Callable[[int, int, bytes], None]] = {
            K.INIT: self._init,
            K.FORGET: self._forget,
            K.BATCH_FORGET: self._batch_forget,
            K.INTERRUPT: self._interrupt,
            K.RELEASE: self._release,
            K.OPENDIR: self._opendir,
            K.RELEASEDIR: self._releasedir,
            K.STATFS: self._statfs,
        }
        # Answered at once when they can be (returning False when they cannot: then by a task).
        self._now: dict[int, Callable[[int, int, bytes], bool]] = {K.READ: self._read_now}
        if self.local is not None:
            self._sync[K.LOOKUP] = self._lookup_now
            self._sync[K.GETATTR] = self._getattr_now
            self._now[K.OPEN] = self._open_now
        self._async: dict[int, Callable[[int, bytes], Coroutine[Any, Any, bytes | tuple[bytes, int]]]] = {
            K.LOOKUP: self._lookup,
            K.GETATTR: self._getattr,
            K.SETATTR: self._setattr,
            K.OPEN: self._open,
            K.READ: self._read,
            K.WRITE: self._write,
            K.FLUSH: self._flush,
            K.READDIR: self._readdir,
            K.CREATE: self._create,
            K.MKDIR: self._mkdir,
            K.UNLINK: self._remove,
            K.RMDIR: self._remove,
            K.RENAME: self._rename,
            K.RENAME2: self._rename2,
        }
        # Refused or accepted without acting (modes are the namespace's; accepting chmod, chown
        # and utimens keeps `cp -p` and editors happy: SETATTR acts on the size only).
        self._answers = {
            K.FSYNC: 0,
            K.FSYNCDIR: 0,
            K.DESTROY: 0,
            K.MKNOD: E.EROFS,
            K.SYMLINK: E.EROFS,
            K.LINK: E.EROFS,
        }

    def start(self) -> None:
        if self._on_loop:
            self.loop.add_reader(self.fd, self._on_readable)
        self._thread.start()

    # ---- reading on the loop ------------------------------------------------------------------
    def _on_readable(self) -> None:
        self._last_read = time.monotonic()
        for _ in range(BATCH):
            try:
                data = os.read(self.fd, K.BUFSIZE)
            except BlockingIOError:
                return
            except (InterruptedError, FileNotFoundError):  # ENOENT: a request withdrawn meanwhile
                continue
            except OSError as e:
                if e.errno != E.ENODEV:  # ENODEV: the mount is gone
                    log.warning("%s: reading /dev/fuse: %s", self.name, e)
                self._end()
                return
            self._dispatch(data)

    def _guard(self) -> None:
        """Every GUARD_TICK: a request left unread over a whole tick while the loop read nothing is
        one the loop cannot read, being blocked (most likely in that very request, made by its own
        thread): read it here, refuse it if it is the loop's (EDEADLK), else hand it over."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        pending_since = 0.0
        try:
            while not self._closed:
                time.sleep(GUARD_TICK)
                if self._closed or not poller.poll(0):
                    pending_since = 0.0
                    continue
                if not pending_since or self._last_read > pending_since:
                    pending_since = time.monotonic()
                    continue
                while self._steal():
                    pass
                pending_since = 0.0
        finally:
            os.close(self.fd)

    def _steal(self) -> bool:
        try:
            data = os.read(self.fd, K.BUFSIZE)
        except (BlockingIOError, InterruptedError, FileNotFoundError):
            return False
        except OSError:  # the mount is gone: the loop finds out by itself
            return False
        _, opcode, unique, _, _, _, pid, _, _ = K.IN_HEADER.unpack_from(data)
        if not self._refused(opcode, unique, pid):
            try:
                self.loop.call_soon_threadsafe(self._dispatch, data)
            except RuntimeError:  # the loop is closed
                return False
        return True

    def _refused(self, opcode: int, unique: int, pid: int) -> bool:
        """Answer, from the reading thread, a request the loop must never wait on: one of the loop's
        own (a bug of ours: a stat of the mount point, say) with EDEADLK, and on a view one from
        outside its jail with EACCES."""
        if opcode in HOUSEKEEPING:
            return False
        if pid == self.loop_tid:
            log.warning("refused a request from the loop thread (EDEADLK): opcode %d", opcode)
            error = E.EDEADLK
        elif pid == 0 and not self.same_pids:
            log.warning("%s: refused a request from outside its jail (EACCES): opcode %d", self.name, opcode)
            error = E.EACCES
        else:
            return False
        try:
            K.reply(self.fd, unique, error)
        except OSError:
            pass
        return True

    # ---- the reading thread --------------------------------------------------------------------
    def _read_requests(self) -> None:
        fd = self.fd
        while True:
            try:
                data = os.read(fd, K.BUFSIZE)
            except (InterruptedError, FileNotFoundError):  # ENOENT: a request withdrawn meanwhile
                continue
            except OSError as e:
                if e.errno != E.ENODEV:  # ENODEV: the mount is gone
                    log.warning("%s: reading /dev/fuse: %s", self.name, e)
                break
            if len(data) < K.IN_HEADER.size:
                break
            _, opcode, unique, _, _, _, pid, _, _ = K.IN_HEADER.unpack_from(data)
            if self._refused(opcode, unique, pid):
                continue
            with self._lock:
                self._pending.append(data)
                wake = not self._scheduled
                self._scheduled = True
            if wake:
                try:
                    self.loop.call_soon_threadsafe(self._drain)
                except RuntimeError:  # the loop is closed (the process ends): nobody is left to serve
                    break
        try:
            self.loop.call_soon_threadsafe(self._end)
        except RuntimeError:
            os.close(fd)

    # ---- on the loop ---------------------------------------------------------------------------
    def _drain(self) -> None:
        with self._lock:
            batch, self._pending, self._scheduled = self._pending, [], False
        for data in batch:
            self._dispatch(data)

    def _end(self) -> None:
        if self._closed:
            return
        if self._on_loop:
            self.loop.remove_reader(self.fd)
        self._drain()
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        for handle in self._handles.values():  # the mount is gone: nobody will close them
            self._release_handle(handle)
        self._handles.clear()
        if not self._on_loop:
            os.close(self.fd)  # else the guard thread does, once it stopped using it
        if not self.ready.done():
            self.ready.set_exception(OSError(f"{self.name}: the FUSE connection ended before it started"))
            self.ready.exception()  # retrieved: nobody may be waiting
        if not self.done.done():
            self.done.set_result(None)

    def abort(self) -> None:
        """Stop serving a mount's own connection (one the loop reads) now: its descriptor is closed,
        and whatever still uses the file system gets ENOTCONN, as after a server that died."""
        assert self._on_loop, "a view's connection ends with its jail"
        self._end()

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> bool:
        if self._closed:
            return False
        try:
            K.reply(self.fd, unique, error, body)
        except FileNotFoundError:  # the caller gave up (interrupted) before the answer
            return False
        except OSError as e:
            log.debug("%s: cannot answer a request: %s", self.name, e)
            return False
        return True

    def _dispatch(self, data: bytes) -> None:
        _, opcode, unique, nodeid = K.IN_HEADER.unpack_from(data)[:4]
        arg = data[K.IN_HEADER.size :]
        sync = self._sync.get(opcode)
        if sync is not None:
            self._answer_now(sync, opcode, unique, nodeid, arg)
            return
        handler = self._async.get(opcode)
        if self._interrupted and unique in self._interrupted:  # interrupted before it got here
            self._interrupted.discard(unique)
            self._reply(unique, E.EINTR)
            return
        now = self._now.get(opcode)
        if now is not None and self._answer_now(now, opcode, unique, nodeid, arg):
            return
        if handler is None:
            if opcode not in NO_REPLY:
                self._reply(unique, self._answers.get(opcode, E.ENOSYS))
            return
        self._tasks[unique] = self.loop.create_task(
            self._run(unique, opcode, handler(nodeid, arg)), context=self.context.copy()
        )
        if opcode in CANCELLABLE:
            self._cancellable.add(unique)

    def _answer_now(
        self, handler: Callable[[int, int, bytes], bool | None], opcode: int, unique: int, nodeid: int, arg: bytes
    ) -> bool:
        """Run a request's handler that needs no waiting; False if it could not answer (a
        failure is an answer)."""
        try:
            return handler(unique, nodeid, arg) is not False
        except FsError as e:
            self._reply(unique, e.errno)
        except OSError as e:
            self._reply(unique, e.errno or E.EIO)
        except Exception:
            log.exception("%s: FUSE request %d failed", self.name, opcode)
            self._reply(unique, E.EIO)
        return True

    async def _run(self, unique: int, opcode: int, op: Coroutine[Any, Any, bytes | tuple[bytes, int]]) -> None:
        error, body, opened = 0, b"", 0
        try:
            out = await op
            body, opened = out if isinstance(out, tuple) else (out, 0)
        except asyncio.CancelledError:  # FUSE_INTERRUPT: the caller was signalled
            error = E.EINTR
        except FsError as e:
            error = e.errno
        except OSError as e:
            error = e.errno or E.EIO
        except Exception:
            log.exception("%s: FUSE request %d failed", self.name, opcode)
            error = E.EIO
        finally:
            self._tasks.pop(unique, None)
            self._cancellable.discard(unique)
        if not self._reply(unique, error, body) and opened:  # an open nobody got: nobody will close it
            self._release_handle(self._handles.pop(opened, None))

    # ---- nodes ----------------------------------------------------------------------------------
    def _path(self, nodeid: int) -> str:
        try:
            return self._paths[nodeid]
        except KeyError:
            raise FsError(E.ENOENT, f"node {nodeid} is not known") from None

    def _child(self, nodeid: int, name: str) -> str:
        parent = self._path(nodeid)
        return f"/{name}" if parent == "/" else f"{parent}/{name}"

    def _ref(self, path: str, is_dir: bool) -> int:
        nodeid = self._ids.get(path)
        if nodeid is not None and self._dirs_kind.get(nodeid) != is_dir:  # replaced by another kind
            del self._ids[path]
            nodeid = None
        if nodeid is None:
            nodeid = self._ids[path] = next(self._next_id)
            self._paths[nodeid] = path
            self._dirs_kind[nodeid] = is_dir
        self._lookups[nodeid] = self._lookups.get(nodeid, 0) + 1
        return nodeid

    def _unref(self, nodeid: int, n: int) -> None:
        left = self._lookups.get(nodeid, 0) - n
        if left > 0 or nodeid == 1:
            self._lookups[nodeid] = left
            return
        self._lookups.pop(nodeid, None)
        self._dirs_kind.pop(nodeid, None)
        path = self._paths.pop(nodeid, None)
        if path is not None and self._ids.get(path) == nodeid:
            del self._ids[path]

    def _removed(self, gone: str) -> None:
        """A name removed: a node the kernel still holds keeps its id, a new one there gets another."""
        for path in [p for p in self._ids if p == gone or p.startswith(gone + "/")]:
            del self._ids[path]

    def _moved(self, old: str, new: str) -> None:
        for nodeid, path in list(self._paths.items()):
            if path == old or path.startswith(old + "/"):
                if self._ids.get(path) == nodeid:
                    del self._ids[path]
                self._paths[nodeid] = moved = new + path[len(old) :]
                self._ids[moved] = nodeid

    def _attr(self, nodeid: int, st: Stat) -> bytes:
        sec = int(st.mtime)
        nsec = min(int((st.mtime - sec) * 1e9), 999_999_999)
        return K.ATTR.pack(
            nodeid,
            st.size,
            (st.size + 511) // 512,
            sec,
            sec,
            sec,
            nsec,
            nsec,
            nsec,
            st.st_mode,
            2 if st.is_dir else 1,
            self._uid,
            self._gid,
            0,
            4096,
            0,
        )

    def _entry(self, path: str, st: Stat) -> bytes:
        nodeid = self._ref(path, st.is_dir)
        return K.ENTRY_OUT.pack(nodeid, 0, ENTRY_TIMEOUT, 0, 0, 0) + self._attr(nodeid, st)

    async def _stat(self, path: str) -> Stat:
        return self.local.stat_now(path) if self.local is not None else await self.ns.stat(path)

    def _handle(self, fh: int) -> Handle:
        try:
            return self._handles[fh]
        except KeyError:
            raise FsError(E.EBADF, "not an open file") from None

    def _check_room(self) -> None:
        """An open file holds what it read or was written until closed: a view's are counted."""
        if self.max_open is not None and len(self._handles) + len(self._dirs) + self._opens >= self.max_open:
            raise FsError(E.EMFILE, f"at most {self.max_open} files open at once on {self.name}")

    async def _opening(self, open_: Callable[[], Awaitable[Handle]]) -> Handle:
        self._check_room()
        self._opens += 1  # counted while it opens, so concurrent opens cannot pass the cap together
        try:
            return await open_()
        finally:
            self._opens -= 1

    def _add(self, handle: Handle) -> int:
        fh = next(self._next_fh)
        self._handles[fh] = handle
        return fh

    @staticmethod
    def _open_flags(handle: Handle, flags: int) -> int:
        out = K.FOPEN_DIRECT_IO if handle.direct_io else 0
        if flags & os.O_ACCMODE == os.O_RDONLY:  # nothing written: nothing to act on at close
            out |= K.FOPEN_NOFLUSH
        return out

    def _release_handle(self, handle: Handle | None) -> None:
        if handle is None:
            return
        task = self.loop.create_task(handle.release())  # nothing to report: nobody waits for it
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    # ---- requests answered at once -----------------------------------------------------------
    def _init(self, unique: int, nodeid: int, arg: bytes) -> None:
        major, minor, readahead, flags = K.INIT_IN.unpack_from(arg)
        if major != K.MAJOR:
            self._reply(unique, E.EPROTO)
            return
        out = K.INIT_OUT.pack(
            K.MAJOR, min(minor, K.MINOR), readahead, flags & K.INIT_FLAGS, 64, 48, K.MAX_WRITE, 1, 0, 0, 0, 0
        )
        self._reply(unique, 0, out)
        if not self.ready.done():
            self.ready.set_result(None)

    def _forget(self, unique: int, nodeid: int, arg: bytes) -> None:
        self._unref(nodeid, K.U64.unpack_from(arg)[0])

    def _batch_forget(self, unique: int, nodeid: int, arg: bytes) -> None:
        (count,) = K.U32.unpack_from(arg)
        for i in range(count):
            self._unref(*K.FORGET_ONE.unpack_from(arg, 8 + i * K.FORGET_ONE.size))

    def _interrupt(self, unique: int, nodeid: int, arg: bytes) -> None:
        target = K.U64.unpack_from(arg)[0]
        task = self._tasks.get(target)
        if task is not None:
            if target in self._cancellable:
                task.cancel()
        elif self._on_loop:  # its request may still be on its way from the guard thread (or answered)
            if len(self._interrupted) > 256:
                self._interrupted.clear()
            self._interrupted.add(target)

    def _release(self, unique: int, nodeid: int, arg: bytes) -> None:
        self._reply(unique)
        self._release_handle(self._handles.pop(K.RELEASE_IN.unpack_from(arg)[0], None))

    def _opendir(self, unique: int, nodeid: int, arg: bytes) -> None:
        self._check_room()
        fh = next(self._next_fh)
        self._dirs[fh] = [self._path(nodeid), None]
        self._reply(unique, 0, K.OPEN_OUT.pack(fh, 0, 0))

    def _releasedir(self, unique: int, nodeid: int, arg: bytes) -> None:
        self._dirs.pop(K.RELEASE_IN.unpack_from(arg)[0], None)
        self._reply(unique)

    def _statfs(self, unique: int, nodeid: int, arg: bytes) -> None:
        self._reply(unique, 0, K.KSTATFS.pack(0, 0, 0, 0, 0, 4096, 255, 4096, 0))

    def _lookup_now(self, unique: int, nodeid: int, arg: bytes) -> None:
        path = self._child(nodeid, _name(arg))
        self._reply(unique, 0, self._entry(path, self.local.stat_now(path)))  # type: ignore[union-attr]

    def _getattr_now(self, unique: int, nodeid: int, arg: bytes) -> None:
        st = self.local.stat_now(self._path(nodeid))  # type: ignore[union-attr]
        self._reply(unique, 0, K.ATTR_OUT.pack(0, 0, 0) + self._attr(nodeid, st))

    # ---- requests served by a task ------------------------------------------------------------
    async def _lookup(self, nodeid: int, arg: bytes) -> bytes:
        path = self._child(nodeid, _name(arg))
        return self._entry(path, await self._stat(path))

    async def _getattr(self, nodeid: int, arg: bytes) -> bytes:
        return K.ATTR_OUT.pack(0, 0, 0) + self._attr(nodeid, await self._stat(self._path(nodeid)))

    async def _setattr(self, nodeid: int, arg: bytes) -> bytes:
        valid, _, fh, size = K.SETATTR_IN.unpack_from(arg)[:4]
        path = self._path(nodeid)
        if valid & K.FATTR_SIZE:
            handle = self._handles.get(fh) if valid & K.FATTR_FH else None  # ftruncate(2): that open file
            await (handle.truncate(size) if handle is not None else self.ns.truncate(path, size))
        return K.ATTR_OUT.pack(0, 0, 0) + self._attr(nodeid, await self._stat(path))

    def _open_now(self, unique: int, nodeid: int, arg: bytes) -> bool:
        flags = K.OPEN_IN.unpack_from(arg)[0]
        self._check_room()
        handle = self.local.open_now(self._path(nodeid), _flags_to_mode(flags))  # type: ignore[union-attr]
        if handle is None:
            return False
        fh = self._add(handle)
        if not self._reply(unique, 0, K.OPEN_OUT.pack(fh, self._open_flags(handle, flags), 0)):
            self._release_handle(self._handles.pop(fh, None))  # an open nobody got: nobody will close it
        return True

    def _read_now(self, unique: int, nodeid: int, arg: bytes) -> bool:
        fh, offset, size = K.READ_IN.unpack_from(arg)[:3]
        data = self._handle(fh).read_now(offset, size)
        if data is None:
            return False
        self._reply(unique, 0, data)
        return True

    async def _open(self, nodeid: int, arg: bytes) -> tuple[bytes, int]:
        flags = K.OPEN_IN.unpack_from(arg)[0]
        handle = await self._opening(lambda: self.ns.open(self._path(nodeid), _flags_to_mode(flags)))
        fh = self._add(handle)
        return K.OPEN_OUT.pack(fh, self._open_flags(handle, flags), 0), fh

    async def _read(self, nodeid: int, arg: bytes) -> bytes:
        fh, offset, size = K.READ_IN.unpack_from(arg)[:3]
        return await self._handle(fh).read(offset, size)

    async def _write(self, nodeid: int, arg: bytes) -> bytes:
        fh, offset, size = K.READ_IN.unpack_from(arg)[:3]
        data = arg[K.READ_IN.size : K.READ_IN.size + size]
        return K.WRITE_OUT.pack(await self._handle(fh).write(offset, data), 0)

    async def _flush(self, nodeid: int, arg: bytes) -> bytes:
        handle = self._handles.get(K.RELEASE_IN.unpack_from(arg)[0])
        if handle is not None:
            await handle.flush()
        return b""

    async def _readdir(self, nodeid: int, arg: bytes) -> bytes:
        fh, offset, size = K.READ_IN.unpack_from(arg)[:3]
        d = self._dirs.get(fh)
        if d is None:
            raise FsError(E.EBADF, "not an open directory")
        if d[1] is None or offset == 0:
            here = S.S_IFDIR | 0o755
            d[1] = [(UNKNOWN_INO, b".", here), (UNKNOWN_INO, b"..", here)] + [
                (UNKNOWN_INO, os.fsencode(st.name), st.st_mode) for st in await self.ns.list(d[0])
            ]
        out, total = [], 0
        for i in range(offset, len(d[1])):
            ino, name, mode = d[1][i]
            ent = K.dirent(ino, i + 1, name, mode)
            if total + len(ent) > size:
                break
            out.append(ent)
            total += len(ent)
        return b"".join(out)

    async def _create(self, nodeid: int, arg: bytes) -> tuple[bytes, int]:
        flags, mode = K.CREATE_IN.unpack_from(arg)[:2]
        path = self._child(nodeid, _name(arg[K.CREATE_IN.size :]))
        handle = await self._opening(lambda: self.ns.create(path, mode & 0o777))
        try:
            st = await self._stat(path)
        except BaseException:
            self._release_handle(handle)
            raise
        fh = self._add(handle)
        return self._entry(path, st) + K.OPEN_OUT.pack(fh, self._open_flags(handle, flags), 0), fh

    async def _mkdir(self, nodeid: int, arg: bytes) -> bytes:
        mode = K.MKDIR_IN.unpack_from(arg)[0]
        path = self._child(nodeid, _name(arg[K.MKDIR_IN.size :]))
        await self.ns.mkdir(path, mode & 0o777)
        return self._entry(path, await self._stat(path))

    async def _remove(self, nodeid: int, arg: bytes) -> bytes:
        path = self._child(nodeid, _name(arg))
        await self.ns.remove(path)
        self._removed(path)
        return b""

    async def _rename(self, nodeid: int, arg: bytes) -> bytes:
        (newdir,) = K.RENAME_IN.unpack_from(arg)
        return await self._do_rename(nodeid, newdir, arg[K.RENAME_IN.size :], 0)

    async def _rename2(self, nodeid: int, arg: bytes) -> bytes:
        newdir, flags, _ = K.RENAME2_IN.unpack_from(arg)
        return await self._do_rename(nodeid, newdir, arg[K.RENAME2_IN.size :], flags)

    async def _do_rename(self, nodeid: int, newdir: int, names: bytes, flags: int) -> bytes:
        old_name, new_name = (os.fsdecode(n) for n in names.split(b"\0", 2)[:2])
        old, new = self._child(nodeid, old_name), self._child(newdir, new_name)
        if flags & K.RENAME_EXCHANGE:
            raise FsError(E.EINVAL, "rename: exchanging is not supported")
        if flags & K.RENAME_NOREPLACE:
            try:
                await self._stat(new)
            except FsError:
                pass
            else:
                raise FsError(E.EEXIST, f"{new}: exists")
        await self.ns.rename(old, new)
        self._removed(new)
        self._moved(old, new)
        return b""


def serve_connection(ns: Namespace, fd: int, name: str) -> Connection:
    """Serve `ns` on `fd`, the /dev/fuse descriptor of a mount made elsewhere (in a jail's
    namespaces), until the mount goes away (its jail ends): then `fd` is closed."""
    conn = Connection(ns, fd, asyncio.get_running_loop(), f"view-{name}", same_pids=False, max_open=VIEW_OPEN_MAX)
    conn.start()
    return conn


class Mount:
    """A namespace (local, or another server's over 9P) mounted at `path`; `unmount()` ends it."""

    def __init__(self, ns: Tree, path: str):
        self.ns = ns
        self.path = os.path.abspath(path)
        self._conn: Connection | None = None

    async def start(self, timeout: float = 10.0) -> None:
        clear_stale(self.path)
        os.makedirs(self.path, exist_ok=True)
        try:
            fd = await asyncio.to_thread(K.fusermount, self.path, "fsname=ollie,subtype=ollie")
        except (OSError, subprocess.SubprocessError) as e:
            raise OSError(f"cannot mount {self.path}: {e}") from None
        conn = Connection(self.ns, fd, asyncio.get_running_loop(), "fuse")
        conn.start()
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), timeout)
        except (OSError, TimeoutError) as e:
            await asyncio.to_thread(fusermount_u, self.path)
            raise OSError(f"cannot mount {self.path}: {e or 'FUSE did not start'}") from None
        self._conn = conn

    async def unmount(self, meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
        """Detach the mount, run `meanwhile` (closing the sessions: a jail's mount namespace holds a
        copy of this mount, and the file system ends only once the last copy goes), then wait a
        little for the file system to end, and end it if it lingers."""
        if self._conn is None:
            if meanwhile is not None:
                await meanwhile()
            return
        await asyncio.to_thread(fusermount_u, self.path)
        if meanwhile is not None:
            await meanwhile()
        try:
            await asyncio.wait_for(asyncio.shield(self._conn.done), UNMOUNT_LINGER)
        except TimeoutError:
            # Something still uses the detached mount (a shell whose directory is in it, a file
            # held open, another process's jail): it would hold the server up for as long.
            log.info("%s: still in use after the unmount; ending it", self.path)
            self._conn.abort()
        self._conn = None


def fusermount_u(path: str) -> None:
    """Unmount, lazily: a process still inside the mount must not keep the server alive."""
    subprocess.run([K.fusermount3(), "-u", "-z", path], capture_output=True)


def clear_stale(path: str) -> None:
    """A server killed with -9 leaves its mount behind ("Transport endpoint is not connected")."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == E.ENOTCONN:
            fusermount_u(path)
