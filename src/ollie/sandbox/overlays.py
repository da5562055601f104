"""Your package caches, seen copy-on-write from the cwd's own cache (`{CACHE}`) in a jail.

Sandboxed code's $XDG_CACHE_HOME is the cwd's own cache, empty in a new project: `uv sync` or
`npm ci --offline` could not find what your own cache holds and needed the network, and `go test`
rebuilt the standard library. A jail mounts an overlay at the cache's place there (`{CACHE}/uv`):
your cache read-only beneath, and above it a directory of the cwd's cache that takes what code
writes. Your cache is never written; what code writes stays with the cwd.

Two overlays may not share their upper directory, so each running jail of a cwd takes one of
`SLOTS` slots (`{CACHE}/.overlay/<name>/<n>`), locked for the jail's life by the ollie process
that started it (`take_slot`); past them a jail gets the cwd's cache alone, as without overlays.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..paths import Identity, open_real, resolved

HOPS = 40  # symlinks followed on a cache's path, as the kernel's limit
SLOTS = 8  # jails of one cwd at once with their own view of each cache; the next get the cwd's cache alone


@dataclass(frozen=True, slots=True)
class Overlay:
    name: str  # the cache's name, and its slots' directory: `{CACHE}/.overlay/<name>`
    target: str  # where code finds it: the cache's place in the cwd's cache
    lower: str  # your cache (a real path), read-only beneath
    identity: Identity  # what `lower` was when decided: a jail mounts it only if it still is


def your_caches(
    env: Mapping[str, str], home: str, xdg: Mapping[str, str]
) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The caches given a view: (name, its place in the cwd's cache, where yours is, names one of
    which its top holds: it is that tool's cache, not a directory a variable misnames). `xdg`:
    the XDG base directories, as the user's tools find them."""
    npm = env.get("npm_config_cache") or f"{home}/.npm"
    pnpm = env.get("pnpm_config_store_dir") or env.get("npm_config_store_dir") or f"{xdg['XDG_DATA_HOME']}/pnpm/store"
    return [
        ("uv", "uv", env.get("UV_CACHE_DIR") or f"{xdg['XDG_CACHE_HOME']}/uv", ("CACHEDIR.TAG",)),
        ("npm", "npm/_cacache", f"{npm}/_cacache", ("index-v5",)),
        ("go-build", "go-build", env.get("GOCACHE") or f"{xdg['XDG_CACHE_HOME']}/go-build", ("README",)),
        # pnpm's store, each major version in a directory of its own, and its cache of the registry's
        # answers and of the lockfiles it checked (pnpm 10 and later, by version too)
        ("pnpm-store", "pnpm-store", pnpm, tuple(f"v{n}/files" for n in (3, 10, 11, 12))),
        ("pnpm", "pnpm", f"{xdg['XDG_CACHE_HOME']}/pnpm", ("metadata", *(f"v{n}/metadata" for n in (10, 11, 12)))),
    ]


def decide(
    cache: str,
    env: Mapping[str, str],
    home: str,
    xdg: Mapping[str, str],
    writable: list[str],
    kept_out: Iterable[str],
) -> tuple[Overlay, ...]:
    """The overlays of a policy whose cwd's cache is `cache`: each of `your_caches` that is a
    directory of yours, reached by no symlink code could have made (one in a directory of
    `writable`, the real paths code may write), holding its mark, neither $HOME nor above it, none
    of it writable by code, nor in it (it would change beneath the overlay) and none of `kept_out` (ollie's
    hidden directories, the masked files) in it: an overlay shows what lies beneath the mounts
    that hide them."""

    def writes(path: str) -> bool:
        return any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable)

    homes = {h.rstrip("/") + "/" for h in (home, resolved(home)) if h}
    found = []
    for name, place, given, marks in your_caches(env, home, xdg):
        real = _resolve(given, writes) if os.path.isabs(given) else ""
        if not real or real == "/" or writes(real) or any(w.startswith(real.rstrip("/") + "/") for w in writable):
            continue
        if any(h.startswith(real.rstrip("/") + "/") for h in homes):
            continue
        if any(p == real or p.startswith(real.rstrip("/") + "/") for p in kept_out):
            continue
        try:
            fd = open_real(real)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            marked = any(_holds(fd, mark) for mark in marks)
        finally:
            os.close(fd)
        if marked and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            found.append(Overlay(name, f"{cache}/{place}", real, (st.st_dev, st.st_ino)))
    return tuple(found)


def _holds(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _resolve(path: str, writes: Callable[[str], bool]) -> str:
    """The real path of `path` (absolute), a component at a time: "" where a symlink on the way
    is not the system's (`_system_made`) or lies in a directory code may write (`writes`), or the
    way leads nowhere. A link of yours could be one code made: in a project, any project's
    sessions write it (a red-team pass planted one in one project's tree that another project's
    jail followed to a directory of secrets)."""
    done, pending, hops = "/", path.split("/"), 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        here = os.path.join(done, name)
        try:
            st = os.lstat(here)
            if not stat.S_ISLNK(st.st_mode):
                done = here
                continue
            hops += 1
            if hops > HOPS or writes(done) or not _system_made(st, done):
                return ""
            target = os.readlink(here)
        except OSError:
            return ""
        if target.startswith("/"):
            done = "/"
        pending = target.split("/") + pending
    return done


def _system_made(link: os.stat_result, directory: str) -> bool:
    """Whether a symlink is root's, in a directory only root may write, and you are not root:
    made by the system's administrator, never by code of yours (as root, every link is yours)."""
    if os.geteuid() == 0 or link.st_uid != 0:
        return False
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def take_slot(cache: str, name: str) -> tuple[str, int] | None:
    """A slot of the overlay `name` in the cwd's cache `cache` that no running jail holds: its
    path and the descriptor whose lock holds it (closed when the jail ends); None when all are
    held. Made and opened by descriptor, following no symlink (code writes the cwd's cache)."""
    try:
        top = open_real(cache)
    except OSError:
        return None
    fd = -1
    try:
        for part in (".overlay", name):
            fd = _subdirectory(top, part)
            os.close(top)
            top, fd = fd, -1
        for n in range(SLOTS):
            try:
                fd = _subdirectory(top, str(n), os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if fd >= 0:
                    os.close(fd)
                    fd = -1
                if e.errno in (errno.EWOULDBLOCK, errno.ENOTDIR, errno.ELOOP):
                    continue  # held by another jail, or code made something else of it
                return None
            return f"{cache}/.overlay/{name}/{n}", fd
        return None
    except OSError:
        return None
    finally:
        os.close(top)


def _subdirectory(parent: int, name: str, flags: int = os.O_PATH) -> int:
    """The directory `name` in `parent`, made if missing, opened refusing a symlink."""
    flags |= os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        return os.open(name, flags, dir_fd=parent)
