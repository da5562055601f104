"""The protocol-independent namespace: a tree of directories backed by stores, and files.

Both frontends (the FUSE mount in `fuse.py`, the 9P server in `ninep_server.py`) serve one
`Namespace`; neither knows what a session is. Everything here runs on the server's asyncio loop.

Paths are absolute, "/"-separated strings ("/" is the root, "/s/<id>/chat" a session's chat).

    ns = Namespace(root_dir)
    st   = await ns.stat(path)              # Stat; never reads a file's content
    st   = ns.stat_now(path)                # the same, synchronous and safe from any thread (it
                                            # only reads): FUSE answers getattr without a loop hop
    path, stats = ns.walk_stats(path, names)  # 9P's Twalk: each name looked up in the one before,
                                            # synchronous too; stops at the first that fails
    ents = await ns.list(path)              # list[Stat] of a directory, in listing order
    h    = await ns.open(path, OpenMode.READ | OpenMode.WRITE | OpenMode.TRUNC)   # Handle
    h    = await ns.create(path, mode=0o644)  # a new file, opened for writing
    await ns.mkdir(path)                     # a new directory
    await ns.remove(path)                    # a file, or a directory (`rm -r s/<id>` kills it)
    await ns.rename(old, new)                # within one directory's store (mv a/x a/y; mv s/<id> s/<name>)
    await ns.truncate(path, size)            # setattr size / 9P wstat length

A Handle is one open of one file:

    data = await h.read(offset, count)   # may block (statewait); cancel the task to abandon it
    n    = await h.write(offset, data)   # may raise FsError: control files act per complete line,
                                         # here, so the writing process sees the failure (shells
                                         # never check close())
    await h.truncate(size)               # ftruncate(2) of this open file (FUSE, 9P wstat of an open fid)
    await h.flush()                      # a close(2) of a descriptor (FUSE flush, 9P clunk): acts on
                                         # pending data (`prompt` submits); may raise FsError. It acts
                                         # only on what was written, so FUSE skips it (noflush) for
                                         # read-only opens
    await h.release()                    # the last close; never raises

Mapping onto the protocols:
  FUSE  getattr→stat, readdir→list, open→open, create→create, read/write→read/write, flush→flush,
        release→release, unlink/rmdir→remove, rename→rename, mkdir→mkdir, truncate→truncate
        (ftruncate→the handle's truncate).
        Handles with `direct_io` true are opened with direct_io (no page cache, size not trusted).
  9P    walk→stat of each element, open→open (OTRUNC→TRUNC), create→create or mkdir (DMDIR),
        read of a directory→list, read/write→read/write, clunk→flush then release (a flush error
        becomes the Rclunk's Rerror), remove→remove, stat→stat, wstat: name→rename within the
        parent, length→truncate (of the handle, on an open fid). Tflush cancels the task running the read.

Stores implement Dir (`lookup` is synchronous and side-effect free, `list`/`create`/`remove`/
`rename` are async) and File (`stat`, `open`, `truncate`). Errors are FsError(errno, message): the
message is for humans (9P's Rerror ename, the server log), the errno for FUSE.
"""

from __future__ import annotations

import enum
import errno as E
import functools
import hashlib
import os
import stat as S
import time
from dataclasses import dataclass
from typing import Protocol

from ..types import OllieError


class FsError(OllieError):
    """A failed file operation: `errno` for FUSE, `message` for 9P and the log."""

    def __init__(self, errno: int, message: str = ""):
        super().__init__(message or E.errorcode.get(errno, str(errno)))
        self.errno = errno
        self.message = message or os.strerror(errno)


class OpenMode(enum.IntFlag):
    READ = 1
    WRITE = 2
    TRUNC = 4  # O_TRUNC / 9P OTRUNC: only disk files honour it (synthetic files ignore it)
    APPEND = 8


@dataclass(slots=True)
class Stat:
    """What a stat reports. `size` is honest where it is cheap (chat's on-disk size, the length of
    an in-memory value) and 0 where knowing it would mean reading (models, fifo.out, context)."""

    name: str
    is_dir: bool = False
    mode: int = 0o444  # permission bits only
    size: int = 0
    mtime: float = 0.0
    qid: int = 0  # stable per path: the 9P qid path / FUSE inode
    version: int = 0  # bumps when the content changes, where known (9P qid version)

    @property
    def st_mode(self) -> int:
        return (S.S_IFDIR if self.is_dir else S.S_IFREG) | self.mode


@functools.lru_cache(maxsize=1 << 16)  # a walk asks for each element's: hash a path once
def qid_of(path: str) -> int:
    return int.from_bytes(hashlib.blake2b(os.fsencode(path), digest_size=8).digest(), "little") >> 1


class Handle:
    """One open file. Subclasses override what they support; the defaults refuse."""

    direct_io = True  # FUSE: bypass the page cache (synthetic, growing or blocking content)

    async def read(self, offset: int, count: int) -> bytes:
        raise FsError(E.EBADF, "not open for reading")

    def read_now(self, offset: int, count: int) -> bytes | None:
        """`read`, when it needs no waiting (None: await `read`). A file server answers such a
        read as it comes, without a task: under load, a task waits its turn behind everything
        the loop has to do."""
        return None

    async def write(self, offset: int, data: bytes) -> int:
        raise FsError(E.EBADF, "not open for writing")

    async def truncate(self, size: int) -> None:
        """Synthetic content ignores truncation, as File.truncate does."""

    async def flush(self) -> None:
        return None

    async def release(self) -> None:
        return None


class File:
    """A file node. `open` returns a Handle; the default mode is read-only."""

    mode = 0o444

    def stat(self, name: str) -> Stat:
        return Stat(name, mode=self.mode, size=self.size(), mtime=self.mtime())

    def size(self) -> int:
        return 0

    def mtime(self) -> float:
        return _START

    async def open(self, mode: OpenMode) -> Handle:
        raise FsError(E.EACCES, "cannot open")

    def open_now(self, mode: OpenMode) -> Handle | None:
        """`open`, when it needs no waiting (None: await `open`; see Handle.read_now)."""
        return None

    async def truncate(self, size: int) -> None:
        """Synthetic files ignore truncation: `echo x > file` opens with O_TRUNC and must not
        empty anything (a weak spot of the Go server)."""


class Dir:
    """A directory node; a store. `lookup` resolves names that `list` may hide (s/new, s/idx)."""

    mode = 0o555

    def stat(self, name: str) -> Stat:
        return Stat(name, is_dir=True, mode=self.mode, mtime=self.mtime())

    def mtime(self) -> float:
        return _START

    def lookup(self, name: str) -> File | Dir:
        """Resolve a name: synchronous and side-effect free (it may run on a FUSE thread)."""
        raise FsError(E.ENOENT, f"{name}: no such file")

    async def list(self) -> list[tuple[str, File | Dir]]:
        return []

    async def create(self, name: str, mode: int) -> Handle:
        raise FsError(E.EACCES, f"{name}: cannot create files here")

    async def mkdir(self, name: str, mode: int) -> None:
        raise FsError(E.EACCES, f"{name}: cannot create directories here")

    async def remove(self, name: str) -> None:
        raise FsError(E.EACCES, f"{name}: cannot remove")

    async def rename(self, old: str, new: str) -> None:
        raise FsError(E.EACCES, f"{old}: cannot rename")


_START = time.time()


class StaticDir(Dir):
    """A fixed set of named children (the root, a session directory)."""

    def __init__(self, children: dict[str, File | Dir] | None = None):
        self.children = dict(children or {})

    def lookup(self, name: str) -> File | Dir:
        try:
            return self.children[name]
        except KeyError:
            raise FsError(E.ENOENT, f"{name}: no such file") from None

    async def list(self) -> list[tuple[str, File | Dir]]:
        return list(self.children.items())


def check_name(name: str) -> str:
    """One path element, returned: 1 to 255 characters, not "." or "..", no "/" or NUL."""
    if not 0 < len(name) <= 255 or name in (".", "..") or "/" in name or "\0" in name:
        raise FsError(E.EINVAL, f"{name!r}: not a valid file name")
    return name


def split(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise FsError(E.EINVAL, f"{path}: '.' and '..' are not allowed in paths")
    return parts


class Tree(Protocol):
    """What a mount serves: a Namespace in this process, or one reached over 9P (remote.py)."""

    async def stat(self, path: str) -> Stat: ...
    async def list(self, path: str) -> list[Stat]: ...
    async def open(self, path: str, mode: OpenMode) -> Handle: ...
    async def create(self, path: str, mode: int = 0o644) -> Handle: ...
    async def mkdir(self, path: str, mode: int = 0o755) -> None: ...
    async def remove(self, path: str) -> None: ...
    async def rename(self, old: str, new: str) -> None: ...
    async def truncate(self, path: str, size: int) -> None: ...


class Namespace:
    """The tree as the protocols see it: path-based operations over a root Dir."""

    def __init__(self, root: Dir):
        self.root = root

    def walk(self, path: str) -> File | Dir:
        node: File | Dir = self.root
        for part in split(path):
            if not isinstance(node, Dir):
                raise FsError(E.ENOTDIR, f"{part}: parent is not a directory")
            node = node.lookup(part)
        return node

    async def _parent(self, path: str) -> tuple[Dir, str]:
        parts = split(path)
        if not parts:
            raise FsError(E.EBUSY, "the root cannot be changed")
        parent = self.walk("/".join(parts[:-1]))
        if not isinstance(parent, Dir):
            raise FsError(E.ENOTDIR, f"{path}: parent is not a directory")
        return parent, parts[-1]

    async def stat(self, path: str) -> Stat:
        return self.stat_now(path)

    def stat_now(self, path: str) -> Stat:
        node = self.walk(path)
        parts = split(path)
        st = node.stat(parts[-1] if parts else "/")
        st.qid = qid_of("/" + "/".join(parts))
        return st

    def walk_stats(self, path: str, names: list[str]) -> tuple[str, list[Stat]]:
        """Walk `names` from `path`, each looked up in the node before it (".." steps to the
        parent; the root is its own): the path reached and a stat per name. A name that fails
        ends the walk there, short of `names`; it raises only if it is the first."""
        parts, node = split(path), self.walk(path)
        stats: list[Stat] = []
        for name in names:
            try:
                next_node, next_parts = self._step(node, parts, name)
                st = next_node.stat(next_parts[-1] if next_parts else "/")
            except FsError:
                if not stats:
                    raise
                break
            node, parts = next_node, next_parts
            st.qid = qid_of("/" + "/".join(parts))
            stats.append(st)
        return "/" + "/".join(parts), stats

    def _step(self, node: File | Dir, parts: list[str], name: str) -> tuple[File | Dir, list[str]]:
        if name == "..":
            return self.walk("/".join(parts[:-1])), parts[:-1]
        check_name(name)
        if not isinstance(node, Dir):
            raise FsError(E.ENOTDIR, f"{name}: parent is not a directory")
        return node.lookup(name), [*parts, name]

    async def list(self, path: str) -> list[Stat]:
        node = self.walk(path)
        if not isinstance(node, Dir):
            raise FsError(E.ENOTDIR, f"{path}: not a directory")
        base = "/" + "/".join(split(path))
        out = []
        for name, child in await node.list():
            st = child.stat(name)
            st.qid = qid_of(base.rstrip("/") + "/" + name)
            out.append(st)
        return out

    async def open(self, path: str, mode: OpenMode) -> Handle:
        node = self.walk(path)
        if isinstance(node, Dir):
            raise FsError(E.EISDIR, f"{path}: is a directory")
        if mode & OpenMode.TRUNC:
            await node.truncate(0)
        return await node.open(mode)

    def open_now(self, path: str, mode: OpenMode) -> Handle | None:
        """`open`, when the file opens without waiting (None: await `open`)."""
        node = self.walk(path)
        if isinstance(node, Dir):
            raise FsError(E.EISDIR, f"{path}: is a directory")
        return None if mode & OpenMode.TRUNC else node.open_now(mode)

    async def create(self, path: str, mode: int = 0o644) -> Handle:
        parent, name = await self._parent(path)
        return await parent.create(name, mode)

    async def mkdir(self, path: str, mode: int = 0o755) -> None:
        parent, name = await self._parent(path)
        await parent.mkdir(name, mode)

    async def remove(self, path: str) -> None:
        parent, name = await self._parent(path)
        await parent.remove(name)

    async def rename(self, old: str, new: str) -> None:
        old_parent, old_name = await self._parent(old)
        new_parent, new_name = await self._parent(new)
        if old_parent is not new_parent:
            raise FsError(E.EXDEV, f"{old} -> {new}: rename only within one directory")
        if old_name != new_name:
            await old_parent.rename(old_name, new_name)

    async def truncate(self, path: str, size: int) -> None:
        node = self.walk(path)
        if isinstance(node, Dir):
            raise FsError(E.EISDIR, f"{path}: is a directory")
        await node.truncate(size)
