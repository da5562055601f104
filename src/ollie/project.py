"""What ollie reads from the project a session works in: its directories from the repository's root
down to the cwd, and the instructions they hold (`AGENTS.md`, else `CLAUDE.md`), after the user's
own (`$OLLIE_CFG_PATH/AGENTS.md`).

These files are text for the model and nothing more: nothing in them runs. Sandboxed code may
write them (the cwd is writable), so each is read safely (`read_text`): a symlink only while it
stays in its directory, never a file in ollie's hidden directories (a planted
`AGENTS.md -> ~/.config/ollie/env` would put the keys in the system prompt, which the model and
the session's own view read back), never a FIFO, and only so much of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import config, paths

INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")  # in each directory, the first one found
INSTRUCTIONS_MAX = 32 * 1024  # bytes of instructions in all, as Codex bounds them


@dataclass(frozen=True, slots=True)
class Instructions:
    path: str
    text: str
    cut: bool  # only the file's first bytes were read


def project_dirs(cwd: str) -> list[str]:
    """The directories from the repository's root (the nearest one above that holds `.git`) down to
    `cwd`; only `cwd` when it is in no repository."""
    dirs, here = [], os.path.abspath(cwd)
    while True:
        dirs.append(here)
        if os.path.exists(os.path.join(here, ".git")):
            return dirs[::-1]
        up = os.path.dirname(here)
        if up == here:
            return [dirs[0]]
        here = up


def read_text(directory: str, name: str, limit: int, trusted: bool = False) -> tuple[str, int, int] | None:
    """The text of `directory/name` (its first `limit` bytes, decoded), how many bytes that was,
    and the file's size; None if there is no such file. Raises OSError naming why a file that is
    there cannot be read. `trusted`: a directory of ollie's own (hidden from the sandbox), whose
    files may lie in it, reached through your links. Not on the event loop: a link code planted
    in a project can lead into ollie's own mount, which the loop serves."""

    hidden = {} if trusted else paths.identities(config.hidden_dirs())
    try:
        raw, size = paths.read_beneath(directory, name, limit, hidden, linked=trusted)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return raw.decode("utf-8", errors="replace"), len(raw), size


def instructions(cwd: str) -> tuple[list[Instructions], list[str]]:
    """The instructions for a session in `cwd`, in the order the model reads them (the user's
    first, the nearest directory's last), within INSTRUCTIONS_MAX bytes in all; and notices for the
    user (a file cut short or not read)."""
    found: list[Instructions] = []
    notices: list[str] = []
    left = INSTRUCTIONS_MAX
    user = str(config.cfg_path())
    for directory in [user, *project_dirs(cwd)]:
        for name in INSTRUCTION_FILES:
            path = os.path.join(directory, name)
            try:
                got = read_text(directory, name, left, trusted=directory == user)
            except OSError as e:
                notices.append(f"instructions: {path} not read: {e.strerror or e}")
                break
            if got is None:
                continue
            text, kept, size = got
            if size > kept:
                notices.append(
                    f"instructions: {path} is {size} bytes; the model reads "
                    + (f"its first {kept}" if kept else "none of it")
                    + f" (instruction files get {INSTRUCTIONS_MAX // 1024} KiB in all)"
                )
            if text.strip():
                found.append(Instructions(path, text, size > kept))
            left -= kept
            break
    return found, notices
