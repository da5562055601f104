"""The directories of a working directory whose files are hard links into a store the user's other
projects and tools share: uv installs a virtualenv's packages as hard links from its cache, pnpm a
project's from its store. A file has one content under all its names: written through the cwd's,
it changes in every other virtualenv, `uv tool` (ollie's own installation among them) and pnpm
project that links it, where the user runs it outside any sandbox. A jail keeps them read-only."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from ..paths import open_real

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_VENVS = (".venv", "venv")
_MOST = 20000  # entries of a cwd's site-packages looked at, all together; past them, counted as linked
_PYTHONS = 8  # entries of a virtualenv's lib (one python3.X as a rule); past them, counted as linked
# site-packages looked at: (device, inode, mtime) -> whether a distribution's files are linked
_SEEN: dict[tuple[int, int, int], bool] = {}


def linked_installs(cwd: str) -> tuple[str, ...]:
    """`cwd`'s (a real path) virtualenvs' `lib` whose installed packages are hard-linked, and
    pnpm's `node_modules/.pnpm`: looked at by descriptor, following no symlink (code writes the
    cwd: a link there could lead anywhere, a dead mount included)."""
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
        found = [f"{cwd}/{venv}/lib" for venv in _VENVS if _links_packages(top, venv, budget)]
        pnpm = _open_dir(top, "node_modules", ".pnpm")
        if pnpm is not None:
            found.append(f"{cwd}/node_modules/.pnpm")
            os.close(pnpm)
        return tuple(found)
    finally:
        os.close(top)


def _open_dir(parent: int, *names: str) -> int | None:
    """The directory `names` lead to from `parent`, each one opened following no symlink; None if
    one is missing, or no directory."""
    fd = parent
    for name in names:
        try:
            opened = os.open(name, _DIR, dir_fd=fd)
        except OSError:
            opened = None
        if fd != parent:
            os.close(fd)
        if opened is None:
            return None
        fd = opened
    return fd


def _links_packages(top: int, venv: str, budget: list[int]) -> bool:
    """Whether `venv` in `top` holds a site-packages (`lib/<python>/site-packages`) where an
    installed distribution's METADATA has another name (uv links every file of a package alike).
    Every distribution is looked at, not a sample (code could crowd the linked ones out of one
    while nothing is linked yet); past `_PYTHONS` entries in lib or `budget` in its site-packages (what
    the builder's thread would look at for code that made them), it counts as linked."""
    lib = _open_dir(top, venv, "lib")
    if lib is None:
        return False
    try:
        versions = _entries(lib, stat.S_ISDIR, [_PYTHONS])
        if versions is None:
            return True
        for version in versions:
            site = _open_dir(lib, version, "site-packages")
            if site is not None:
                try:
                    if _distributions_linked(site, budget):
                        return True
                finally:
                    os.close(site)
        return False
    finally:
        os.close(lib)


def _distributions_linked(site: int, budget: list[int]) -> bool:
    st = os.fstat(site)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)  # an install adds or replaces a .dist-info: a new mtime
    if key not in _SEEN:
        if len(_SEEN) > 256:
            _SEEN.clear()
        _SEEN[key] = _any_metadata_linked(site, budget)
    return _SEEN[key]


def _any_metadata_linked(site: int, budget: list[int]) -> bool:
    names = _entries(site, stat.S_ISDIR, budget)
    if names is None:
        return True
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        info = _open_dir(site, name)
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


def _entries(directory: int, kind: Callable[[int], bool], budget: list[int]) -> list[str] | None:
    """The names of `directory`'s entries of that `kind`, each entry taken from `budget` (shared by
    the directories of one look); None once it is spent."""
    found = []
    with os.scandir(directory) as listing:
        for entry in listing:
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            try:
                if kind(entry.stat(follow_symlinks=False).st_mode):
                    found.append(entry.name)
            except OSError:
                continue
    return found


def _is(directory: int, name: str, kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False
