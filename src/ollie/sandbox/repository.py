"""The git work tree a session's cwd lies in (the default policy's `{REPO}`): found walking up
from the cwd by descriptor, every step a question sandboxed code cannot answer for the user.

A session in a package of a monorepo reads and runs the whole work tree, so that git finds its
repository and the root's tools run. What decides is what only the user controls: a `.git`
directory above the cwd (never the cwd's own, which its code writes), that repository's index
tracking the cwd's directory, directories on the way that no one else may write, below $HOME
and outside its dot-directories, and no sign of a dotfiles repository. Everything read is
bounded, and nothing read can block: the builder thread that asks decides every session's
sandbox. The grant found is then opened and judged by descriptor (`grants.py`).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import re
import stat
import struct
import time
from collections.abc import Iterator

from .. import config
from ..paths import Identity, LinkRefused, identity, open_real

# Files at a work tree's root that say it holds dotfiles (stow, dotbot, chezmoi, dotter, rcm): code
# below the root can neither make nor remove them. Names too (any case; "dotfiles-private").
DOTFILES_MARKS = (
    ".stowrc",
    ".stow-local-ignore",
    "install.conf.yaml",
    ".chezmoiroot",
    ".chezmoiignore",
    ".dotter",
    "rcrc",
)
DOTFILES_NAMES = ("dots",)  # and any name starting with "dotfiles"
LINKS_KEPT_FOR = 5.0  # seconds a look for $HOME's links into a work tree is kept (each session reads its policy)
SCAN_LIMIT = 50_000  # entries of $HOME and its dot-directories looked at, at most; past it, a dotfiles repository
LOOK_SECONDS = 2.0  # the longest a look for $HOME's links may take; past it, a dotfiles repository
# Below $HOME, passed over by the look: bulky caches and toolchains (their top entries, where a
# stowed settings.xml or credentials.toml would be, are looked at), and ~/.local/bin, where links
# to a project's own programs go (`ln -s ~/src/tool/tool ~/.local/bin/`: no sign of dotfiles).
PASSED_OVER = (
    ".cache", ".npm/_cacache", ".m2/repository", ".gradle/caches", ".gradle/wrapper", ".cargo/registry",
    ".cargo/git", ".rustup/toolchains", ".pyenv/versions", ".nvm/versions", ".sdkman/candidates",
    ".bun/install", ".deno/deps", ".local/share/Trash", ".local/bin",
)  # fmt: skip
HOPS = 40  # symlinks followed on one path, as the kernel's limit
LEVELS = 256  # directories walked up from a link's target, at most; past it, a dotfiles repository
INDEX_LIMIT = 256 << 20  # bytes of a git index read at most (a monorepo of a million files: ~100 MB)
PATH_LIMIT = 4096  # bytes of a path in a git index; a longer one makes the index unreadable here
# File systems whose lookups may wait on another process or host (and never end, if it is gone):
# the look for links neither follows a link into one nor lists one.
FAR = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "autofs", "afs", "lustre", "gpfs")
# Within a line only (`\s` would span lines, and backtrack over a config of blank lines quadratically).
_OBJECT_FORMAT = re.compile(rb"^[ \t]*objectformat[ \t]*=[ \t]*sha256[ \t]*$", re.IGNORECASE | re.MULTILINE)

# Where ollie makes a sub-agent's git worktree (`worktree=1`): <root>/.ollie/worktrees/<id>. A cwd
# there lies in a dot-directory of the work tree, which is no dotfiles' place when the repository
# at <root> has that worktree registered (`registered`): git in the worktree reads <root>/.git.
WORKTREES = ".ollie/worktrees"
_WORKTREE = re.compile(rf"^(?P<root>/.+)/{re.escape(WORKTREES)}/(?P<id>[^/.][^/]*)(?:/.*)?$")

_linked: dict[tuple[str, str], tuple[float, bool]] = {}
_tracked: dict[tuple[int, int, int, int, int, str], bool] = {}  # by what the index file was, and the name


def repository_root(cwd: str, home: str) -> str:
    """The root of the git work tree that `cwd` (a real path) lies in, "" if none: the nearest
    directory strictly above it whose `.git` is a directory of the user's, when that repository
    tracks the cwd's directory at its top (`tracks`: a stray `git init` in ~/work is not the
    project of every repository below it). The cwd's own `.git` is not looked at: its code writes
    it, and would otherwise choose (by making it a file, or removing it) whether its next sandbox
    reads the tree around it. Found only strictly below $HOME (told by identity: a bind mount or a
    link names it otherwise; not when $HOME is / or not the user's), with no dot-directory on the
    way from $HOME to the cwd, and never a dotfiles repository (`dotfiles`): granted whole, it
    would grant the secrets kept there. Never through a directory another user may write
    (`only_mine`), nor across a mount (as git does). Walked up by descriptor from the cwd opened
    following no link: a link planted on the way (onto a mount that never answers) is not followed."""
    if not os.path.isabs(cwd):
        return ""
    cwd = os.path.normpath(cwd)  # a trailing slash or a `/./` (opened following no link all the same)
    try:
        top = os.stat(home)
        if top.st_uid != os.geteuid() or os.path.realpath(home) == "/":
            return ""
        here = open_real(cwd)
    except (OSError, ValueError):
        return ""  # a link on the cwd's way (grants.py refuses the cwd itself, naming it)
    found_fd = [-1]
    try:
        return _walk(cwd, here, (top.st_dev, top.st_ino), home, found_fd, _WORKTREE.match(cwd))
    except (OSError, ValueError):
        return ""
    finally:
        os.close(here)
        if found_fd[0] >= 0:
            os.close(found_fd[0])


def _walk(
    cwd: str, fd: int, home_id: Identity, home: str, found_fd: list[int], worktree: re.Match[str] | None = None
) -> str:
    """`repository_root`'s walk, from the cwd's descriptor `fd` (which the caller closes) up to
    $HOME; `found_fd` holds the work tree's descriptor once found (the caller closes it).
    `worktree`: the cwd lies where ollie makes a sub-agent's worktree (`_WORKTREE`)."""
    dev, uid, path, found = os.fstat(fd).st_dev, os.geteuid(), cwd, ""
    here = os.dup(fd)
    try:
        while True:
            if os.path.basename(path).startswith(".") and not (
                worktree and not found and path == os.path.join(worktree["root"], os.path.dirname(WORKTREES))
            ):
                return ""  # ~/.config/nvim, ~/dotfiles/nvim/.config/nvim: a dot-directory on the way
            parent_fd = os.open("..", os.O_PATH | os.O_CLOEXEC, dir_fd=here)
            os.close(here)
            here, parent = parent_fd, os.path.dirname(path)
            st = os.fstat(here)
            if not _names(parent, st):
                return ""  # moved while walked: the name would say another directory than was judged
            if (st.st_dev, st.st_ino) == home_id:
                if not found or dotfiles(found, found_fd[0], parent, home):
                    return ""
                top = os.path.relpath(cwd, found).split("/")[0]
                if worktree and found == worktree["root"]:
                    known = registered(found_fd[0], worktree["id"])  # the worktree, not `top`, is the sign
                else:
                    known = tracks(found_fd[0], top)
                return found if known and _names(found, os.fstat(found_fd[0])) else ""
            if parent == path or st.st_dev != dev or not only_mine(here, st):
                return ""  # / reached without $HOME; another file system; a directory shared
            if not found:
                git = _lstat(here, ".git")
                if git is not None and stat.S_ISDIR(git.st_mode) and git.st_uid == uid:
                    found, found_fd[0] = parent, os.dup(here)
            path = parent
    finally:
        os.close(here)


def _names(path: str, st: os.stat_result) -> bool:
    """Whether `path` names, now, the directory whose status is `st`, looked up following no link
    (one swapped onto its way since could lead onto a mount that never answers)."""
    try:
        fd = open_real(path)
    except OSError:
        return False
    try:
        return identity(fd) == (st.st_dev, st.st_ino)
    finally:
        os.close(fd)


def _lstat(directory: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None


def only_mine(fd: int, st: os.stat_result) -> bool:
    """Whether only the user may write the directory `fd` (whose status is `st`): theirs, neither
    sticky nor writable by others, with no ACL (whose mask shows as the group's bits), and
    writable by its group only when that is the user's private group (named as the user, no other
    member; the gid compared first, so that a group of a slow directory service is not asked)."""
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWOTH | stat.S_ISVTX):
        return False
    try:
        os.getxattr(f"/proc/self/fd/{fd}", "system.posix_acl_access")
        return False
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
            return False  # not known to have none
    if not st.st_mode & stat.S_IWGRP:
        return True
    if st.st_gid != os.getegid():
        return False
    try:
        group, me = grp.getgrgid(st.st_gid), pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


# ---- dotfiles ------------------------------------------------------------------------------------------
def dotfiles(tree: str, tree_fd: int, home_seen: str, home: str) -> bool:
    """Whether the work tree `tree` (open as `tree_fd`) holds dotfiles: named or marked so at its
    root, or one a symlink in $HOME, or below it (dot-directories at its top, three levels:
    ~/.zshrc, ~/.config/gh/hosts.yml, ~/.config/fish/conf.d/x.fish), leads to or into, as `stow`
    makes them. `home_seen` is $HOME as the walk from the cwd reached it (through a bind mount,
    another path than `home`)."""
    name = os.path.basename(tree).lower()
    if name in DOTFILES_NAMES or name.startswith("dotfiles"):
        return True
    if any(_lstat(tree_fd, mark) is not None for mark in DOTFILES_MARKS):
        return True
    now = time.monotonic()
    known = _linked.get((home, tree))
    if known is not None and now - known[0] < LINKS_KEPT_FOR:
        return known[1]
    rel = os.path.relpath(tree, home_seen)
    names = {tree, *(os.path.normpath(os.path.join(h, rel)) for h in (home, os.path.realpath(home)))}
    found = _links_into(home, identity(tree_fd), names, now + LOOK_SECONDS)
    if len(_linked) > 256:
        _linked.clear()
    _linked[(home, tree)] = (now, found)
    return found


def _links_into(home: str, tree: Identity, names: set[str], deadline: float) -> bool:
    """The look `dotfiles` makes, from $HOME's real path (the mounts are named by theirs). Bulky
    caches and toolchains (PASSED_OVER) are passed over; a link that cannot be followed to its end
    for a reason code could cause, and a look past SCAN_LIMIT entries or its `deadline`, count as
    finding a link into the tree: granting less is the error to make."""
    home = os.path.realpath(home)
    mounts = _mounts([home, *names])
    skipped = {os.path.join(home, d) for d in PASSED_OVER}
    todo, seen = [(home, 0)], 0
    while todo:
        directory, depth = todo.pop()
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    seen += 1
                    if seen > SCAN_LIMIT or time.monotonic() > deadline:
                        return True
                    if _is_far(entry.path, mounts) or entry.path in skipped:
                        continue  # not even `lstat`ed (a file system that reports no types asks it)
                    try:
                        if entry.is_symlink():
                            if _leads_into(entry.path, tree, names, mounts, deadline):
                                return True
                        elif (
                            depth < 3 and (depth or entry.name.startswith(".")) and entry.is_dir(follow_symlinks=False)
                        ):
                            todo.append((entry.path, depth + 1))
                    except OSError:
                        continue  # gone since it was listed
        except OSError:
            continue  # a directory that cannot be read: code that could make it so could remove its links
    return False


def _mounts(near: list[str]) -> list[tuple[str, bool]]:
    """Every mount point (with a slash), deepest first, and whether it is far: one of the file
    systems mounted there is FUSE or a network one (FAR), and it is not the deepest point holding
    a path of `near` ($HOME, the tree), which the look walks anyway ($HOME on NFS is no reason to
    look at none of its links)."""
    far: dict[str, bool] = {}
    for point, kind in config.mounts():
        point = point.rstrip("/") + "/"
        far[point] = far.get(point, False) or kind.startswith("fuse") or kind in FAR
    points = sorted(far, key=len, reverse=True)
    holding = {next((p for p in points if (n.rstrip("/") + "/").startswith(p)), "") for n in near}
    return [(p, far[p] and p not in holding) for p in points]


def _is_far(path: str, mounts: list[tuple[str, bool]]) -> bool:
    """Whether the deepest mount holding `path` is far (`_mounts`): an autofs /home is, though
    $HOME's own NFS mount below it is not."""
    path = path.rstrip("/") + "/"
    return next((far for point, far in mounts if path.startswith(point)), False)


class _Into(Exception):
    """A link's way passes through the tree, or could not be followed for a reason code could cause."""


def _leads_into(link: str, tree: Identity, names: set[str], mounts: list[tuple[str, bool]], deadline: float) -> bool:
    """Whether the symlink `link` leads to the tree or into it: its way passing through the tree
    by name, or where it ends lying in it by identity (walking up LEVELS at most); by the tree's
    names alone where a directory on the way cannot be searched. Nothing on a far file system is
    looked up. A loop, a missing part or a file on the way, outside the tree, lead nowhere."""
    try:
        real, whole = _resolve(link, names, mounts, deadline)
    except _Into:
        return True
    except OSError:
        return False  # a loop, a missing part, a file on the way: outside the tree (named as it went)
    if real is None:
        return False
    if not whole:
        return _named(real, names)
    try:
        here = open_real(real)
    except PermissionError:
        return _named(real, names)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # a link swapped in since it was resolved
    try:
        return _lies_in(here, real, tree)
    except OSError:
        return True  # changed under the walk
    finally:
        os.close(here)


def _lies_in(fd: int, real: str, tree: Identity) -> bool:
    """Whether the file `fd` (at `real`) is the tree or lies in it, walking up by descriptor
    (LEVELS at most: past them, it counts as in it)."""
    here = os.dup(fd)
    try:
        for _ in range(LEVELS):
            seen = identity(here)
            if seen == tree:
                return True
            try:
                up = os.open("..", os.O_PATH | os.O_CLOEXEC, dir_fd=here)
            except NotADirectoryError:
                up = open_real(os.path.dirname(real))
            os.close(here)
            here = up
            if identity(here) == seen:
                return False  # the root
        return True
    finally:
        os.close(here)


def _resolve(path: str, names: set[str], mounts: list[tuple[str, bool]], deadline: float) -> tuple[str | None, bool]:
    """Where `path` leads, its symlinks followed a component at a time, each looked at through a
    descriptor of its directory opened following no link (a directory swapped for a link since
    leads nowhere else): (None, True) if it leads onto a far file system; (the path as far as it
    was made real, False) if a directory on the way cannot be searched. _Into when the way passes
    through the tree by name, a directory on it became a link, or past the look's `deadline`;
    ELOOP past HOPS links."""
    done, todo, hops = "/", [p for p in reversed(path.split("/")) if p], 0
    while todo:
        if time.monotonic() > deadline:
            raise _Into
        part = todo.pop()
        if part == "..":
            done = os.path.dirname(done)
            continue
        if part == ".":
            continue
        here = os.path.join(done, part)
        if _is_far(here, mounts):
            return None, True
        if _named(here, names):
            raise _Into
        try:
            directory = open_real(done)
        except PermissionError:
            return os.path.join(here, *reversed(todo)), False
        except LinkRefused:
            raise _Into from None
        try:
            st = os.stat(part, dir_fd=directory, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                done = here
                continue
            hops += 1
            if hops > HOPS:
                raise OSError(errno.ELOOP, "too many links", path)
            target = os.readlink(part, dir_fd=directory)
        except PermissionError:
            return os.path.join(here, *reversed(todo)), False
        finally:
            os.close(directory)
        done = "/" if target.startswith("/") else done
        todo.extend(p for p in reversed(target.split("/")) if p)
    return done, True


def _named(real: str, names: set[str]) -> bool:
    """Whether the path `real` is the tree's or in it, by the tree's names."""
    return any(real == n or real.startswith(n.rstrip("/") + "/") for n in names)


def registered(root: int, wid: str) -> bool:
    """Whether the repository at `root` (a directory's descriptor) has the worktree `wid` among its
    own (`.git/worktrees/<wid>`, a directory of the user's reached through no link): made by `git
    worktree add` on that repository, which code below the worktree's parent cannot do."""
    try:
        fd = open_real(f".git/worktrees/{wid}", beneath=root)
    except (OSError, ValueError):
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    finally:
        os.close(fd)


# ---- the index -----------------------------------------------------------------------------------------
def tracks(root: int, top: str) -> bool:
    """Whether the repository at `root` (a directory's descriptor) tracks something in its
    top-level directory `top` (the one the cwd lies in): what the user committed or added, which
    code below the root cannot change. An index that cannot be read here (split, malformed, too
    large, a link) tracks nothing."""
    try:
        git = os.open(".git", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
    except OSError:
        return False
    try:
        with _regular(git, "config", 1 << 20) as config_file:
            if config_file is None:
                return False
            hash_size = 32 if _OBJECT_FORMAT.search(_read(config_file)) else 20
        with _regular(git, "index", INDEX_LIMIT) as index:
            if index is None:
                return False
            st = os.fstat(index)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, hash_size, top)
            if key not in _tracked:
                if len(_tracked) >= 256:
                    _tracked.clear()
                _tracked[key] = index_tracks(_read(index), hash_size, os.fsencode(top))
            return _tracked[key]
    except (OSError, MemoryError):
        return False
    finally:
        os.close(git)


def index_tracks(data: bytes | bytearray, hash_size: int, top: bytes) -> bool:
    """Whether the git index `data` (formats 2 to 4) holds `top` or a path in it; False for one
    that cannot be read as an index. Its entries are sorted by path: the look ends past `top`."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return False
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        return False
    inside, pos, path = top + b"/", 12, bytearray()
    fixed = 40 + hash_size + 2  # stat data, the object's name, the flags
    try:
        for _ in range(count):
            flags = struct.unpack(">H", data[pos + fixed - 2 : pos + fixed])[0]
            start = pos + fixed + (2 if version >= 3 and flags & 0x4000 else 0)
            if version == 4:  # the previous path less its last `strip` bytes, then these (edited in place)
                strip, start = _varint(data, start)
                if strip > len(path):
                    return False
                end = data.index(b"\0", start, start + PATH_LIMIT + 1)
                del path[len(path) - strip :]
                path += data[start:end]
                pos = end + 1
            else:
                end = data.index(b"\0", start, start + PATH_LIMIT + 1)
                path[:] = data[start:end]
                pos += (end - pos + 8) // 8 * 8  # NUL-padded to a multiple of 8, at least one NUL
            if len(path) > PATH_LIMIT:
                return False
            if path == top or path.startswith(inside):
                return True
            if path > inside:
                return False
    except (ValueError, IndexError, struct.error):
        return False
    return False


def _varint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    """git's offset varint (index format 4): the value and the position after it; ValueError
    past five bytes (a path's length to strip never needs more)."""
    byte = data[pos]
    value, pos, length = byte & 0x7F, pos + 1, 1
    while byte & 0x80:
        if length == 5:
            raise ValueError("varint too long")
        byte = data[pos]
        value, pos, length = ((value + 1) << 7) | (byte & 0x7F), pos + 1, length + 1
    return value, pos


@contextlib.contextmanager
def _regular(directory: int, name: str, limit: int) -> Iterator[int | None]:
    """A descriptor of `name` in `directory` if it is a regular file of 12 to `limit` bytes, else
    None: never a link (which could lead onto a file system that never answers), a FIFO (whose
    open would wait for a writer) nor a device; nor a file of /proc, which says it holds nothing
    (none is read past the size it gives, `_read`)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield fd if stat.S_ISREG(st.st_mode) and 12 <= st.st_size <= limit else None
    finally:
        os.close(fd)


def _read(fd: int) -> bytearray:
    """The file `fd`, up to the size it said it had when opened, into one buffer."""
    data = bytearray(os.fstat(fd).st_size)
    view, got = memoryview(data), 0
    while got < len(data) and (n := os.readv(fd, [view[got:]])):
        got += n
    view.release()
    del data[got:]
    return data
