"""The configuration files of the user's tools that sandboxed code may read: those that hold no
secret. Some tools die on a configuration they may not read (cargo on `~/.cargo/config.toml`,
yarn on `~/.npmrc`) or lose its settings (pip its index and certificates); the same files often
hold a registry's token. Each is read here first, in the builder's thread, and granted read-only
only when nothing in it looks like a secret (`_SECRET`)."""

from __future__ import annotations

import os
import re

from ..paths import open_regular

LIMIT = 64 << 10  # a larger configuration is not read, nor granted
# What a secret looks like anywhere in a line (a key, an inline table's key, a value): a word that
# names one, a private key, a token's well-known prefix, cargo's [env] (variables for builds), a
# name before an @ in a URL or host (user@, user:password@), an escape that could spell one (TOML's
# \u). Leaving out a harmless file costs little. (Each run of a name is tried once, from its start,
# possessively: linear in the line.)
_SECRET = re.compile(
    r"token|passw|secret|_auth|credential|api[-_]?key|private key|\\u|^\s*\[\s*env\s*\]"
    r"|ghp_|gho_|ghs_|github_pat_|glpat-|pypi-|xox[abp]-|AKIA"
    r"|(?<![^\s/@:=\"'])[^\s/@:=\"']++(?::[^\s/@:\"']*+)?@[\w.-]",
    re.IGNORECASE | re.MULTILINE,
)

# The files (or a directory and its pip.conf), by template, as a policy names paths.
CONFIGS = (
    "{CARGO_HOME}/config.toml",
    "{CARGO_HOME}/config",
    "{HOME}/.cargo/config.toml",
    "{HOME}/.cargo/config",
    "{HOME}/.npmrc",
    "{XDG_CONFIG_HOME}/pip/pip.conf",
    "{HOME}/.pip/pip.conf",
    "/etc/pip.conf",
    "/etc/xdg/pip",
)


# What each file was judged, by which file it was and when it last changed: every session's start
# reads the policy (500 at once would read and search the same files 500 times).
_JUDGED: dict[str, tuple[tuple[int, ...], bool]] = {}


def secret_free(path: str) -> bool:
    """Whether `path` (a directory: its pip.conf) is a regular file of at most LIMIT bytes holding
    no secret (`open_regular`: looked at before it is opened, opened without blocking)."""
    if os.path.isdir(path):
        path = os.path.join(path, "pip.conf")
        if not os.path.lexists(path):
            return True
    if (opened := open_regular(path)) is None:
        return False
    fd, st = opened
    with open(fd, "rb") as f:
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if (judged := _JUDGED.get(path)) is not None and judged[0] == seen:
            return judged[1]
        data = f.read(LIMIT + 1)
    free = len(data) <= LIMIT and not _SECRET.search(data.decode("utf-8", "replace"))
    _JUDGED[path] = (seen, free)
    return free
