"""The directories of a working directory whose files are hard links into a store the user's other
projects and tools share: uv installs a virtualenv's packages as hard links from its cache, pnpm a
project's from its store. A file has one content under all its names: written through the cwd's,
it changes in every other virtualenv, `uv tool` (ollie's own installation among them) and pnpm
project that links it, where the user runs it outside any sandbox. A jail keeps them read-only."""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable

from ..paths import open_real

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_VENVS = (".venv", "venv")
_SAMPLE = 64  # entries of site-packages looked at, and of each package directory among them


def linked_installs(cwd: str) -> tuple[str, ...]:
    """`cwd`'s (a real path) virtualenvs' `lib` where a sample of their site-packages holds a
    hard-linked file, and pnpm's `node_modules/.pnpm`: looked at by descriptor, following no
    symlink (code writes the cwd: a link there could lead anywhere, a dead mount included)."""
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
        found = [f"{cwd}/{venv}/lib" for venv in _VENVS if _links_packages(top, venv)]
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


def _links_packages(top: int, venv: str) -> bool:
    """Whether `venv` in `top` is a virtualenv a sample of whose installed files is hard-linked."""
    home = _open_dir(top, venv)
    if home is None:
        return False
    try:
        lib = _open_dir(home, "lib") if _is(home, "pyvenv.cfg", stat.S_ISREG) else None
    finally:
        os.close(home)
    if lib is None:
        return False
    try:
        for version in _entries(lib, stat.S_ISDIR):
            site = _open_dir(lib, version, "site-packages")
            if site is not None:
                try:
                    if _holds_link(site):
                        return True
                finally:
                    os.close(site)
        return False
    finally:
        os.close(lib)


def _holds_link(site: int) -> bool:
    """Whether one of the first files of `site`, or of its first package directories, has another name."""
    if _entries(site, stat.S_ISREG, linked=True):
        return True
    for name in _entries(site, stat.S_ISDIR):
        package = _open_dir(site, name)
        if package is not None:
            try:
                if _entries(package, stat.S_ISREG, linked=True):
                    return True
            finally:
                os.close(package)
    return False


def _entries(directory: int, kind: Callable[[int], bool], linked: bool = False) -> list[str]:
    """The names of the first _SAMPLE entries of `directory` of that `kind` (and hard-linked)."""
    found = []
    with os.scandir(directory) as listing:
        for entry in itertools.islice(listing, _SAMPLE):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if kind(st.st_mode) and (not linked or st.st_nlink > 1):
                found.append(entry.name)
    return found


def _is(directory: int, name: str, kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False
