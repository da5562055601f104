"""The cache directory of each working directory's sandboxed code (`{CACHE}`), and their trim.

Toolchains cache what they build and fetch under $XDG_CACHE_HOME. Shared, a cache one project's code
wrote would be what another project's build reads, or the user's own: each cwd's code gets a
directory of its own in ollie's data. Each use marks it (its mtime); one not used for `KEEP_DAYS` is
removed, looked for at most once a day, in a thread of its own, as Go trims its build cache."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from .. import config

KEEP_DAYS = 30  # a cwd's cache no session used for this long is removed (the cwd was a test's, or is gone)
_DAY = 86400.0
_STAMP = "trimmed"  # its mtime: when the caches were last looked at for the trim


def cache_dir(cwd: str) -> str:
    """The cache directory of the sessions working in `cwd` (a real path), made if missing and
    marked as used now; the trim started if it is due."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(cwd))[:40] or "root"
    digest = hashlib.sha256(cwd.encode(errors="surrogateescape")).hexdigest()[:16]
    caches = config.data_dir("sandbox-cache")
    path = config.private_dir(caches / f"{name}-{digest}")
    os.utime(path)
    _trim_if_due(caches, time.time())
    return str(path)


def _trim_if_due(caches: Path, now: float) -> None:
    """Start `trim` in a thread unless the caches were looked at less than a day ago (by any ollie
    process: the stamp's mtime, set before the look, so that one process looks)."""
    stamp = caches / _STAMP
    try:
        if now - stamp.stat().st_mtime < _DAY:
            return
    except FileNotFoundError:
        pass
    stamp.touch()
    threading.Thread(target=trim, args=(caches, now), name="ollie-cache-trim", daemon=True).start()


def trim(caches: Path, now: float) -> list[str]:
    """Remove the caches of `caches` not used in KEEP_DAYS (what sandboxed code wrote there,
    removed without following any link it made); the names removed."""
    removed = []
    for entry in os.scandir(caches):
        try:
            unused = now - entry.stat(follow_symlinks=False).st_mtime > KEEP_DAYS * _DAY
            if unused and entry.is_dir(follow_symlinks=False):
                _remove(entry.path)
                removed.append(entry.name)
        except OSError:  # gone meanwhile
            continue
    return removed


def _remove(path: str) -> None:
    """`path` and what is in it, by the system's `rm`, which opens each directory following no link
    and without blocking: shutil.rmtree looks at a name, then opens it following links (code that
    swaps a directory of its cache for a link meanwhile had ollie open its choice, a FIFO that held
    the trim for good, a device), and recurses no deeper than Python does (code can make a tree
    deeper)."""
    rm = [config.system_program("rm"), "-rf", "--one-file-system", "--", path]
    subprocess.run(rm, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
