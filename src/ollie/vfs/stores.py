"""Generic stores and files: synthetic text, control files, write-on-close files, disk directories.

Everything here knows nothing of sessions: ollie's tree (`ollie.fs`) fills a namespace with these.

Whatever a writer sends is held in memory until it is acted on, so every such file has a cap: a
control line LINE_MAX, an agent config CONFIG_MAX, and what its maker gives an OnCloseFile. Past
the cap the write fails with EFBIG (its message, over 9P, names the limit). What all of one
writer's open files hold together is bounded too (`Held`): the writer is whoever's connection
`HELD` names (the server's own, or a session tree's view), so that one tree's code fills only its
own budget (ENOSPC past it), never everyone's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno as E
import itertools
import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path

from .namespace import Dir, File, FsError, Handle, OpenMode, Stat, check_name

log = logging.getLogger("ollie.vfs")

Getter = Callable[[], str | Awaitable[str]]

KiB, MiB = 1 << 10, 1 << 20
LINE_MAX = 64 * KiB  # one line of a control file (ctl, cfg, env, s/new)
CONFIG_MAX = 1 * MiB  # an agent config (a/<name>.json)
WRITTEN_MAX = 256 * MiB  # what the server's own connections (the mount, 9P) hold written, all together
TREE_HELD_MAX = 64 * MiB  # what one session tree's code makes the server hold: writes, and job specs kept
LIST_MAX = 10_000  # entries of a directory on disk one listing reads (m/ and pl/ are the sandbox's to fill)


def size_text(n: int) -> str:
    """1048576 -> "1 MiB": limits as the docs state them."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


class Held:
    """A budget of bytes held for writers and not yet acted on: written to open files not closed
    yet (a prompt, a plan, a partial control line) and, for a session tree, the specs of its jobs
    kept in memory. A charge past `cap` fails with ENOSPC and charges nothing."""

    def __init__(self, cap: int, refusal: str):
        self.cap = cap
        self.refusal = refusal  # what a charge past the cap fails with; {cap} is the cap
        self.bytes = 0

    def charge(self, n: int, force: bool = False) -> None:
        """Take `n` bytes (give them back with a negative `n`); `force`: past the cap too (what is
        held already, found again at a restart)."""
        if n > 0 and self.bytes + n > self.cap and not force:
            raise FsError(E.ENOSPC, self.refusal.format(cap=size_text(self.cap)))
        self.bytes += n


SERVER_HELD = Held(WRITTEN_MAX, "the file server holds {cap} written to files not closed yet: close some")
# Whose budget a write is charged to: the server's, unless the connection serving it (a session's
# view, fuse.serve_connection) runs its requests in a context that names its session tree's.
HELD: contextvars.ContextVar[Held] = contextvars.ContextVar("ollie_held", default=SERVER_HELD)


class LineBuffer:
    """Complete lines out of written chunks, in linear time: only the new chunk is searched for a
    newline, and a partial line grows in place (charged to the writer's budget until complete).
    A line longer than LINE_MAX, or past the budget, fails the write and every later one to this
    open file, so that the tail of a refused line is never read as commands."""

    def __init__(self):
        self._partial = bytearray()
        self._refused: FsError | None = None
        self._held = HELD.get()

    def feed(self, data: bytes) -> list[bytes]:
        if self._refused:
            raise self._refused
        lines, start = [], 0
        while (nl := data.find(b"\n", start)) >= 0:
            self._grow(data, start, nl)
            lines.append(bytes(self._partial))
            self.clear()
            start = nl + 1
        self._grow(data, start, len(data))
        return lines

    def rest(self) -> bytes:
        """The last line, unterminated (at close); empty after a refused line."""
        rest = bytes(self._partial)
        self.clear()
        return rest

    def clear(self) -> None:
        """Drop the partial line, giving back what it held (at a handle's release)."""
        self._held.charge(-len(self._partial))
        self._partial.clear()

    def _grow(self, data: bytes, start: int, end: int) -> None:
        try:
            if len(self._partial) + end - start > LINE_MAX:
                raise FsError(
                    E.EFBIG,
                    f"line too long: control lines are at most {size_text(LINE_MAX)}; "
                    "this open file takes no more writes",
                )
            self._held.charge(end - start)
        except FsError as e:
            self._refused = e
            self.clear()
            raise
        self._partial += data[start:end]


async def _value(get: Getter) -> str:
    v = get()
    return v if isinstance(v, str) else await v


class SnapshotHandle(Handle):
    """Reads a snapshot of the content, taken at the first read at offset 0 (again at every later
    read at offset 0, so a reader that rereads from the start sees fresh content)."""

    def __init__(self, get: Getter):
        self._get = get
        self._data = b""
        # A file that answers its writes: where the last write ended, where the answer being
        # read starts (0, or there), and where the last read ended (a read there goes on).
        self._written_to = self._answer_at = 0
        self._read_to = -1

    async def read(self, offset: int, count: int) -> bytes:
        if offset == 0:
            self._data = (await _value(self._get)).encode()
        return self._data[offset : offset + count]

    def _wrote(self, offset: int, size: int) -> None:
        self._written_to, self._read_to = offset + size, -1

    async def _read_answer(self, offset: int, count: int) -> bytes:
        """For a file that answers what is written to it (ctl, new): the answer starts at 0, and
        also where the last write ended, where the writer's own offset is (a shell's `read id
        <&3` after `echo new … >&3` cannot seek); a read where the last one ended goes on."""
        if offset != self._read_to:
            self._answer_at = self._written_to if offset and offset == self._written_to else 0
        data = await SnapshotHandle.read(self, offset - self._answer_at if offset >= self._answer_at else offset, count)
        self._read_to = offset + len(data)
        return data


class TextFile(File):
    """Read-only synthetic text. `size` is given only when knowing it is cheap (never by reading:
    stat of `models` must not call the backend)."""

    def __init__(self, get: Getter, size: Callable[[], int] | None = None, mode: int = 0o444):
        self._get = get
        self._size = size
        self.mode = mode

    def size(self) -> int:
        return self._size() if self._size else 0

    async def open(self, mode: OpenMode) -> Handle:
        return self.open_now(mode)

    def open_now(self, mode: OpenMode) -> Handle:
        if mode & OpenMode.WRITE:
            raise FsError(E.EACCES, "read-only file")
        return TextHandle(self._get)


class TextHandle(SnapshotHandle):
    """A TextFile's: read at once when its text is at hand (`read_now`)."""

    def __init__(self, get: Getter):
        super().__init__(get)
        self._pending: Awaitable[str] | None = None  # what the getter gave instead of text

    def read_now(self, offset: int, count: int) -> bytes | None:
        if offset == 0:
            value = self._get()
            if not isinstance(value, str):
                self._pending = value  # `read` awaits it: the getter ran once either way
                return None
            self._data = value.encode()
        return self._data[offset : offset + count]

    async def read(self, offset: int, count: int) -> bytes:
        if offset == 0 and self._pending is not None:
            pending, self._pending = self._pending, None
            self._data = (await pending).encode()
            return self._data[:count]
        return await super().read(offset, count)

    async def release(self) -> None:
        pending, self._pending = self._pending, None
        if isinstance(pending, Coroutine):  # the read was interrupted before it awaited it
            pending.close()


def text_size(get: Callable[[], str]) -> Callable[[], int]:
    """A size function for in-memory values: the encoded length, computed without side effects."""
    return lambda: len(get().encode())


class CtlHandle(SnapshotHandle):
    """Acts on each complete line as it is written, so a bad command fails the write(2) the
    writer is waiting on. A last line without newline is acted on at close. Reading gives what
    the commands answered (e.g. a new session's id, or `error: …` for one refused), or `get()`
    before any command ran. The answers are kept until the last close, charged to the writer's
    budget (`HELD`) as written data is: a writer that never reads would pile them up (`help`, a
    line after line); past the budget a write fails with ENOSPC, its command run but its answer
    not kept."""

    def __init__(self, act: Callable[[str], Awaitable[str | None]], get: Getter | None):
        super().__init__(self._answers)
        self._act = act
        self._read_get = get
        self._lines = LineBuffer()
        self._out: list[str] = []
        self._held = HELD.get()

    async def _answers(self) -> str:
        if self._out or self._read_get is None:
            return "".join(self._out)
        return await _value(self._read_get)

    async def write(self, offset: int, data: bytes) -> int:
        for line in self._lines.feed(data):
            await self._run(line, tell=True)
        self._wrote(offset, len(data))
        return len(data)

    async def read(self, offset: int, count: int) -> bytes:
        return await self._read_answer(offset, count)

    async def flush(self) -> None:
        await self._run(self._lines.rest())  # at a close: nobody reads a refusal back

    async def release(self) -> None:
        self._lines.clear()
        self._held.charge(-sum(map(len, self._out)))
        self._out.clear()

    async def _run(self, raw: bytes, tell: bool = False) -> None:
        line = raw.decode(errors="replace").strip()
        if not line:
            return
        try:
            out = await self._act(line)
        except FsError as e:  # a mount's writer sees only the errno: reading the file back says why
            if tell:
                with contextlib.suppress(FsError):  # past the writer's budget: the errno alone
                    self._keep(f"error: {e}")
            raise
        if out:
            self._keep(out)

    def _keep(self, out: str) -> None:
        out = out if out.endswith("\n") else out + "\n"
        self._held.charge(len(out))
        self._out.append(out)


class CtlFile(File):
    """A control file: `act(line)` per complete line; raise FsError to fail the write."""

    def __init__(self, act: Callable[[str], Awaitable[str | None]], get: Getter | None = None, mode: int = 0o644):
        self._act = act
        self._get = get
        self.mode = mode

    async def open(self, mode: OpenMode) -> Handle:
        return CtlHandle(self._act, self._get)


class OnCloseHandle(SnapshotHandle):
    """Accumulates what is written (at any offset) and hands it to `on_close` when the writer
    closes: every close that has new data acts once (dup'd descriptors close more than once).
    Writing past `limit` bytes fails, and then the close acts on nothing: a cut prompt is not
    submitted. The buffer is charged to the budget of whoever opened it (`HELD`): past that a
    write fails with ENOSPC, so open files cannot fill the server's memory."""

    def __init__(self, get: Getter, on_close: Callable[[str], Awaitable[None]], limit: int):
        super().__init__(get)
        self._on_close = on_close
        self._limit = limit
        self._buf = bytearray()
        self._dirty = False
        self._refused = False
        self._held = HELD.get()

    async def write(self, offset: int, data: bytes) -> int:
        offset = min(offset, len(self._buf))  # appending writers (O_APPEND) may report any offset
        if self._refused or offset + len(data) > self._limit:
            self._refused, self._dirty = True, False
            self.clear()
            raise FsError(
                E.EFBIG,
                f"too large: this file takes at most {size_text(self._limit)}; "
                "nothing written to this open file is used",
            )
        self._held.charge(max(0, offset + len(data) - len(self._buf)))
        self._buf[offset : offset + len(data)] = data
        self._dirty = True
        return len(data)

    async def truncate(self, size: int) -> None:
        before = len(self._buf)
        del self._buf[size:]  # vim opens without O_TRUNC, then ftruncates and writes
        self._resized(before)

    async def flush(self) -> None:
        if self._dirty:
            text, self._dirty = self._buf.decode(errors="replace"), False
            self.clear()
            await self._on_close(text)

    async def release(self) -> None:
        self.clear()

    def clear(self) -> None:
        before = len(self._buf)
        self._buf.clear()
        self._resized(before)

    def _resized(self, before: int) -> None:
        self._held.charge(len(self._buf) - before)


class OnCloseFile(File):
    """Write the whole content (at most `limit` bytes), act when closed (`prompt` submits, `plan`
    is saved)."""

    def __init__(
        self,
        get: Getter,
        on_close: Callable[[str], Awaitable[None]],
        limit: int,
        size: Callable[[], int] | None = None,
        mode: int = 0o644,
    ):
        self._get = get
        self._on_close = on_close
        self._limit = limit
        self._size = size
        self.mode = mode

    def size(self) -> int:
        return self._size() if self._size else 0

    async def open(self, mode: OpenMode) -> Handle:
        return OnCloseHandle(self._get, self._on_close, self._limit)


# ---- disk directories -------------------------------------------------------------------------


class DiskHandle(Handle):
    """An open file on disk, read and written in place."""

    direct_io = False

    def __init__(self, fd: int):
        self._fd = fd

    async def read(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    async def write(self, offset: int, data: bytes) -> int:
        return os.pwrite(self._fd, data, offset)

    async def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    async def release(self) -> None:
        os.close(self._fd)


class ValidatedHandle(OnCloseHandle):
    """A file replaced atomically at close if `validate` accepts it: a bad write loses nothing."""

    def __init__(
        self,
        path: Path,
        validate: Callable[[str, str], None],
        trunc: bool,
        on_release: Callable[[], None] | None = None,
    ):
        super().__init__(lambda: _read_text(path), self._commit, CONFIG_MAX)
        self._path = path
        self._validate = validate
        self._on_release = on_release
        if not trunc:
            self._buf[:] = _read_bytes(path)
            self._resized(0)

    async def release(self) -> None:
        await super().release()
        if self._on_release:
            self._on_release()

    async def _commit(self, text: str) -> None:
        try:
            self._validate(self._path.name, text)
        except Exception as e:  # the validator's message is the user's error
            raise FsError(E.EINVAL, f"{self._path.name}: {e}") from None
        tmp = self._path.with_name(f".{self._path.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self._path)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _read_text(path: Path) -> str:
    return _read_bytes(path).decode(errors="replace")


class DiskFile(File):
    def __init__(
        self,
        path: Path,
        writable: bool,
        validate: Callable[[str, str], None] | None,
        creating: bool = False,
        follow: bool = True,
    ):
        self.path = path
        self._writable = writable
        self._validate = validate
        self._creating = creating  # created, being written, not on disk until valid
        self._nofollow = 0 if follow else os.O_NOFOLLOW

    def stat(self, name: str) -> Stat:
        try:
            st = os.stat(self.path, follow_symlinks=not self._nofollow)
        except FileNotFoundError:
            if self._creating:
                return Stat(name, mode=0o644)
            raise FsError(E.ENOENT, f"{name}: no such file") from None
        return _disk_stat(name, st, self._writable)

    async def open(self, mode: OpenMode) -> Handle:
        if mode & (OpenMode.WRITE | OpenMode.TRUNC) and not self._writable:
            raise FsError(E.EACCES, f"{self.path.name}: read-only")
        if self._validate and mode & OpenMode.WRITE:
            return ValidatedHandle(self.path, self._validate, bool(mode & OpenMode.TRUNC))
        flags = {OpenMode.READ: os.O_RDONLY, OpenMode.WRITE: os.O_WRONLY}.get(mode & 3, os.O_RDWR)
        if mode & OpenMode.APPEND:
            flags |= os.O_APPEND
        try:
            return DiskHandle(self._open_regular(flags))
        except OSError as e:
            raise FsError(e.errno or E.EIO, f"{self.path.name}: {e.strerror}") from None

    async def truncate(self, size: int) -> None:
        if not self._writable:
            raise FsError(E.EACCES, f"{self.path.name}: read-only")
        if self._validate:
            return  # a validated file changes only through a complete, valid write
        fd = self._open_regular(os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def _open_regular(self, flags: int) -> int:
        """Open the file, refusing anything but a regular one. Sandboxed code writes some of these
        directories (the memory): between the lookup's stat and this open it could put a FIFO
        there, whose blocking open would stop the server's loop; O_NONBLOCK opens it at once."""
        fd = os.open(self.path, flags | self._nofollow | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(E.ENOENT, "not a regular file")
        os.set_blocking(fd, True)
        return fd


def _disk_stat(name: str, st: os.stat_result, writable: bool) -> Stat:
    mode = st.st_mode & 0o777 if writable else st.st_mode & 0o555
    return Stat(name, mode=mode, size=st.st_size, mtime=st.st_mtime, version=st.st_mtime_ns & 0xFFFFFFFF)


class _Listed(File):
    """A file as a listing found it: only its stat, taken off the loop, is asked of it."""

    def __init__(self, st: Stat):
        self._stat = st

    def stat(self, name: str) -> Stat:
        st = self._stat  # the listing may be shared: each gets its own
        return Stat(name, is_dir=st.is_dir, mode=st.mode, size=st.size, mtime=st.mtime, version=st.version)


def _scan(path: Path, follow: bool, hidden: str, writable: bool, dirs: bool = False) -> list[Stat]:
    """The regular files (and with `dirs` the directories) among the first LIST_MAX entries of
    `path` (but names starting with `hidden`), stat'ed, by name. Run in a thread, and bounded:
    sandboxed code fills m/ and pl/ at will, and a listing of 150,000 files read and stat'ed on the
    server's loop held up every session for seconds. Entries past LIST_MAX are not listed (they
    still open by name)."""
    found = []
    try:
        with os.scandir(path) as entries:
            for e in itertools.islice(entries, LIST_MAX):
                try:
                    if e.name.startswith(hidden):
                        continue
                    if e.is_file(follow_symlinks=follow):
                        found.append(_disk_stat(e.name, e.stat(follow_symlinks=follow), writable))
                    elif dirs and e.is_dir(follow_symlinks=follow):
                        found.append(Stat(e.name, is_dir=True, mode=0o755 if writable else 0o555))
                except OSError:  # gone meanwhile
                    continue
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda st: st.name)


# Scans under way, by loop and what they scan: listings of one directory at once share one scan,
# so that code listing m/ from a thousand open descriptors takes one thread, not every thread that
# the server's other work (other sessions' listings, their plans) waits for.
_SCANS: dict[tuple[asyncio.AbstractEventLoop, Path, bool, str, bool, bool], asyncio.Future[list[Stat]]] = {}


async def _listing(path: Path, follow: bool, hidden: str, writable: bool, dirs: bool = False) -> list[Stat]:
    key = (asyncio.get_running_loop(), path, follow, hidden, writable, dirs)
    scan = _SCANS.get(key)
    if scan is None:
        scan = _SCANS[key] = asyncio.ensure_future(asyncio.to_thread(_scan, path, follow, hidden, writable, dirs))
        scan.add_done_callback(lambda _: _SCANS.pop(key, None))
    return await asyncio.shield(scan)  # a listing interrupted leaves the scan to the others


def _is_file(path: Path, follow: bool) -> bool:
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=follow).st_mode)
    except OSError:
        return False


def _is_dir(path: Path, follow: bool) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path, follow_symlinks=follow).st_mode)
    except OSError:
        return False


class DiskDir(Dir):
    """A flat directory on disk (created on first use), or with `nested` a tree of them, read-only
    (the skills: sk/<name>/SKILL.md). `synthetic` files are shown in it (t/idx);
    `validate(name, text)` checks every write (agent configs) and may raise. In a directory that
    sandboxed code writes (`shared`: the memory, the plans) a symlink is never followed: it could
    name any file of the user's, which the server, unconfined, would then serve; and dotfiles (the
    memory's index, temporary files) are not listed."""

    def __init__(
        self,
        path: Path,
        writable: bool = True,
        validate: Callable[[str, str], None] | None = None,
        synthetic: dict[str, File] | None = None,
        shared: bool = False,
        nested: bool = False,
    ):
        assert not (nested and writable), "a nested DiskDir is read-only"
        self.shared = shared
        self.nested = nested
        self.follow = not shared
        self.path = path
        self.writable = writable
        self.validate = validate
        self.synthetic = synthetic or {}
        self.mode = 0o755 if writable else 0o555
        self._creating: set[str] = set()  # validated files created and still open

    def mtime(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except FileNotFoundError:
            return super().mtime()

    def _file(self, name: str) -> DiskFile:
        return DiskFile(self.path / check_name(name), self.writable, self.validate, name in self._creating, self.follow)

    def lookup(self, name: str) -> File | Dir:
        if name in self.synthetic:
            return self.synthetic[name]
        f = self._file(name)
        if self.nested and _is_dir(f.path, self.follow):
            return DiskDir(f.path, writable=False, shared=self.shared, nested=True)
        if not _is_file(f.path, self.follow) and name not in self._creating:
            raise FsError(E.ENOENT, f"{name}: no such file")
        return f

    async def list(self) -> list[tuple[str, File | Dir]]:
        hidden = "." if self.shared else ".#"
        found = await _listing(self.path, self.follow, hidden, self.writable, self.nested)
        return [*self.synthetic.items(), *((st.name, _Listed(st)) for st in found if st.name not in self.synthetic)]

    def _check_writable(self, name: str) -> None:
        if not self.writable:
            raise FsError(E.EACCES, f"{name}: read-only directory")
        if name in self.synthetic:
            raise FsError(E.EACCES, f"{name}: is a synthesised file")

    async def create(self, name: str, mode: int) -> Handle:
        self._check_writable(name)
        f = self._file(name)
        self.path.mkdir(parents=True, exist_ok=True)
        if self.validate:
            self._creating.add(name)
            return ValidatedHandle(f.path, self.validate, trunc=True, on_release=lambda: self._creating.discard(name))
        flags = os.O_RDWR | os.O_CREAT | (0 if self.follow else os.O_NOFOLLOW | os.O_EXCL)
        try:
            return DiskHandle(os.open(f.path, flags, mode & 0o777))
        except OSError as e:
            raise FsError(e.errno or E.EIO, f"{name}: {e.strerror}") from None

    async def remove(self, name: str) -> None:
        self._check_writable(name)
        try:
            os.unlink(self._file(name).path)
        except OSError as e:
            raise FsError(e.errno or E.EIO, f"{name}: {e.strerror}") from None

    async def rename(self, old: str, new: str) -> None:
        self._check_writable(old)
        self._check_writable(new)
        src, dst = self._file(old).path, self._file(new).path
        if self.validate:
            try:
                self.validate(new, _read_text(src))
            except Exception as e:  # the validator's message is the user's error (as at a write's close)
                raise FsError(E.EINVAL, f"{new}: {e}") from None
        try:
            os.rename(src, dst)
        except OSError as e:
            raise FsError(e.errno or E.EIO, f"{old}: {e.strerror}") from None


class ConfigDir(DiskDir):
    """A directory of configs (a/): every write is validated, and one refused leaves its reason
    beside the file as `<name>.err`, since the writer may never see it otherwise: a shell's `echo
    … > a/x.json` ignores the close that failed, an editor shows only an errno. The reasons are
    kept in memory (never among the configs on disk) and read-only; one goes when a write of its
    name is taken, when it or its file is removed, or when the server stops. The server's log has
    them too."""

    def __init__(self, path: Path, validate: Callable[[str, str], None], shown: str):
        super().__init__(path, validate=lambda name, text: self._check(validate, name, text))
        self.shown = shown  # the directory's name on the mount
        self.errors: dict[str, str] = {}

    def _check(self, validate: Callable[[str, str], None], name: str, text: str) -> None:
        try:
            validate(name, text)
        except Exception as e:
            self.errors[name] = refusal_text(self.shown, name, str(e).removeprefix(f"{name}: "))
            log.warning("%s/%s refused: %s", self.shown, name, e)
            raise
        self.errors.pop(name, None)

    def _reason(self, name: str) -> str | None:
        """The config whose reason `name` is, if it is one."""
        base = name.removesuffix(".err")
        return base if base != name and base in self.errors else None

    def lookup(self, name: str) -> File | Dir:
        if (base := self._reason(name)) is not None:
            return TextFile(lambda: self.errors.get(base, ""), text_size(lambda: self.errors.get(base, "")))
        return super().lookup(name)

    async def list(self) -> list[tuple[str, File | Dir]]:
        listed = await super().list()
        reasons = [(f"{base}.err", self.lookup(f"{base}.err")) for base in self.errors]
        return sorted([*(e for e in listed if self._reason(e[0]) is None), *reasons], key=lambda e: e[0])

    def _check_writable(self, name: str) -> None:
        if self._reason(name) is not None:
            raise FsError(E.EACCES, f"{name}: why {name.removesuffix('.err')} was refused (read-only; rm removes it)")
        super()._check_writable(name)

    async def remove(self, name: str) -> None:
        if (base := self._reason(name)) is not None:
            del self.errors[base]
            return
        self.errors.pop(name, None)
        await super().remove(name)


def refusal_text(directory: str, name: str, why: str) -> str:
    """What `<name>.err` says: why the write was refused, what the file holds now, what to do."""
    return (
        f"{directory}/{name} was not written: {why}\n"
        f"{name} keeps what it held (nothing, if it is new). Fix it and write it again: this file "
        f"goes when a write of {name} is taken, or with `rm {name}.err`.\n"
    )
