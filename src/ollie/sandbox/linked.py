"""The directories of a working directory whose files are hard links into a store the user's other
projects and tools share: uv installs a virtualenv's packages as hard links from its cache, pnpm a
project's from its store. A file has one content under all its names: written through the cwd's,
it changes in every other virtualenv, `uv tool` (ollie's own installation among them) and pnpm
project that links it, where the user runs it outside any sandbox. A jail keeps them read-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from ..paths import open_real_dir, resolved

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_VENVS = (".venv", "venv")
_MOST = 20000  # entries of a cwd's site-packages looked at, all together; past them, counted as linked
_PYTHONS = 8  # entries of a virtualenv's lib (one python3.X as a rule); past them, counted as linked
_WALK = 300_000  # entries of a linked virtualenv looked through for symlinks; past them, one is assumed
# Keys of what was looked at: a directory's (device, inode, mtime, ctime). Every install adds a
# .dist-info to a site-packages, a new mtime; code that sets an old mtime back makes a new ctime.
_Key = tuple[int, int, int, int]
_SEEN: dict[_Key, bool] = {}  # site-packages: whether a distribution's files are linked
# linked virtualenvs: a symlink that leads out of one, and where ("" for none)
_WALKED: dict[tuple[_Key, ...], tuple[str, str]] = {}
_STORE = (
    "a virtualenv whose packages are hard links into a shared store "
    "(uv's cache: written, they change in your other projects too)"
)


class LinkedLayout(Exception):
    """A cwd no jail can keep a store's links read-only in: the session's calls are refused, saying why."""


def linked_installs(cwd: str) -> tuple[str, ...]:
    """What of `cwd` (a real path) to keep read-only: its virtualenvs whose installed packages are
    hard-linked (`_linked_venv`), and pnpm's `node_modules/.pnpm`. LinkedLayout for a cwd in one of
    those of a directory above it (a sub-agent's cwd may be any directory of its parent's). Looked
    at by descriptor, following no symlink but where a linking install would (code writes the cwd:
    a link there could lead anywhere, a dead mount included)."""
    _refuse_inside_linked(cwd)
    top = _open_real_dir(cwd)
    if top is None:
        return ()
    try:
        budget = [_MOST]  # for every site-packages of the cwd: code can make 8 a virtualenv, and two of those
        found = [kept for venv in _VENVS for kept in _linked_venv(top, cwd, venv, budget)]
        pnpm = _open_dir(top, "node_modules", ".pnpm")
        if pnpm is not None:
            found.append(f"{cwd}/node_modules/.pnpm")
            os.close(pnpm)
        return tuple(found)
    finally:
        os.close(top)


def _refuse_inside_linked(cwd: str) -> None:
    parts = cwd.split("/")
    for n, part in enumerate(parts[1:], 1):
        above = "/".join(parts[:n]) or "/"
        if part == "node_modules" and parts[n + 1 : n + 2] == [".pnpm"]:
            raise LinkedLayout(f"{cwd} lies in {above}/node_modules/.pnpm, hard links into pnpm's store; work above it")
        if part in _VENVS and (top := _open_real_dir(above)) is not None:
            try:
                if _linked_venv(top, above, part, [_MOST]):
                    raise LinkedLayout(f"{cwd} lies in {above}/{part}, {_STORE}; work above it")
            finally:
                os.close(top)


def _linked_venv(top: int, cwd: str, name: str, budget: list[int]) -> list[str]:
    """Nothing while none of the virtualenv `name`'s distributions is linked. Else the virtualenv
    whole (a wheel's data files, `share/jupyter/kernels/…/kernel.json`, are links too), where it
    really is when `name` is your link to a directory outside the cwd. LinkedLayout when `name` is
    a link into the cwd, or the virtualenv holds one that leads out of it: uv follows such a link,
    one code planted before your next install (`lib/python3.X -> ../../stash`), and links the files
    where it leads; code could then point the link elsewhere, or remove it, and a later sandbox
    would look where it leads then (red-team passes, stop 57)."""
    path = f"{cwd}/{name}"
    try:
        linked_name = stat.S_ISLNK(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode)
    except OSError:
        return []
    if linked_name and not (path := resolved(path)):
        raise LinkedLayout(f"{cwd}/{name} changed while ollie looked at it; try again")
    venv = _open_real_dir(path)
    if venv is None:
        return []  # (gone, or a link swapped in since: seen by the next build)
    try:
        sites = _links_packages(venv, budget)
        if sites is None:
            return []
        if linked_name and (path + "/").startswith(cwd.rstrip("/") + "/"):
            raise LinkedLayout(
                f"{cwd}/{name} is a symlink to {path}, {_STORE}, which code could point elsewhere; "
                f"make {name} the virtualenv itself, or install with copies (UV_LINK_MODE=copy)"
            )
        key = (_key(os.fstat(venv)), *sites)
        if key not in _WALKED:
            if len(_WALKED) > 64:
                _WALKED.clear()
            _WALKED[key] = _leads_out(venv, path)
        link, target = _WALKED[key]
        if link:
            raise LinkedLayout(
                f"{path} is {_STORE}, and holds a symlink leading out of it ({link} -> {target}), which "
                "your next install would follow; remove it, or install with copies (UV_LINK_MODE=copy)"
            )
        return [path]
    finally:
        os.close(venv)


def _key(st: os.stat_result) -> _Key:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _leads_out(venv: int, path: str) -> tuple[str, str]:
    """A symlink in the virtualenv at `path` that leads to a directory outside it, and where (the
    interpreter's, in `bin`, lead to a file); ("", "") for none. Past `_WALK` entries, one is
    assumed."""
    budget, todo = _WALK, [(path, os.dup(venv))]
    try:
        while todo:
            where, fd = todo.pop()
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        budget -= 1
                        if budget < 0:
                            return f"one of its {_WALK} entries and more", "?"
                        if entry.is_symlink():
                            real = resolved(f"{where}/{entry.name}")
                            if os.path.isdir(real) and not (real + "/").startswith(path + "/"):
                                return f"{where}/{entry.name}", real
                        elif entry.is_dir(follow_symlinks=False) and (sub := _open_dir(fd, entry.name)) is not None:
                            todo.append((f"{where}/{entry.name}", sub))
            finally:
                os.close(fd)
        return "", ""
    finally:
        for _, fd in todo:
            os.close(fd)


def _open_real_dir(path: str) -> int | None:
    """`paths.open_real_dir`, None where it is gone, or a symlink swapped in since."""
    try:
        return open_real_dir(path)
    except OSError:
        return None


def _open_dir(parent: int, *names: str, follow: bool = False) -> int | None:
    """The directory `names` lead to from `parent`, each one opened following no symlink (`follow`:
    following them, as an install does); None if one is missing, or no directory."""
    fd = parent
    for name in names:
        try:
            opened = os.open(name, _DIR & ~os.O_NOFOLLOW if follow else _DIR, dir_fd=fd)
        except OSError:
            opened = None
        if fd != parent:
            os.close(fd)
        if opened is None:
            return None
        fd = opened
    return fd


def _links_packages(venv: int, budget: list[int]) -> tuple[_Key, ...] | None:
    """Whether `venv` holds a site-packages (`lib/<python>/site-packages`) where an installed
    distribution's METADATA has another name (uv links every file of a package alike): each
    site-packages' `_key` if so, None if not. Every distribution is looked at,
    not a sample (code could crowd the linked ones out of one while nothing is linked yet); past
    `_PYTHONS` entries in lib or `budget` in its site-packages (what the builder's thread would
    look at for code that made them), it counts as linked."""
    lib = _open_dir(venv, "lib", follow=True)  # (a symlink on the way: looked through by `_leads_out`)
    if lib is None:
        return None
    try:
        versions = _entries(lib, stat.S_ISDIR, [_PYTHONS], follow=True)
        if versions is None:
            return ()
        sites, linked = [], False
        for version in versions:
            site = _open_dir(lib, version, "site-packages", follow=True)
            if site is not None:
                try:
                    sites.append(_key(os.fstat(site)))
                    linked = linked or _distributions_linked(site, sites[-1], budget)
                finally:
                    os.close(site)
        return tuple(sites) if linked else None
    finally:
        os.close(lib)


def _distributions_linked(site: int, key: _Key, budget: list[int]) -> bool:
    if key not in _SEEN:
        if len(_SEEN) > 256:
            _SEEN.clear()
        _SEEN[key] = _any_metadata_linked(site, budget)
    return _SEEN[key]


def _any_metadata_linked(site: int, budget: list[int]) -> bool:
    names = _entries(site, stat.S_ISDIR, budget, follow=True)  # (a .dist-info linked elsewhere: where uv puts it)
    if names is None:
        return True
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        info = _open_dir(site, name, follow=True)
        if info is None:
            continue
        try:
            if os.stat("METADATA", dir_fd=info, follow_symlinks=False).st_nlink > 1:
                return True
        except OSError:
            continue
        finally:
            os.close(info)
    return False


def _entries(directory: int, kind: Callable[[int], bool], budget: list[int], follow: bool = False) -> list[str] | None:
    """The names of `directory`'s entries of that `kind` (`follow`: a symlink's by where it leads),
    each entry taken from `budget` (shared by the directories of one look); None once it is spent."""
    found = []
    with os.scandir(directory) as listing:
        for entry in listing:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            try:
                if kind(entry.stat(follow_symlinks=follow).st_mode):
                    found.append(entry.name)
            except OSError:
                continue
    return found
