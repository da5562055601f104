"""Another server's namespace, reached over 9P: the same operations as `Namespace`, so the one FUSE
adapter (`fuse.Mount`) serves a remote tree exactly as it serves the local one.

    ns = await RemoteNamespace.connect("tcp!host!5640", token=t)
    mount = Mount(ns, "/mnt/there"); await mount.start()

Every path operation walks a fresh fid from the root and clunks it. An open file keeps its fid;
since 9P acts on written data only at clunk (where `prompt` submits), a close(2) after writes
clunks the fid, and a later use of the same open file reopens it.
"""

from __future__ import annotations

import errno as E
import functools

from . import ninep as P
from .namespace import FsError, Handle, OpenMode, Stat, split
from .ninep_client import Client, RemoteError


def _fs_errors(fn):
    """Present the client's RemoteError as the FsError the FUSE adapter understands."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except RemoteError as e:
            raise FsError(e.errno, e.ename) from None

    return wrapper


def _stat(st: P.Stat) -> Stat:
    return Stat(
        st.name,
        is_dir=bool(st.mode & P.DMDIR),
        mode=st.mode & 0o777,
        size=st.length,
        mtime=st.mtime,
        qid=st.qid.path,
        version=st.qid.vers,
    )


def _p9_mode(mode: OpenMode) -> int:
    rw = mode & (OpenMode.READ | OpenMode.WRITE)
    access = {OpenMode.WRITE: P.OWRITE, OpenMode.READ | OpenMode.WRITE: P.ORDWR}.get(rw, P.OREAD)
    return access | P.OTRUNC if mode & OpenMode.TRUNC else access


class RemoteHandle(Handle):
    direct_io = True  # the remote content is synthetic, growing or blocking: never cache it

    def __init__(self, client: Client, path: str, mode: int, fid: int | None):
        self.client, self.path, self.mode, self.fid = client, path, mode, fid
        self._dirty = False

    async def _open_fid(self) -> int:
        if self.fid is None:
            fid = await self.client.walk(self.path)
            try:
                await self.client.open(fid, self.mode & ~P.OTRUNC)  # truncating was for the first open only
            except BaseException:
                await self.client.clunk(fid)
                raise
            self.fid = fid
        return self.fid

    @_fs_errors
    async def read(self, offset: int, count: int) -> bytes:
        return await self.client.read(await self._open_fid(), offset, count)

    @_fs_errors
    async def write(self, offset: int, data: bytes) -> int:
        n = await self.client.write(await self._open_fid(), offset, data)
        self._dirty = True
        return n

    @_fs_errors
    async def truncate(self, size: int) -> None:
        await self.client.wstat(await self._open_fid(), P.Stat.unchanged(length=size))

    @_fs_errors
    async def flush(self) -> None:
        if self._dirty and self.fid is not None:
            fid, self.fid, self._dirty = self.fid, None, False
            await self.client.clunk(fid)  # the server acts on the data now; its error is this close's

    async def release(self) -> None:
        if self.fid is not None:
            fid, self.fid = self.fid, None
            try:
                await self.client.clunk(fid)
            except RemoteError:
                pass  # release never fails; the data, if any, was acted on at flush


class RemoteNamespace:
    """The Namespace operations, each one a few 9P requests to the remote server."""

    def __init__(self, client: Client):
        self.client = client

    @classmethod
    async def connect(cls, addr: str, token: str = "") -> RemoteNamespace:
        return cls(await Client.connect(addr, token=token))

    async def close(self) -> None:
        await self.client.close()

    async def wait_lost(self) -> None:
        """Returns when the connection to the server is gone."""
        await self.client.wait_lost()

    @staticmethod
    def _parent(path: str) -> tuple[str, str]:
        parts = split(path)
        if not parts:
            raise FsError(E.EBUSY, "the root cannot be changed")
        return "/".join(parts[:-1]), parts[-1]

    @_fs_errors
    async def stat(self, path: str) -> Stat:
        return _stat(await self.client.stat_path(path))

    @_fs_errors
    async def list(self, path: str) -> list[Stat]:
        return [_stat(st) for st in await self.client.list(path)]

    @_fs_errors
    async def open(self, path: str, mode: OpenMode) -> Handle:
        handle = RemoteHandle(self.client, path, _p9_mode(mode), None)
        fid = await self.client.walk(path)
        try:
            await self.client.open(fid, handle.mode)
        except BaseException:
            await self.client.clunk(fid)
            raise
        handle.fid = fid
        return handle

    @_fs_errors
    async def create(self, path: str, mode: int = 0o644) -> Handle:
        parent, name = self._parent(path)
        fid = await self.client.walk(parent)
        try:
            await self.client.create(fid, name, mode & 0o777, P.ORDWR)
        except BaseException:
            await self.client.clunk(fid)
            raise
        return RemoteHandle(self.client, path, P.ORDWR, fid)

    @_fs_errors
    async def mkdir(self, path: str, mode: int = 0o755) -> None:
        parent, name = self._parent(path)
        fid = await self.client.walk(parent)
        try:
            await self.client.create(fid, name, P.DMDIR | mode & 0o777, P.OREAD)
        finally:
            await self.client.clunk(fid)

    @_fs_errors
    async def remove(self, path: str) -> None:
        self._parent(path)
        await self.client.remove(await self.client.walk(path))

    @_fs_errors
    async def rename(self, old: str, new: str) -> None:
        old_parent, _ = self._parent(old)
        new_parent, new_name = self._parent(new)
        if old_parent != new_parent:
            raise FsError(E.EXDEV, f"{old} -> {new}: rename only within one directory")
        await self.client.rename(old, new_name)

    @_fs_errors
    async def truncate(self, path: str, size: int) -> None:
        fid = await self.client.walk(path)
        try:
            await self.client.wstat(fid, P.Stat.unchanged(length=size))
        finally:
            await self.client.clunk(fid)
