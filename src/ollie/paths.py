"""Paths decided once, by descriptor.

Every path that crosses the sandbox's boundary (a sub-agent's cwd, each grant of a policy, the
directories the jail hides) is opened once into an O_PATH descriptor, checked through that
descriptor, and what was checked is what is used: the Landlock rule is added on the descriptor,
the jail mounts only the inode it names, a session keeps the real path read back from it. A path
is never resolved a second time across a yield to other code, and a symlink is followed only
where sandboxed code cannot have planted it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_OPENAT2 = 437  # the same on every arch
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_FLAGS = os.O_PATH | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own resolution
_FUSE_SUPER_MAGIC = 0x65735546


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class LinkRefused(OSError):
    """A path leads through a symlink where none may be followed."""


class PlantedLink(LinkRefused):
    """A path leads through a symlink in a directory sandboxed code may write (its filename)."""


Identity = tuple[int, int]  # (st_dev, st_ino): which file, whatever path names it


Decided = tuple[int, ...] | None  # what a sandbox's grant was decided on (`as_decided`)


def as_decided(path: str) -> Decided:
    """What a granted path was decided on: which file it names (symlinks followed), and for a
    regular file its size and change time too (a configuration judged free of secrets is judged
    again once it changes, whichever name it keeps); None if none."""
    try:
        return decided(os.stat(path))
    except OSError:
        return None


def decided(st: os.stat_result) -> tuple[int, ...]:
    """`as_decided` for the file `st` is of."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else (st.st_dev, st.st_ino)


def write_new(path: Path, data: bytes) -> None:
    """`data` as the file `path`, unless it is there (a file named by its content, which holds the
    same): written whole under a temporary name, then renamed, so no reader sees half of it. A write
    that fails (a full disk) leaves no half of it behind either."""
    if path.exists():
        return
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def identity(fd: int) -> Identity:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def real_path(fd: int) -> str:
    """The path the kernel gives the file `fd` is open on, now."""
    return os.readlink(f"/proc/self/fd/{fd}")


def resolved(path: str) -> str:
    """os.path.realpath(path), "" where a link was swapped for a directory under its feet (EINVAL)."""
    try:
        return os.path.realpath(path)
    except OSError:
        return ""


def open_real(path: str, beneath: int | None = None, links: bool = False) -> int:
    """An O_PATH descriptor of `path`, refusing every symlink on the way (ELOOP): for paths kept
    real (a session's cwd), in which a symlink can only have been planted since. With `beneath`
    (a directory descriptor), `path` is relative to it and may not leave it; with `links` too, a
    symlink that stays beneath it is followed."""
    resolve = (0 if links else _RESOLVE_NO_SYMLINKS) | _RESOLVE_NO_MAGICLINKS
    resolve |= _RESOLVE_BENEATH if beneath is not None else 0
    how = _OpenHow(_FLAGS, 0, resolve)
    base = beneath if beneath is not None else -100  # AT_FDCWD
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(base), os.fsencode(path), ctypes.byref(how), ctypes.c_long(24)
    )
    if fd < 0:
        e = ctypes.get_errno()
        if e == errno.ENOSYS:  # Linux < 5.6: the same, a component at a time
            return _walk(path, beneath, lambda *_: links and beneath is not None)[0]
        if e == errno.ELOOP:
            raise LinkRefused(e, "a symlink on the way", path)
        raise OSError(e, os.strerror(e), path)
    return fd


def open_real_dir(path: str) -> int:
    """A readable descriptor of the directory at the real path `path` (to list, or to open and
    make files beneath), refusing every symlink on the way (ELOOP), as `open_real`."""
    found = open_real(path)
    try:
        return os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
    finally:
        os.close(found)


def read_beneath(
    directory: str, name: str, limit: int, hidden: dict[Identity, str], linked: bool = False
) -> tuple[bytes, int]:
    """The first `limit` bytes of the regular file `name` in `directory`, and its size, for text
    ollie reads on the user's behalf from a directory sandboxed code may write (a project's
    AGENTS.md, a skill): `directory` is reached through no symlink (`linked`: one of the user's
    own, reached as they set it up), `name` through one only while it stays beneath it, and a file
    in one of the `hidden` directories is refused (PermissionError), so that a planted link cannot
    make ollie read what the sandbox may not (its keys, your other projects' instructions, ollie's
    own mount) into text the sandbox reads back. Opened without blocking (a FIFO is refused, not
    waited on)."""
    try:
        top = os.open(directory, _FLAGS | os.O_DIRECTORY) if linked else open_real(directory)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PermissionError(errno.EACCES, "it is reached through a symlink", directory) from None
        raise
    try:
        fd = open_real(name, beneath=top, links=True)
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.ELOOP):
            raise PermissionError(errno.EACCES, "it is a symlink that leads out of its directory", name) from None
        raise
    finally:
        os.close(top)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.path.join(directory, name))
        if (where := within(fd, hidden)) is not None:
            raise PermissionError(errno.EACCES, f"it lies in ollie's hidden {where}", os.path.join(directory, name))
        data = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(fd)
    try:
        pieces, left = [], limit
        while left > 0 and (piece := os.read(data, left)):
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces), st.st_size
    finally:
        os.close(data)


def open_regular(
    path: str, hidden: dict[Identity, str] | None = None, planted: dict[Identity, str] | None = None
) -> tuple[int, os.stat_result] | None:
    """A descriptor to read the regular file `path` (links followed) and its stat, for a file of the
    user's that code may have replaced: looked at first by an O_PATH descriptor (opening a device
    may act, a FIFO wait), then opened from it without blocking; None if it is missing, no regular
    file, lies on a mount of ollie's file server (`on_server_mount`) or in one of the `hidden`
    directories (ollie's own, whose contents the caller would pass on). With `planted`, a symlink in
    one of those directories (where code may write, and so point it anywhere) is not followed: None.
    The caller closes the descriptor."""
    try:
        if planted is None:
            found = os.open(path, _FLAGS)
        else:
            opened = open_following(path, lambda parent: within(parent, planted))
            found = opened.fd
            for parent, _ in opened.links:
                os.close(parent)
    except OSError:
        return None
    try:
        st = os.fstat(found)
        if not stat.S_ISREG(st.st_mode) or on_server_mount(found, st) or (hidden and within(found, hidden) is not None):
            return None
        return os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY), st
    except OSError:
        return None
    finally:
        os.close(found)


def on_server_mount(fd: int, st: os.stat_result) -> bool:
    """Whether the file open at `fd` (`st` its stat) lies on a mount of an ollie file server (FUSE,
    fsname "ollie"): reading a file there acts (`fifo.out` pops a session's queued prompt,
    `worktree` commits) or waits (`statewait`), and the server is ollie itself. Only a FUSE file
    system can be one (its type, asked of the descriptor; a disk's device, major number not 0, never
    is); then the mount table decides, by device. Unsure (no /proc), a FUSE file counts as one."""
    if os.major(st.st_dev) != 0 or _fs_type(fd) not in (_FUSE_SUPER_MAGIC, None):
        return False
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}".encode()
    for line in lines:
        fields, _, fs = line.partition(b" - ")
        kind, source = (fs.split(b" ") + [b"", b""])[:2]
        if fields.split(b" ")[2:3] == [device] and kind.startswith(b"fuse") and b"ollie" in (kind[5:], source):
            return True
    return False


def _fs_type(fd: int) -> int | None:
    """The type (f_type, a magic number) of the file system `fd` lies on; None if fstatfs fails."""
    buf = ctypes.create_string_buffer(256)  # struct statfs begins with its type, a word
    if _libc.fstatfs(fd, buf) != 0:
        return None
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


@dataclass(slots=True)
class Opened:
    """A path opened once: its descriptor, the real path it had then, and the directories in
    which a symlink was followed on the way (descriptors too, for the caller to judge and close)."""

    fd: int
    path: str
    links: list[tuple[int, str]]  # (descriptor of the link's directory, the link's path)

    def close(self) -> None:
        os.close(self.fd)
        for fd, _ in self.links:
            os.close(fd)
        self.links.clear()


def open_following(path: str, refuse: Callable[[int], str | None] = lambda _: None) -> Opened:
    """`path` opened as the kernel would resolve it, a component at a time, remembering where a
    symlink was followed: whether sandboxed code could have planted one there is the caller's
    question (`grants`), answered on these descriptors. A link whose directory `refuse` names a
    reason for is not followed at all (LinkRefused, its path and that reason as the message)."""
    links: list[tuple[int, str]] = []

    def remember(parent: int, link: str) -> bool:
        if (why := refuse(parent)) is not None:
            raise PlantedLink(errno.ELOOP, why, link)
        links.append((os.dup(parent), link))
        return True

    try:
        fd, _ = _walk(path, None, remember)
    except BaseException:
        for parent, _ in links:
            os.close(parent)
        raise
    return Opened(fd, real_path(fd), links)


def _walk(path: str, beneath: int | None, follow: Callable[[int, str], bool]) -> tuple[int, int]:
    """Open `path` one component at a time with O_NOFOLLOW; at a symlink, `follow(dir_fd, link)`
    says whether to go on through it (else ELOOP). Returns (fd, links followed)."""
    if beneath is None and not os.path.isabs(path):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    root = os.open("/", _FLAGS) if beneath is None else os.dup(beneath)
    todo = [p for p in path.split("/") if p and p != "."]
    fd, followed = os.dup(root), 0
    try:
        while todo:
            name = todo.pop(0)
            if name == "..":
                if beneath is not None and identity(fd) == identity(root):
                    raise OSError(errno.EXDEV, "leads outside", path)
                nxt = os.open("..", _FLAGS, dir_fd=fd)
            else:
                nxt = os.open(name, _FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            if stat.S_ISLNK(os.fstat(nxt).st_mode):
                os.close(nxt)
                followed += 1
                if followed > _MAX_LINKS or not follow(fd, f"{real_path(fd).rstrip('/')}/{name}"):
                    raise LinkRefused(errno.ELOOP, "a symlink on the way", path)
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    if beneath is not None:
                        raise OSError(errno.EXDEV, "leads outside", path)
                    os.close(fd)
                    fd = os.dup(root)
                todo[:0] = [p for p in target.split("/") if p and p != "."]
                continue
            os.close(fd)
            fd = nxt
        return fd, followed
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.close(root)


def within(fd: int, ancestors: dict[Identity, str]) -> str | None:
    """The path of the first of `ancestors` (by identity) that is the file `fd` or a directory
    above it, walking up by descriptor (no path is read, so no rename or link can mislead it);
    None if none is."""
    if not ancestors:
        return None
    here = os.dup(fd)
    try:
        seen = identity(here)
        while True:
            if seen in ancestors:
                return ancestors[seen]
            up = os.open("..", _FLAGS, dir_fd=here) if stat.S_ISDIR(os.fstat(here).st_mode) else _parent_of(here)
            os.close(here)
            here = up
            above = identity(here)
            if above == seen:  # the root is its own parent
                return None
            seen = above
    finally:
        os.close(here)


def _parent_of(fd: int) -> int:
    """The directory of a file that is not one (a granted file): by its path, the only way."""
    return os.open(os.path.dirname(real_path(fd)) or "/", _FLAGS | os.O_DIRECTORY)


def path_identity(path: str) -> Identity | None:
    """Which file `path` names now (symlinks followed), or None if none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def real_identity(path: str) -> Identity | None:
    """Which file the real path `path` names now, or None if none, or if a symlink lies on its way
    (one planted since it was decided: followed, it could lead into ollie's own mount, whose
    requests the event loop that asks would have to answer)."""
    try:
        fd = open_real(path)
    except OSError:
        return None
    try:
        return identity(fd)
    finally:
        os.close(fd)


# What a cwd kept as a real path (a session's) that a symlink now lies on is.
LINKED_CWD = (
    "is reached through a symlink ({}): one put in place of a directory since the cwd was set (or a "
    "cwd stored by an older ollie); set it again"
)


def first_link(path: str) -> str | None:
    """The first symlink on `path`'s way, each part looked at by `lstat`, none followed past it
    (a link could lead into ollie's own mount); None if there is none, or a part is missing."""
    parts = path.split("/")
    for n in range(2, len(parts) + 1):
        part = "/".join(parts[:n])
        try:
            if stat.S_ISLNK(os.lstat(part).st_mode):
                return part
        except OSError:
            return None
    return None


def real_dir_problem(path: str) -> str | None:
    """What keeps the real path `path` from being a directory now, reached without a symlink
    ("does not exist", `LINKED_CWD`, "is not a directory"), or None. As `real_identity`, it never
    follows a link planted since into ollie's own mount."""
    try:
        fd = open_real(path)
    except LinkRefused:
        return LINKED_CWD.format(first_link(path) or "?")
    except OSError:
        return "does not exist"
    try:
        return None if stat.S_ISDIR(os.fstat(fd).st_mode) else "is not a directory"
    finally:
        os.close(fd)


def identities(paths: Iterable[str]) -> dict[Identity, str]:
    """Which files `paths` name now (symlinks followed: these are ollie's own, set by the user),
    by identity; paths that do not exist are left out."""
    found: dict[Identity, str] = {}
    for path in paths:
        if (ident := path_identity(path)) is not None:
            found.setdefault(ident, path)
    return found
