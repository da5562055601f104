"""An asyncio 9P2000 client: requests are tagged, so any number may be outstanding at once.

    c = await Client.connect("unix!/tmp/ns.me.:0/ollie", token="")
    fid = await c.walk("s/1/state")
    await c.open(fid, OREAD)
    data = await c.read(fid, 0, 8192)
    await c.clunk(fid)
    await c.close()

A request whose caller is cancelled is flushed (Tflush), and its tag is reused only once the
server has answered the flush. Addresses are dial strings: `unix!/path`, `tcp!host!port`, or
`host:port`.
"""

from __future__ import annotations

import asyncio
import errno as E
import getpass
import itertools
from typing import TypeVar

from . import ninep as P
from .namespace import FsError

_R = TypeVar("_R", bound=P.Message)


class RemoteError(FsError):
    """The server answered Rerror (or the connection failed): `ename` says why, and `errno` what
    it means where known (read from an Rerror's words), else EIO."""

    def __init__(self, ename: str, errno: int = E.EIO):
        super().__init__(errno, ename)
        self.ename = ename

    @classmethod
    def answered(cls, ename: str) -> RemoteError:
        text = ename.lower()
        return cls(ename, next((n for phrase, n in _ERRNOS if phrase in text), E.EIO))


# Rerror carries only text; these phrases (the ones our server and Plan 9 use) recover its errno.
_ERRNOS = (
    ("too large", E.EFBIG),
    ("too long", E.EFBIG),
    ("too many fids", E.EMFILE),
    ("too many", E.EAGAIN),
    ("is relative", E.EINVAL),
    ("unknown fid", E.EBADF),
    ("no such file", E.ENOENT),
    ("does not exist", E.ENOENT),
    ("not found", E.ENOENT),
    ("no session", E.ENOENT),
    ("is a directory", E.EISDIR),
    ("not a directory", E.ENOTDIR),
    ("already exists", E.EEXIST),
    ("not empty", E.ENOTEMPTY),
    ("permission denied", E.EACCES),
    ("read-only", E.EACCES),
    ("only within one directory", E.EXDEV),
    ("is running", E.EBUSY),
    ("cannot change", E.EPERM),
    ("cannot", E.EACCES),
    ("connection", E.ENOTCONN),
    ("unknown", E.EINVAL),
    ("invalid", E.EINVAL),
    ("expected", E.EINVAL),
)


def parse_address(addr: str) -> tuple[str, str, int]:
    """("unix", path, 0) or ("tcp", host, port) from a dial string or host:port."""
    parts = addr.split("!")
    if parts[0] == "unix" and len(parts) == 2 and parts[1]:
        return "unix", parts[1], 0
    if parts[0] == "tcp" and len(parts) == 3:
        return "tcp", parts[1], _port(parts[2], addr)
    if len(parts) == 1 and addr.startswith("/"):
        return "unix", addr, 0
    host, sep, port = addr.rpartition(":")
    if len(parts) == 1 and sep and host:
        return "tcp", host.strip("[]"), _port(port, addr)
    raise ValueError(f"{addr!r}: expected unix!/path, tcp!host!port or host:port")


def _port(text: str, addr: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{addr!r}: bad port {text!r}")
    return int(text)


async def dial(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    kind, where, port = parse_address(addr)
    if kind == "unix":
        return await asyncio.open_unix_connection(where)
    return await asyncio.open_connection(where, port)


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.msize = P.MAX_MSIZE
        self.root = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._tags = itertools.cycle(range(P.NOTAG))
        self._fids = itertools.count(1)
        self._free_fids: list[int] = []
        self._flushes: set[asyncio.Task] = set()
        self._failed: RemoteError | None = None
        self._receiver: asyncio.Task | None = None

    @classmethod
    async def connect(cls, addr: str, *, token: str = "", msize: int = P.MAX_MSIZE) -> Client:
        """Dial, negotiate the version and attach the root (with `token` as aname)."""
        reader, writer = await dial(addr)
        client = cls(reader, writer)
        try:
            await client.start(token, msize)
        except BaseException:
            await client.close()
            raise
        return client

    async def start(self, token: str = "", msize: int = P.MAX_MSIZE) -> None:
        self.writer.write(P.encode(P.Tversion(msize, P.VERSION, tag=P.NOTAG)))
        reply = P.decode(await P.read_frame(self.reader, msize))
        if isinstance(reply, P.Rerror):
            raise RemoteError.answered(reply.ename)
        if not isinstance(reply, P.Rversion) or reply.version != P.VERSION or reply.msize > msize:
            raise RemoteError(f"server does not speak {P.VERSION}: {reply}", E.EPROTO)
        self.msize = reply.msize
        self._receiver = asyncio.create_task(self._receive())
        await self.rpc(P.Tattach(self.root, P.NOFID, getpass.getuser(), token), P.Rattach)

    @property
    def iounit(self) -> int:
        return self.msize - P.IOHDRSZ

    async def close(self) -> None:
        for task in [*self._flushes, self._receiver]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*self._flushes, *([self._receiver] if self._receiver else []), return_exceptions=True)
        self.writer.close()
        self._fail(RemoteError("connection closed", E.ENOTCONN))

    async def wait_lost(self) -> None:
        """Returns when the connection is gone (the server hung up, or close())."""
        if self._receiver is not None:
            await asyncio.shield(self._receiver)

    async def _receive(self) -> None:
        try:
            while True:
                reply = P.decode(await P.read_frame(self.reader, self.msize))
                future = self._pending.get(reply.tag)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (EOFError, ConnectionError, P.ProtocolError) as e:
            self._fail(RemoteError(f"9P connection lost: {e or 'end of stream'}", E.ENOTCONN))

    def _fail(self, error: RemoteError) -> None:
        self._failed = self._failed or error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._failed)

    def _tag(self) -> int:
        for _ in range(P.NOTAG):
            tag = next(self._tags)
            if tag not in self._pending:
                return tag
        raise RemoteError("all 9P tags are in use", E.EAGAIN)

    async def rpc(self, msg: P.Message, answer: type[_R]) -> _R:
        """Send `msg`, wait for its reply, which must be an `answer` (msg's R-message); Rerror
        raises RemoteError. Cancelling sends a Tflush."""
        if self._failed:
            raise self._failed
        msg.tag = self._tag()
        future = self._pending[msg.tag] = asyncio.get_running_loop().create_future()
        self.writer.write(P.encode(msg))
        try:
            await self.writer.drain()
            reply = await future
        except asyncio.CancelledError:
            self._flush_later(msg.tag)
            raise
        except BaseException:
            del self._pending[msg.tag]
            raise
        del self._pending[msg.tag]
        if isinstance(reply, P.Rerror):
            raise RemoteError.answered(reply.ename)
        if not isinstance(reply, answer):
            raise RemoteError(f"{type(msg).__name__} answered by {type(reply).__name__}", E.EPROTO)
        return reply

    def _flush_later(self, oldtag: int) -> None:
        """Abandon a request: its tag stays reserved until the server answers the Tflush."""

        async def flush() -> None:
            try:
                await self.rpc(P.Tflush(oldtag), P.Rflush)
            except RemoteError:
                pass
            finally:
                self._pending.pop(oldtag, None)
                self._flushes.discard(task)

        task = asyncio.create_task(flush())
        self._flushes.add(task)

    # Fids

    def _new_fid(self) -> int:
        return self._free_fids.pop() if self._free_fids else next(self._fids)

    async def walk(self, path: str | list[str], fid: int | None = None) -> int:
        """A new fid for `path` relative to `fid` (default: the root)."""
        names = [p for p in path.split("/") if p and p != "."] if isinstance(path, str) else list(path)
        start, newfid = self.root if fid is None else fid, self._new_fid()
        try:
            for i in range(0, max(len(names), 1), P.MAXWELEM):
                chunk = names[i : i + P.MAXWELEM]
                reply = await self.rpc(P.Twalk(start if i == 0 else newfid, newfid, chunk), P.Rwalk)
                if len(reply.wqid) != len(chunk):
                    missing = "/".join(names[: i + len(reply.wqid) + 1])
                    raise RemoteError(f"{missing}: no such file or directory", E.ENOENT)
        except asyncio.CancelledError:
            # Abandoned in flight: the server may have walked it before the flush came.
            self._clunk_after_flushes(newfid)
            raise
        except BaseException:
            if i > 0:  # the fid exists once the first chunk has been walked
                await self.clunk(newfid)
            else:
                self._free_fids.append(newfid)
            raise
        return newfid

    def _clunk_after_flushes(self, fid: int) -> None:
        """Clunk a fid whose walk or clunk was abandoned in flight, once the flushes under way are
        answered (after Rflush a request is done or dropped), then free it: it may exist or not."""
        flushes = list(self._flushes)

        async def clunk() -> None:
            try:
                await asyncio.gather(*flushes)
                await self.rpc(P.Tclunk(fid), P.Rclunk)
            except (RemoteError, OSError):
                pass  # never walked, already clunked, or the connection is gone
            finally:
                self._free_fids.append(fid)
                self._flushes.discard(task)

        task = asyncio.create_task(clunk())
        self._flushes.add(task)

    async def open(self, fid: int, mode: int = P.OREAD) -> int:
        """Open `fid`; returns the iounit."""
        return (await self.rpc(P.Topen(fid, mode), P.Ropen)).iounit or self.iounit

    async def create(self, fid: int, name: str, perm: int = 0o644, mode: int = P.OWRITE) -> int:
        """Create `name` in directory `fid`, which becomes the new file, open; returns the iounit."""
        return (await self.rpc(P.Tcreate(fid, name, perm, mode), P.Rcreate)).iounit or self.iounit

    async def read(self, fid: int, offset: int, count: int) -> bytes:
        return (await self.rpc(P.Tread(fid, offset, min(count, self.iounit)), P.Rread)).data

    async def write(self, fid: int, offset: int, data: bytes) -> int:
        done = 0
        while done < len(data) or not data:
            n = (await self.rpc(P.Twrite(fid, offset + done, data[done : done + self.iounit]), P.Rwrite)).count
            done += n
            if n == 0:
                break
        return done

    async def clunk(self, fid: int) -> None:
        try:
            await self.rpc(P.Tclunk(fid), P.Rclunk)
        except asyncio.CancelledError:
            self._clunk_after_flushes(fid)  # its flush may have dropped the Tclunk
            raise
        except BaseException:
            self._free_fids.append(fid)  # a clunk frees the fid even when it fails
            raise
        self._free_fids.append(fid)

    async def remove(self, fid: int) -> None:
        try:
            await self.rpc(P.Tremove(fid), P.Rremove)
        finally:
            self._free_fids.append(fid)

    async def stat(self, fid: int) -> P.Stat:
        return (await self.rpc(P.Tstat(fid), P.Rstat)).stat

    async def wstat(self, fid: int, stat: P.Stat) -> None:
        await self.rpc(P.Twstat(fid, stat), P.Rwstat)

    # Whole-path conveniences: each walks a fid, acts, and clunks it

    async def stat_path(self, path: str) -> P.Stat:
        fid = await self.walk(path)
        try:
            return await self.stat(fid)
        finally:
            await self.clunk(fid)

    async def read_all(self, fid: int) -> bytes:
        out, offset = bytearray(), 0
        while chunk := await self.read(fid, offset, self.iounit):
            out += chunk
            offset += len(chunk)
        return bytes(out)

    async def read_path(self, path: str) -> bytes:
        fid = await self.walk(path)
        try:
            await self.open(fid, P.OREAD)
            return await self.read_all(fid)
        finally:
            await self.clunk(fid)

    async def list(self, path: str) -> list[P.Stat]:
        fid = await self.walk(path)
        try:
            await self.open(fid, P.OREAD)
            return P.decode_stats(await self.read_all(fid))
        finally:
            await self.clunk(fid)

    async def rename(self, path: str, new_name: str) -> None:
        fid = await self.walk(path)
        try:
            await self.wstat(fid, P.Stat.unchanged(name=new_name))
        finally:
            await self.clunk(fid)
