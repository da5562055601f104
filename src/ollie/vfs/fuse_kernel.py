"""The kernel's FUSE protocol, spoken over a /dev/fuse descriptor without libfuse.

The layouts are those of <linux/fuse.h> (protocol 7.31 answered; the kernel speaks a later minor
and keeps to ours). `fuse.py` serves a Namespace with them on the server's asyncio loop.

Getting a descriptor for a mount of our own takes `fusermount3` (setuid), as libfuse does: it opens
/dev/fuse, mounts it and hands the descriptor back over a socket named in `_FUSE_COMMFD`.
"""

from __future__ import annotations

import array
import os
import shutil
import socket
import struct
import subprocess

# ---- opcodes ---------------------------------------------------------------------------------
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE, STATFS, RELEASE = 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18
FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR, FLUSH, INIT = 20, 21, 22, 23, 24, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE, INTERRUPT = 27, 28, 29, 30, 34, 35, 36
DESTROY, BATCH_FORGET, RENAME2 = 38, 42, 45

# ---- flags -----------------------------------------------------------------------------------
# FUSE_INIT: what we ask for (and the kernel offers); libfuse 3 asks for the same by default.
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3  # O_TRUNC comes with the open (no separate setattr)
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12  # cached pages of a disk file go when its mtime or size changes
ASYNC_DIO = 1 << 15
PARALLEL_DIROPS = 1 << 18
INIT_FLAGS = ASYNC_READ | ATOMIC_O_TRUNC | BIG_WRITES | AUTO_INVAL_DATA | ASYNC_DIO | PARALLEL_DIROPS

FOPEN_DIRECT_IO = 1 << 0
FOPEN_NOFLUSH = 1 << 5

FATTR_SIZE = 1 << 3
FATTR_FH = 1 << 6

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2

MAJOR, MINOR = 7, 31
MAX_WRITE = 128 * 1024
BUFSIZE = MAX_WRITE + 4096  # a request's header and arguments fit beside the largest write

# ---- layouts ---------------------------------------------------------------------------------
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
ATTR = struct.Struct(
    "<QQQQQQIIIIIIIIII"
)  # ino size blocks a/m/ctime a/m/ctimensec mode nlink uid gid rdev blksize flags
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec
ATTR_OUT = struct.Struct("<QII")  # attr_valid attr_valid_nsec dummy
OPEN_OUT = struct.Struct("<QII")  # fh open_flags padding
WRITE_OUT = struct.Struct("<II")  # size padding
INIT_IN = struct.Struct("<IIII")  # major minor max_readahead flags
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ... max_background congestion max_write time_gran max_pages ...
OPEN_IN = struct.Struct("<II")  # flags open_flags
CREATE_IN = struct.Struct("<IIII")  # flags mode umask open_flags
MKDIR_IN = struct.Struct("<II")  # mode umask
READ_IN = struct.Struct("<QQIIQII")  # fh offset size read_flags lock_owner flags padding (WRITE_IN alike)
RELEASE_IN = struct.Struct("<QIIQ")  # fh flags release_flags lock_owner (FLUSH_IN: fh unused padding lock_owner)
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")  # valid padding fh size lock_owner a/m/ctime nsecs mode _ uid gid _
RENAME_IN = struct.Struct("<Q")  # newdir
RENAME2_IN = struct.Struct("<QII")  # newdir flags padding
FORGET_ONE = struct.Struct("<QQ")  # nodeid nlookup
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
DIRENT = struct.Struct("<QQII")  # ino off namelen type, then the name padded to 8 bytes
KSTATFS = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen frsize padding spare


def reply(fd: int, unique: int, error: int = 0, body: bytes = b"") -> None:
    """Answer request `unique`: `error` (a positive errno) or the reply's body. Raises
    FileNotFoundError when the kernel gave up on the request (its caller was interrupted and left)."""
    if error:
        body = b""
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)


def dirent(ino: int, off: int, name: bytes, mode: int) -> bytes:
    raw = DIRENT.pack(ino, off, len(name), (mode >> 12) & 0o17) + name
    return raw + b"\0" * (-len(raw) % 8)


def fusermount3() -> str:
    """The system's fusermount3, never one on the user's PATH (a project's .venv/bin may come first)."""
    return shutil.which("fusermount3", path="/usr/bin:/bin") or "fusermount3"


def fusermount(path: str, options: str) -> int:
    """Mount a FUSE file system at `path` through fusermount3, returning its /dev/fuse descriptor."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        proc = subprocess.Popen(
            [fusermount3(), "-o", options, "--", path],
            env=env,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        theirs.close()
        fds = array.array("i")
        _, anc, _, _ = ours.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        _, err = proc.communicate(timeout=30)
        if not fds:
            raise OSError(f"fusermount3 failed: {err.decode(errors='replace').strip() or proc.returncode}")
        for extra in fds[1:]:
            os.close(extra)
        os.set_inheritable(fds[0], False)
        return fds[0]
    finally:
        ours.close()
        theirs.close()
