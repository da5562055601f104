"""A 9P2000 server over a Namespace, on asyncio.

    srv = await serve_unix(namespace, path)            # socket 0600 in a 0700 dir
    srv = await serve_tcp(namespace, port=5640, token=t)  # loopback unless told otherwise
    await srv.close()

Every request that may wait runs as its own task, so a blocked read (statewait) holds up nothing
else; walks and stats, which only look names up, are answered as they are read, and so are opens
and reads of a file whose content is at hand (a session's state, reply, chat). Replies are
written whole, one frame at a time; while they pile up unread no request is read or served. Tflush
cancels the flushed request's task. A client that hangs up has all its tasks cancelled and its open
files released.

TCP requires a token: each Tattach must carry it as its `aname` (compared in constant time). Tauth is
refused; a token in aname works with any 9P client, where an auth file would need a custom dialogue.

What one client can make the server hold is capped: MAX_FIDS per connection (each may hold an open
file), MAX_REQUESTS in flight per connection (each holds up to msize bytes), and connections. On the
Unix socket a connection counts as attached from its accept (its uid, from SO_PEERCRED, is its
credential), MAX_UNIX_CONNECTIONS per uid. On TCP a connection is pending until a Tattach carries the
token: MAX_TCP_CONNECTIONS attached per client (the address, all of loopback counting as one and an
IPv6 /64 as one), MAX_TCP_TOTAL attached or pending in all. A connection over the cap of attached
ones gets its first request answered with an Rerror saying so, then is closed. Pending connections
never lock anyone out: one still pending ATTACH_TIMEOUT seconds after its accept is closed, and when
the total is full a new connection evicts a pending one (of the client with the most: first one that
sent a wrong token, else its oldest) rather than being refused. A wrong token is answered after
BAD_TOKEN_DELAY seconds, during which nothing more is read from that connection, and the connection
is closed after BAD_TOKENS of them: it slows its sender alone, and a right token is checked at once
whatever others sent. A burst of requests is dispatched FRAMES_PER_TURN at a time, so one client
cannot hold the loop.
"""

from __future__ import annotations

import asyncio
import errno as E
import getpass
import hmac
import ipaddress
import logging
import os
import socket
import stat as S
import struct
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import config
from . import ninep as P
from .namespace import FsError, Handle, Namespace, OpenMode, check_name
from .namespace import Stat as NsStat

log = logging.getLogger(__name__)

_MIN_MSIZE = 256  # room for a header, a stat entry and a short error
_MAX_ENAME = 1024

MAX_FIDS = 4096  # per connection
MAX_REQUESTS = 1024  # in flight per connection (Tflush is always taken: it ends requests)
FRAMES_PER_TURN = 64  # frames one connection has dispatched before the loop's other callbacks run
MAX_UNIX_CONNECTIONS = 256  # per uid
MAX_TCP_CONNECTIONS = 16  # attached, per address (every loopback address counts as one)
MAX_TCP_TOTAL = 256  # attached or pending, from all addresses together
# A 9P client attaches in two round trips (Tversion, Tattach): milliseconds on loopback, under a
# second across the world. 5 s leaves room for a loaded server or a slow link; what guards the token
# holder against connections that never attach is eviction, the deadline only takes their slots back.
ATTACH_TIMEOUT = 5.0  # seconds from accept to attach on TCP, else the connection is closed
BAD_TOKEN_DELAY = 1.0  # seconds the answer to a wrong token waits; that connection is not read meanwhile
BAD_TOKENS = 3  # wrong tokens on one connection, then it is closed
_SHORT_TOKEN = 20  # characters; a shorter token is logged as guessable (the generated one has 32)
_REFUSE_TIMEOUT = 5.0  # how long a refused connection may take to send the request its answer goes to
_REFUSALS = 16  # connections refused with an answer at once, in all; more are closed unanswered


@dataclass(slots=True)
class _Fid:
    path: str
    qid: P.Qid
    opened: bool = False
    handle: Handle | None = None  # None when open on a directory
    remove_on_close: bool = False
    dir_entries: list[bytes] = field(default_factory=list)  # the listing a directory read walks through
    dir_next: int = 0  # the entry the next read starts at
    dir_offset: int = 0


def _qid(st: NsStat) -> P.Qid:
    return P.Qid(P.QTDIR if st.is_dir else P.QTFILE, st.version & 0xFFFFFFFF, st.qid)


def _join(path: str, name: str) -> str:
    check_name(name)
    return path.rstrip("/") + "/" + name


def _open_mode(mode: int) -> OpenMode:
    access = {
        P.OREAD: OpenMode.READ,
        P.OWRITE: OpenMode.WRITE,
        P.ORDWR: OpenMode.READ | OpenMode.WRITE,
        P.OEXEC: OpenMode.READ,
    }[mode & 3]
    return access | OpenMode.TRUNC if mode & P.OTRUNC else access


class _Connection(asyncio.Protocol):
    """One client: its fids, its running requests, and the negotiated msize.

    Frames are taken as the socket delivers them (`data_received`) and answered there when they
    only look names up, or open or read a file whose content is at hand (`_MAYBE_NOW`); any other
    request becomes a task. While replies pile up unread, reading
    stops and no waiting request is served (`pause_writing`)."""

    def __init__(self, server: NinePServer):
        self.server = server
        self.ns, self.token, self.user = server.namespace, server.token, server.user
        self.client = ""  # who connected, once the server has counted the connection
        self.standing = ""  # as the server counts it: "attached", "pending", "refused"; "" once let go
        self.refusal: str | None = None
        self.deadline: asyncio.TimerHandle | None = None  # closes it unless it attaches first (TCP)
        self.checking = asyncio.Lock()  # one token check at a time: a wrong token's wait holds up the next
        self.bad_tokens = 0
        self.penalty = False  # a wrong token's answer waits: nothing more is read meanwhile
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.msize = 0  # 0 until Tversion
        self.fids: dict[int, _Fid] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.unstarted = 0  # tasks whose handler has not started: a request read after them waits its turn
        self.writable = asyncio.Event()
        self.writable.set()
        self.held = False  # a Tversion is resetting the connection: nothing more is read meanwhile
        self.versioning: asyncio.Task | None = None  # the task doing it
        self.deferred = False  # a burst of frames goes on in a later turn of the loop
        self.done = asyncio.get_running_loop().create_future()  # set once all is released

    @property
    def iounit(self) -> int:
        return self.msize - P.IOHDRSZ

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.accept(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.refusal:
            self._refuse()
        else:
            self._take_frames()

    def eof_received(self) -> bool:
        return False  # close: a client that has stopped sending is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()  # requests waiting to reply go on, and their replies are dropped
        task = asyncio.create_task(self._reset())
        task.add_done_callback(lambda _: self.done.set_result(None))

    def pause_writing(self) -> None:
        self.writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self.writable.set()
        self._update_reading()
        self._take_frames()

    # Frames

    def _taking(self) -> bool:
        """Whether frames are read and dispatched now (see `held`, `deferred`, `penalty`, `pause_writing`)."""
        return self.writable.is_set() and not self.held and not self.deferred and not self.penalty

    def _update_reading(self) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        if self._taking():
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def _take_frames(self) -> None:
        """Dispatch the whole frames in the buffer, FRAMES_PER_TURN at most: a burst from one
        client goes on after the callbacks already waiting, so it cannot hold the loop."""
        assert self.transport is not None
        for _ in range(FRAMES_PER_TURN):
            if not self._taking() or self.transport.is_closing() or len(self.buffer) < 4:
                return
            size = int.from_bytes(self.buffer[:4], "little")
            if not P.MIN_FRAME <= size <= (self.msize or P.MAX_MSIZE):
                # an impossible size: the stream cannot be resynchronised
                log.warning(
                    "9P client dropped: frame size %d outside %d..%d", size, P.MIN_FRAME, self.msize or P.MAX_MSIZE
                )
                self.transport.close()
                return
            if len(self.buffer) < size:
                return
            frame = bytes(self.buffer[:size])
            del self.buffer[:size]
            self._dispatch(frame)
        self.deferred = True
        self._update_reading()
        asyncio.get_running_loop().call_soon(self._take_deferred)

    def _take_deferred(self) -> None:
        self.deferred = False
        self._update_reading()
        self._take_frames()

    def _refuse(self) -> None:
        """Answer the first request (Tversion, whose Rerror every client reports) with the reason."""
        assert self.transport is not None and self.refusal is not None
        if len(self.buffer) >= P.MIN_FRAME and not self.transport.is_closing():
            self._write_reply(P.Rerror(self.refusal, tag=int.from_bytes(self.buffer[5:7], "little")))
            self.transport.close()

    def _dispatch(self, frame: bytes) -> None:
        try:
            msg = P.decode(frame)
        except P.ProtocolError as e:  # the size was sound, so the stream stays in step: answer and go on
            self._write_reply(P.Rerror(f"malformed message: {e}", tag=int.from_bytes(frame[5:7], "little")))
            return
        if isinstance(msg, P.Tversion):  # waits for outstanding requests: nothing is read meanwhile
            self.held = True
            self._update_reading()
            self.versioning = asyncio.create_task(self._version(msg))
        elif not self.msize:
            self._write_reply(P.Rerror("Tversion must come first", tag=msg.tag))
        elif msg.tag in self.tasks:
            self._write_reply(P.Rerror(f"tag {msg.tag} is already in use", tag=msg.tag))
        elif len(self.tasks) >= MAX_REQUESTS and not isinstance(msg, P.Tflush):
            self._write_reply(
                P.Rerror(f"too many requests in flight: at most {MAX_REQUESTS} per connection", tag=msg.tag)
            )
        elif isinstance(msg, P.Tflush) and msg.oldtag not in self.tasks:  # nothing to wait for
            self._write_reply(P.Rflush(tag=msg.tag))
        elif (answer_now := _ANSWERED_NOW.get(type(msg))) is not None and not self.unstarted:
            try:
                reply = answer_now(self, msg)
            except Exception as e:
                reply = _failure(msg, e)
            reply.tag = msg.tag
            self._write_reply(reply)
        elif (maybe := _MAYBE_NOW.get(type(msg))) is not None and not self.unstarted and self._answered(maybe, msg):
            pass
        else:
            self.unstarted += 1
            self.tasks[msg.tag] = asyncio.create_task(self._serve(msg))

    def _answered(self, handler: Callable[[_Connection, Any], P.Message | None], msg: P.Message) -> bool:
        """Answer `msg` at once if its handler can (a failure is an answer); False if it needs a task."""
        try:
            reply = handler(self, msg)
        except Exception as e:
            reply = _failure(msg, e)
        if reply is None:
            return False
        reply.tag = msg.tag
        self._write_reply(reply)
        return True

    async def _serve(self, msg: P.Message) -> None:
        try:
            try:
                await self.writable.wait()  # served only while replies are read
            finally:
                self.unstarted -= 1  # its handler starts now (or never: cancelled)
            if (answer_now := _ANSWERED_NOW.get(type(msg))) is not None:  # queued behind unstarted tasks
                reply = answer_now(self, msg)
            elif (handler := _HANDLERS.get(type(msg))) is not None:
                reply = await handler(self, msg)
            else:
                raise FsError(E.EINVAL, f"unexpected message {type(msg).__name__}")
        except Exception as e:
            reply = _failure(msg, e)
        finally:
            if self.tasks.get(msg.tag) is asyncio.current_task():
                del self.tasks[msg.tag]
        reply.tag = msg.tag
        self._write_reply(reply)

    def _write_reply(self, reply: P.Message) -> None:
        if isinstance(reply, P.Rerror):
            reply.ename = reply.ename[:_MAX_ENAME]
        try:
            frame = P.encode(reply)
            if len(frame) > (self.msize or P.MAX_MSIZE):
                raise P.ProtocolError(f"reply of {len(frame)} bytes exceeds msize")
        except P.ProtocolError as e:
            frame = P.encode(P.Rerror(str(e)[:_MAX_ENAME], tag=reply.tag))
        assert self.transport is not None
        if not self.transport.is_closing():
            self.transport.write(frame)  # one whole frame per write: replies never interleave

    async def _reset(self) -> None:
        """Abort every request and release every open file (Tversion, or the client hung up)."""
        tasks = [*self.tasks.values(), *([self.versioning] if self.versioning else [])]
        tasks = [task for task in tasks if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self.unstarted = 0  # a task cancelled before its first step never counted itself out
        fids, self.fids = list(self.fids.values()), {}
        for fid in fids:
            if fid.handle is not None:
                await fid.handle.release()

    def _fid(self, n: int) -> _Fid:
        try:
            return self.fids[n]
        except KeyError:
            raise FsError(E.EBADF, f"unknown fid {n}") from None

    def _open_fid(self, n: int) -> _Fid:
        fid = self._fid(n)
        if not fid.opened:
            raise FsError(E.EBADF, f"fid {n} is not open")
        return fid

    def _closed_fid(self, n: int) -> _Fid:
        fid = self._fid(n)
        if fid.opened:
            raise FsError(E.EBADF, f"fid {n} is open")
        return fid

    def _add_fid(self, n: int, fid: _Fid) -> None:
        if n == P.NOFID or n in self.fids:
            raise FsError(E.EBADF, f"fid {n} is already in use")
        if len(self.fids) >= MAX_FIDS:
            raise FsError(E.EMFILE, f"too many fids: at most {MAX_FIDS} per connection; clunk some")
        self.fids[n] = fid

    # Handlers

    async def _version(self, m: P.Tversion) -> None:
        try:
            await self._reset()
            self._write_reply(self._negotiate(m))
        finally:
            self.versioning = None
            self.held = False
            self._update_reading()
            self._take_frames()

    def _negotiate(self, m: P.Tversion) -> P.Message:
        if m.msize < _MIN_MSIZE:
            self.msize = 0
            return P.Rerror(f"msize {m.msize} is below the minimum of {_MIN_MSIZE}", tag=m.tag)
        if not m.version.startswith(P.VERSION):  # 9P2000.u and .L are answered with plain 9P2000
            self.msize = 0
            return P.Rversion(min(m.msize, P.MAX_MSIZE), "unknown", tag=m.tag)
        self.msize = min(m.msize, P.MAX_MSIZE)
        return P.Rversion(self.msize, P.VERSION, tag=m.tag)

    async def _auth(self, m: P.Tauth) -> P.Message:
        if self.token is None:
            raise FsError(E.EINVAL, "authentication not required")
        raise FsError(E.EACCES, "no Tauth here: attach with the token as aname")

    async def _attach(self, m: P.Tattach) -> P.Message:
        if m.afid != P.NOFID:
            raise FsError(E.EINVAL, "no authentication files: afid must be NOFID")
        if self.token is not None:
            async with self.checking:  # attaches pipelined on this connection are checked in turn
                if self.bad_tokens >= BAD_TOKENS:  # it is being closed: no more looks at the token
                    raise FsError(E.EACCES, f"{BAD_TOKENS} wrong tokens: this connection is closed")
                if not hmac.compare_digest(m.aname.encode(), self.token.encode()):
                    await self._wrong_token()
                self.server.attached(self)
        qid = _qid(await self.ns.stat("/"))
        self._add_fid(m.fid, _Fid("/", qid))
        return P.Rattach(qid)

    async def _wrong_token(self) -> None:
        """Slow the sender: its answer waits BAD_TOKEN_DELAY, nothing more is read from it meanwhile,
        and after BAD_TOKENS the connection is closed. A pending connection that sent one is the first
        its client's new connections evict. Others, and a right token from anyone, are not held up."""
        self.bad_tokens += 1
        self.server.suspect(self)
        self.penalty = True
        self._update_reading()
        try:
            await asyncio.sleep(BAD_TOKEN_DELAY)
        finally:  # after the answer is written (or the request is cancelled)
            asyncio.get_running_loop().call_soon(self._end_penalty)
        raise FsError(E.EACCES, "permission denied: attach with the server's token as aname")

    def _end_penalty(self) -> None:
        assert self.transport is not None
        if self.bad_tokens >= BAD_TOKENS:
            self.transport.close()
            return
        self.penalty = False
        self._update_reading()
        self._take_frames()

    def close_after_reply(self) -> None:
        """Close once the reply now being written has gone (it is written in this same step)."""
        assert self.transport is not None
        asyncio.get_running_loop().call_soon(self.transport.close)

    async def _flush(self, m: P.Tflush) -> P.Message:
        task = self.tasks.get(m.oldtag)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])
        return P.Rflush()

    def _walk(self, m: P.Twalk) -> P.Message:
        fid = self._closed_fid(m.fid)
        if m.newfid != m.fid and m.newfid in self.fids:
            raise FsError(E.EBADF, f"fid {m.newfid} is already in use")
        path, stats = self.ns.walk_stats(fid.path, m.wname)
        qids = [_qid(st) for st in stats]
        if len(qids) < len(m.wname):
            return P.Rwalk(qids)  # a partial walk: newfid is not made
        walked = _Fid(path, qids[-1] if qids else fid.qid)
        if m.newfid == m.fid:
            self.fids[m.fid] = walked
        else:
            self._add_fid(m.newfid, walked)
        return P.Rwalk(qids)

    async def _open(self, m: P.Topen) -> P.Message:
        fid = self._closed_fid(m.fid)
        fid.opened = True  # claimed now: a concurrent Topen on this fid must not open a second handle
        try:
            st = await self.ns.stat(fid.path)
            if st.is_dir:
                if m.mode & 3 not in (P.OREAD, P.OEXEC) or m.mode & P.OTRUNC:
                    raise FsError(E.EISDIR, f"{fid.path}: is a directory")
            else:
                fid.handle = await self.ns.open(fid.path, _open_mode(m.mode))
                await self._still_held(m.fid, fid)
        except BaseException:
            fid.opened = False
            raise
        fid.qid, fid.remove_on_close = _qid(st), bool(m.mode & P.ORCLOSE)
        return P.Ropen(fid.qid, self.iounit)

    def _open_now(self, m: P.Topen) -> P.Message | None:
        """A file whose open needs no waiting (File.open_now), opened as the request comes."""
        fid = self._closed_fid(m.fid)
        st = self.ns.stat_now(fid.path)
        if st.is_dir:
            return None
        handle = self.ns.open_now(fid.path, _open_mode(m.mode))
        if handle is None:
            return None
        fid.opened, fid.handle = True, handle
        fid.qid, fid.remove_on_close = _qid(st), bool(m.mode & P.ORCLOSE)
        return P.Ropen(fid.qid, self.iounit)

    async def _create(self, m: P.Tcreate) -> P.Message:
        fid = self._closed_fid(m.fid)
        path = _join(fid.path, m.name)
        fid.opened = True
        try:
            if m.perm & P.DMDIR:
                await self.ns.mkdir(path, m.perm & 0o777)
            else:
                fid.handle = await self.ns.create(path, m.perm & 0o777)
                await self._still_held(m.fid, fid)
            st = await self.ns.stat(path)
        except BaseException:
            if fid.handle is not None:
                await fid.handle.release()
            fid.opened, fid.handle = False, None
            raise
        fid.path, fid.qid, fid.remove_on_close = path, _qid(st), bool(m.mode & P.ORCLOSE)
        return P.Rcreate(fid.qid, self.iounit)

    async def _still_held(self, n: int, fid: _Fid) -> None:
        """After an open that waited: if the fid was clunked or removed meanwhile, nothing would
        ever release the handle, so release it now and fail the open."""
        if self.fids.get(n) is not fid and fid.handle is not None:
            handle, fid.handle = fid.handle, None
            await handle.release()
            raise FsError(E.EBADF, f"fid {n} was clunked while it opened")

    async def _read(self, m: P.Tread) -> P.Message:
        fid = self._open_fid(m.fid)
        count = min(m.count, self.iounit)
        if fid.handle is None:
            return P.Rread(await self._read_dir(fid, m.offset, count))
        return P.Rread((await fid.handle.read(m.offset, count))[:count])

    def _read_now(self, m: P.Tread) -> P.Message | None:
        """A read that needs no waiting (Handle.read_now), answered as the request comes."""
        fid = self._open_fid(m.fid)
        if fid.handle is None:
            return None
        count = min(m.count, self.iounit)
        data = fid.handle.read_now(m.offset, count)
        return None if data is None else P.Rread(data[:count])

    async def _read_dir(self, fid: _Fid, offset: int, count: int) -> bytes:
        """Whole stat entries, as many as fit; offset 0 takes a fresh listing."""
        if offset == 0:
            fid.dir_entries = [entry for st in await self.ns.list(fid.path) if (entry := self._encoded(st))]
            fid.dir_next = fid.dir_offset = 0
        elif offset != fid.dir_offset:
            raise FsError(E.EINVAL, "directory reads must continue where the last one ended")
        out, entries = bytearray(), fid.dir_entries
        while fid.dir_next < len(entries) and len(out) + len(entries[fid.dir_next]) <= count:
            out += entries[fid.dir_next]
            fid.dir_next += 1
        if not out and fid.dir_next < len(entries):
            raise FsError(E.EINVAL, f"read count {count} is too small for a directory entry")
        fid.dir_offset += len(out)
        return bytes(out)

    def _encoded(self, st: NsStat) -> bytes | None:
        """A listing's entry, or None for a name 9P cannot carry (not UTF-8: one a sandboxed
        process made on disk); the mount, which speaks bytes, still lists it."""
        try:
            return self._entry(st).encode()
        except P.ProtocolError:
            return None

    async def _write(self, m: P.Twrite) -> P.Message:
        fid = self._open_fid(m.fid)
        if fid.handle is None:
            raise FsError(E.EISDIR, f"{fid.path}: is a directory")
        return P.Rwrite(await fid.handle.write(m.offset, m.data))

    async def _clunk(self, m: P.Tclunk) -> P.Message:
        fid = self.fids.pop(m.fid, None)  # the fid goes even if closing fails
        if fid is None:
            raise FsError(E.EBADF, f"unknown fid {m.fid}")
        if fid.handle is not None:
            try:
                await fid.handle.flush()  # where `prompt` submits: its error is the Rclunk's
            finally:
                await fid.handle.release()
        if fid.remove_on_close:
            await self.ns.remove(fid.path)
        return P.Rclunk()

    async def _remove(self, m: P.Tremove) -> P.Message:
        fid = self.fids.pop(m.fid, None)
        if fid is None:
            raise FsError(E.EBADF, f"unknown fid {m.fid}")
        if fid.handle is not None:
            await fid.handle.release()
        await self.ns.remove(fid.path)
        return P.Rremove()

    def _stat(self, m: P.Tstat) -> P.Message:
        return P.Rstat(self._entry(self.ns.stat_now(self._fid(m.fid).path)))

    async def _wstat(self, m: P.Twstat) -> P.Message:
        """Rename within the directory, and truncate; mode, owner and type changes are refused and
        times are ignored (so that `touch` works)."""
        fid, want = self._fid(m.fid), m.stat
        have = self._entry(await self.ns.stat(fid.path))
        for attr, unchanged in (("mode", 0xFFFFFFFF), ("uid", ""), ("gid", ""), ("type", 0xFFFF), ("dev", 0xFFFFFFFF)):
            if getattr(want, attr) not in (unchanged, getattr(have, attr)):
                raise FsError(E.EPERM, f"{fid.path}: cannot change {attr}")
        if want.length != 0xFFFFFFFFFFFFFFFF and want.length != have.length:
            if fid.handle is not None:
                await fid.handle.truncate(want.length)
            else:
                await self.ns.truncate(fid.path, want.length)
        if want.name and want.name != have.name:
            new = _join(fid.path.rsplit("/", 1)[0], want.name)
            await self.ns.rename(fid.path, new)
            self._moved(fid.path, new)
        return P.Rwstat()

    def _moved(self, old: str, new: str) -> None:
        for fid in self.fids.values():
            if fid.path == old or fid.path.startswith(old + "/"):
                fid.path = new + fid.path[len(old) :]

    def _entry(self, st: NsStat) -> P.Stat:
        mode = (P.DMDIR if st.is_dir else 0) | S.S_IMODE(st.mode)
        mtime = int(st.mtime) & 0xFFFFFFFF
        return P.Stat(
            qid=_qid(st),
            mode=mode,
            atime=mtime,
            mtime=mtime,
            length=0 if st.is_dir else st.size,
            name=st.name,
            uid=self.user,
            gid=self.user,
            muid=self.user,
        )


def _failure(msg: P.Message, e: Exception) -> P.Rerror:
    if isinstance(e, FsError):
        return P.Rerror(e.message)
    if isinstance(e, P.ProtocolError):
        return P.Rerror(str(e))
    log.error("9P %s failed", type(msg).__name__, exc_info=e)  # a bug in a store costs one request
    return P.Rerror(f"internal error: {e}")


# A handler takes the T-message of its key and returns its R-message. Walks and stats only look
# up nodes, so they are answered as they are read, without a task of their own.
_ANSWERED_NOW: dict[type[P.Message], Callable[[_Connection, Any], P.Message]] = {
    P.Twalk: _Connection._walk,
    P.Tstat: _Connection._stat,
}
# Answered as they come when they can be (the handler gives None when it cannot: then by a task),
# since a task waits its turn behind all the loop has to do: opening and reading a file whose
# content is at hand (a session's state, reply, chat).
_MAYBE_NOW: dict[type[P.Message], Callable[[_Connection, Any], P.Message | None]] = {
    P.Topen: _Connection._open_now,
    P.Tread: _Connection._read_now,
}
_HANDLERS: dict[type[P.Message], Callable[[_Connection, Any], Awaitable[P.Message]]] = {
    P.Tauth: _Connection._auth,
    P.Tattach: _Connection._attach,
    P.Tflush: _Connection._flush,
    P.Topen: _Connection._open,
    P.Tcreate: _Connection._create,
    P.Tread: _Connection._read,
    P.Twrite: _Connection._write,
    P.Tclunk: _Connection._clunk,
    P.Tremove: _Connection._remove,
    P.Twstat: _Connection._wstat,
}


def _peer(transport: asyncio.BaseTransport) -> str | None:
    """Who is connecting, as the connection caps count them: "uid N" on a Unix socket, the
    address on TCP (see `client_of`). None if the peer is already gone."""
    sock = transport.get_extra_info("socket")
    if sock.family == socket.AF_UNIX:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return f"uid {uid}"
    peer = transport.get_extra_info("peername")
    return client_of(peer[0]) if peer else None


def client_of(host: str) -> str:
    """A TCP client as the caps count it: its address, but every loopback address is one client
    ("loopback": any local process may bind any of 127.0.0.0/8) and an IPv6 /64, which one host
    commonly has to itself, is one."""
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.version == 4:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/64", strict=False))


class NinePServer:
    """A listening 9P server. `address` is the socket path or the bound (host, port).

    Connections are counted per client as attached (on the Unix socket, from the accept), pending
    (on TCP, until a Tattach carries the token) or refused (over the cap of attached ones, waiting
    for the request their refusal answers). Attached and pending together are at most `max_total`;
    refused ones at most _REFUSALS more."""

    def __init__(self, namespace: Namespace, token: str | None, max_connections: int, max_total: int):
        self.namespace, self.token = namespace, token
        self.user = getpass.getuser()
        self.address: str | tuple[str, int] = ""
        self._max_connections, self._max_total = max_connections, max_total  # attached per client; in all
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()  # every connection not yet done, counted or not
        self._attached: Counter[str] = Counter()
        # per client, in the order they are evicted: those that sent a wrong token, then the oldest
        self._pending: dict[str, OrderedDict[_Connection, None]] = {}
        self._n_pending = 0
        self._refused = 0
        self._closing = False

    def accept(self, conn: _Connection) -> None:
        """Count a new connection: attached (Unix socket), pending (TCP), or refused with a reason
        (over the cap of attached ones); or close it. A full total evicts a pending connection
        rather than refuse: connections that never attach lock no one out."""
        assert conn.transport is not None
        try:
            client = _peer(conn.transport)
        except OSError:  # gone already
            client = None
        if self._closing or client is None:
            conn.transport.close()
            return
        if self._attached[client] >= self._max_connections:
            conn.refusal = f"too many connections from {client}: at most {self._max_connections}; close some first"
        elif self._attached.total() + self._n_pending >= self._max_total and not self._evict_one():
            conn.refusal = f"too many connections: at most {self._max_total} in all; close some first"
        if conn.refusal:
            if self._refused >= _REFUSALS:
                conn.transport.close()
                return
            asyncio.get_running_loop().call_later(_REFUSE_TIMEOUT, conn.transport.close)
            self._refused += 1
            conn.standing = "refused"
        elif self.token is None:
            self._attached[client] += 1
            conn.standing = "attached"
        else:
            self._pending.setdefault(client, OrderedDict())[conn] = None
            self._n_pending += 1
            conn.standing = "pending"
            conn.deadline = asyncio.get_running_loop().call_later(ATTACH_TIMEOUT, self._expire, conn)
        conn.client = client
        self._connections.add(conn)
        conn.done.add_done_callback(lambda _: self._gone(conn))

    def attached(self, conn: _Connection) -> None:
        """A pending connection's Tattach carried the token: count it attached, or refuse the attach
        (and close the connection) if its client has as many as it may."""
        if conn.standing == "attached":
            return  # a second Tattach, or one after a Tversion
        if conn.standing != "pending":
            raise FsError(E.ECONNABORTED, "the connection is closed")
        if self._attached[conn.client] >= self._max_connections:
            conn.close_after_reply()
            raise FsError(
                E.EAGAIN,
                f"too many connections from {conn.client}: at most {self._max_connections}; close some first",
            )
        self._unpend(conn)
        self._attached[conn.client] += 1
        conn.standing = "attached"

    def suspect(self, conn: _Connection) -> None:
        """conn sent a wrong token: if it is pending, it is the first its client's connections evict."""
        if conn.standing == "pending":
            self._pending[conn.client].move_to_end(conn, last=False)

    def _evict_one(self) -> bool:
        """Close a pending connection of the client with the most; False if none is pending."""
        if not self._pending:
            return False
        client = max(self._pending, key=lambda c: len(self._pending[c]))
        victim = next(iter(self._pending[client]))
        log.debug("9P connection from %s evicted: it has not attached and the connections are full", client)
        self._let_go(victim)
        return True

    def _expire(self, conn: _Connection) -> None:
        if conn.standing == "pending":
            log.debug("9P connection from %s closed: not attached within %s s", conn.client, ATTACH_TIMEOUT)
            self._let_go(conn)

    def _let_go(self, conn: _Connection) -> None:
        """Stop counting a pending connection and drop it at once: whatever it has not read is lost."""
        assert conn.transport is not None
        self._unpend(conn)
        conn.standing = ""
        conn.transport.abort()

    def _unpend(self, conn: _Connection) -> None:
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None
        pending = self._pending[conn.client]
        del pending[conn]
        self._n_pending -= 1
        if not pending:
            del self._pending[conn.client]

    def _gone(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if conn.standing == "pending":
            self._unpend(conn)
        elif conn.standing == "attached":
            self._attached[conn.client] -= 1
            if not self._attached[conn.client]:
                del self._attached[conn.client]
        elif conn.standing == "refused":
            self._refused -= 1
        conn.standing = ""

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        connections = list(self._connections)
        for conn in connections:
            assert conn.transport is not None
            conn.transport.close()
        await asyncio.gather(*(conn.done for conn in connections))
        if isinstance(self.address, str):
            try:
                os.unlink(self.address)
            except FileNotFoundError:
                pass


async def _clear_stale_socket(path: Path) -> None:
    if not path.exists():
        return
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        path.unlink()  # nobody listens: left by a server that died
        return
    try:  # a version exchange, so the live server has taken the connection before we hang up
        writer.write(P.encode(P.Tversion(P.MAX_MSIZE, P.VERSION, tag=P.NOTAG)))
        await asyncio.wait_for(P.read_frame(reader, P.MAX_MSIZE), 2)
    except (TimeoutError, OSError, EOFError, P.ProtocolError):
        pass
    finally:
        writer.close()
    raise OSError(E.EADDRINUSE, f"{path}: a server is already listening")


async def serve_unix(namespace: Namespace, path: str | os.PathLike) -> NinePServer:
    """Serve `namespace` on a Unix socket (0600, in a 0700 directory)."""
    path = Path(path)
    config.private_dir(path.parent)  # under a shared /tmp: refused if another user made it first
    await _clear_stale_socket(path)
    srv = NinePServer(namespace, None, MAX_UNIX_CONNECTIONS, MAX_UNIX_CONNECTIONS)
    srv._server = await asyncio.get_running_loop().create_unix_server(lambda: _Connection(srv), str(path))
    os.chmod(path, 0o600)
    srv.address = str(path)
    return srv


async def serve_tcp(namespace: Namespace, host: str = "127.0.0.1", port: int = 0, *, token: str) -> NinePServer:
    """Serve `namespace` on TCP; every Tattach must carry `token` as its aname. Port 0 picks one."""
    if not token:
        raise ValueError("serving 9P over TCP requires a token")
    if len(token) < _SHORT_TOKEN:  # wrong tokens slow only their connection: guessing is as fast as connecting
        log.warning("the 9P token has %d characters: one that short can be guessed; use a long random one", len(token))
    srv = NinePServer(namespace, token, MAX_TCP_CONNECTIONS, MAX_TCP_TOTAL)
    srv._server = await asyncio.get_running_loop().create_server(lambda: _Connection(srv), host, port)
    srv.address = srv._server.sockets[0].getsockname()[:2]
    return srv
