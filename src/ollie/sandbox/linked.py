"""The directories of a working directory whose files are hard links into a store the user's other
projects and tools share: uv installs a virtualenv's packages as hard links from its cache, pnpm a
project's from its store. A file has one content under all its names: written through the cwd's,
it changes in every other virtualenv, `uv tool` (ollie's own installation among them) and pnpm
project that links it, where the user runs it outside any sandbox. A jail keeps them read-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from ..paths import open_real, resolved

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_VENVS = (".venv", "venv")
_MOST = 20000  # entries of a cwd's site-packages looked at, all together; past them, counted as linked
_PYTHONS = 8  # entries of a virtualenv's lib (one python3.X as a rule); past them, counted as linked
_WALK = 300_000  # entries of a linked virtualenv looked through for symlinks; past them, the cwd is kept read-only
_TARGETS = 8  # directories a linked virtualenv's symlinks lead out to; past them, the cwd is kept read-only
# site-packages looked at: (device, inode, mtime) -> whether a distribution's files are linked
_SEEN: dict[tuple[int, int, int], bool] = {}
# linked virtualenvs looked through, by theirs and their site-packages' (device, inode, mtime): where
# their symlinks lead out to (every install adds a .dist-info to a site-packages: a new mtime)
_WALKED: dict[tuple, tuple[str, ...] | None] = {}


def linked_installs(cwd: str) -> tuple[str, ...]:
    """What of `cwd` (a real path) to keep read-only: its virtualenvs whose installed packages are
    hard-linked (`_linked_venv`), and pnpm's `node_modules/.pnpm`: looked at by descriptor,
    following no symlink but where a linking install would (code writes the cwd: a link there
    could lead anywhere, a dead mount included)."""
    try:
        found_cwd = open_real(cwd)
    except OSError:
        return ()
    try:
        top = os.open(f"/proc/self/fd/{found_cwd}", _DIR & ~os.O_NOFOLLOW)  # (the descriptor's own link)
    except OSError:
        return ()
    finally:
        os.close(found_cwd)
    try:
        budget = [_MOST]  # for every site-packages of the cwd: code can make 8 a virtualenv, and two of those
        found = [kept for venv in _VENVS for kept in _linked_venv(top, cwd, venv, budget)]
        pnpm = _open_dir(top, "node_modules", ".pnpm")
        if pnpm is not None:
            found.append(f"{cwd}/node_modules/.pnpm")
            os.close(pnpm)
        return tuple(dict.fromkeys(found))
    finally:
        os.close(top)


def _linked_venv(top: int, cwd: str, name: str, budget: list[int]) -> list[str]:
    """Nothing while none of the virtualenv `name`'s distributions is linked. Else the virtualenv
    whole, where it really is (a wheel's data files, `share/jupyter/kernels/…/kernel.json`, are
    links too), and every directory one of its symlinks leads out to: uv follows a link code
    planted there before your next install (`lib/python3.X` leading to another directory of the
    cwd) and links the files where it leads. The cwd whole where they are too many to keep, or
    the virtualenv too big to look through."""
    path = f"{cwd}/{name}"
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
            path = resolved(path)  # (where an install would go: judged as that directory)
            if not path:
                return [cwd]
    except OSError:
        return []
    venv = _open_real_dir(path)
    if venv is None:
        return []  # (gone, or a link swapped in since: seen by the next build)
    try:
        sites = _links_packages(venv, budget)
        if sites is None:
            return []
        st = os.fstat(venv)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, *sites)
        if key not in _WALKED:
            if len(_WALKED) > 64:
                _WALKED.clear()
            _WALKED[key] = _links_out(venv, path)
        targets = _WALKED[key]
        return [cwd] if targets is None else [path, *targets]
    finally:
        os.close(venv)


def _links_out(venv: int, path: str) -> tuple[str, ...] | None:
    """The directories outside the virtualenv at `path` that its symlinks lead to, and theirs in
    turn (an install writes beneath them too; the interpreter's, in `bin`, lead to a file); None
    past `_WALK` entries or `_TARGETS` directories."""
    targets: dict[str, None] = {}
    budget, todo = _WALK, [(path, os.dup(venv))]
    try:
        while todo:
            where, fd = todo.pop()
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        budget -= 1
                        if budget < 0:
                            return None
                        if entry.is_symlink():
                            real = resolved(f"{where}/{entry.name}")
                            kept = [path, *targets]
                            if os.path.isdir(real) and not any((real + "/").startswith(k + "/") for k in kept):
                                targets[real] = None
                                if len(targets) > _TARGETS:
                                    return None
                                if (sub := _open_real_dir(real)) is not None:
                                    todo.append((real, sub))
                        elif entry.is_dir(follow_symlinks=False) and (sub := _open_dir(fd, entry.name)) is not None:
                            todo.append((f"{where}/{entry.name}", sub))
            finally:
                os.close(fd)
        return tuple(targets)
    finally:
        for _, fd in todo:
            os.close(fd)


def _open_real_dir(path: str) -> int | None:
    """A readable descriptor of the directory at the real path `path`, refusing a symlink swapped in since."""
    try:
        found = open_real(path)
    except OSError:
        return None
    try:
        return os.open(f"/proc/self/fd/{found}", _DIR & ~os.O_NOFOLLOW)
    except OSError:
        return None
    finally:
        os.close(found)


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


def _links_packages(venv: int, budget: list[int]) -> tuple[tuple[int, int, int], ...] | None:
    """Whether `venv` holds a site-packages (`lib/<python>/site-packages`) where an installed
    distribution's METADATA has another name (uv links every file of a package alike): each
    site-packages' (device, inode, mtime) if so, None if not. Every distribution is looked at,
    not a sample (code could crowd the linked ones out of one while nothing is linked yet); past
    `_PYTHONS` entries in lib or `budget` in its site-packages (what the builder's thread would
    look at for code that made them), it counts as linked."""
    lib = _open_dir(venv, "lib", follow=True)  # (a symlink on the way: looked through by `_links_out`)
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
                    st = os.fstat(site)
                    sites.append((st.st_dev, st.st_ino, st.st_mtime_ns))
                    linked = linked or _distributions_linked(site, sites[-1], budget)
                finally:
                    os.close(site)
        return tuple(sites) if linked else None
    finally:
        os.close(lib)


def _distributions_linked(site: int, key: tuple[int, int, int], budget: list[int]) -> bool:
    if key not in _SEEN:  # (an install adds or replaces a .dist-info: a new mtime)
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
