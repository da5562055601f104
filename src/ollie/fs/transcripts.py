"""Killed sessions, kept for a while, and `tr/` where they show.

`rm -r s/<id>` (or `kill <id>`) moves the session's directory from `$OLLIE_DATA_PATH/sessions/<id>`
to `$OLLIE_DATA_PATH/transcripts/<id>` (`<id>.2`, … when the name is taken): a mistaken `rm -r s/`
loses nothing. `tr/<id>/` shows it read-only (chat, plan, history.jsonl, meta.json) for
`$OLLIE_TRANSCRIPT_DAYS` days (default 7; 0 deletes at once), counted from the kill. Expired ones
are pruned when the server starts and every PRUNE_INTERVAL seconds after. To bring one back, stop
the server and move its directory back into sessions/.

The plain files of transcripts/ are the chats saved with ctl `save`: the user's, never pruned.
"""

from __future__ import annotations

import errno as E
import logging
import math
import os
import shutil
import time
from pathlib import Path

from .. import config
from ..types import ConfigError
from ..vfs.namespace import Dir, File, FsError, check_name
from ..vfs.stores import DiskDir

log = logging.getLogger("ollie.fs")

TRANSCRIPT_DAYS = 7.0  # the default of $OLLIE_TRANSCRIPT_DAYS
PRUNE_INTERVAL = 3600.0


def transcripts_dir() -> Path:
    return config.data_path() / "transcripts"


def retention() -> float:
    """How long a killed session is kept, in seconds."""
    raw = os.environ.get("OLLIE_TRANSCRIPT_DAYS", "")
    try:
        days = float(raw) if raw else TRANSCRIPT_DAYS
    except ValueError:
        days = math.nan
    if not 0 <= days < math.inf:
        raise ConfigError(f"OLLIE_TRANSCRIPT_DAYS={raw!r}: expected a number of days (0 keeps no transcripts)")
    return days * 86400


def keep(session_dir: Path) -> str | None:
    """Move a killed session's directory to transcripts/ (delete it if none are kept). Returns its
    name there."""
    if not session_dir.is_dir():
        return None
    if retention() == 0:
        shutil.rmtree(session_dir, ignore_errors=True)
        return None
    root = transcripts_dir()
    root.mkdir(parents=True, exist_ok=True)
    name, n = session_dir.name, 1
    while os.path.lexists(root / name):  # rename(2) would replace an empty directory silently
        n += 1
        name = f"{session_dir.name}.{n}"
    os.rename(session_dir, root / name)
    os.utime(root / name)  # its age counts from the kill
    return name


def prune() -> int:
    """Delete the kept sessions older than the retention. Returns how many went."""
    cutoff = time.time() - retention()
    pruned = 0
    try:
        entries = list(os.scandir(transcripts_dir()))
    except FileNotFoundError:
        return 0
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < cutoff:
                shutil.rmtree(e.path)
                pruned += 1
        except OSError as err:
            log.warning("cannot prune transcript %s: %s", e.path, err)
    return pruned


class TranscriptsDir(DiskDir):
    """tr/: saved chats (files, as in any disk directory) and killed sessions (read-only
    directories, removed only by expiry)."""

    def _kept(self, name: str) -> Path | None:
        path = self.path / check_name(name)
        return path if path.is_dir() else None

    def lookup(self, name: str) -> File | Dir:
        if path := self._kept(name):
            return DiskDir(path, writable=False)
        return super().lookup(name)

    async def list(self) -> list[tuple[str, File | Dir]]:
        try:
            kept = [(e.name, DiskDir(Path(e.path), writable=False)) for e in os.scandir(self.path) if e.is_dir()]
        except FileNotFoundError:
            kept = []
        return sorted([*await super().list(), *kept], key=lambda entry: entry[0])

    def _refuse_kept(self, name: str) -> None:
        if self._kept(name):
            raise FsError(E.EACCES, f"{name}: a killed session, kept read-only until it expires")

    async def remove(self, name: str) -> None:
        self._refuse_kept(name)
        await super().remove(name)

    async def rename(self, old: str, new: str) -> None:
        self._refuse_kept(old)
        self._refuse_kept(new)
        await super().rename(old, new)
