"""The configuration files of the user's tools that sandboxed code may read: those that hold no
secret. Some tools die on a configuration they may not read (cargo on `~/.cargo/config.toml`,
yarn on `~/.npmrc`) or lose its settings (pip its index and certificates); the same files often
hold a registry's token. Each is read here first, in the builder's thread, and granted read-only
only when no key names a token, password, secret or credential and no URL carries one."""

from __future__ import annotations

import os
import re
import stat

LIMIT = 64 << 10  # a larger configuration is not read, nor granted
# (user:password@ in a URL; possessive: no backtracking over a long line)
_URL_CREDENTIAL = re.compile(r"://[^\s/@:]*+:[^\s/@]*+@")
_SECRET_KEY = re.compile(r"token|passw|secret|_auth|credential|api[-_]?key", re.IGNORECASE)

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


def secret_free(path: str) -> bool:
    """Whether `path` (a directory: its pip.conf) is a regular file of at most LIMIT bytes holding
    no secret: opened without blocking, looked at before it is read (a device's open may act)."""
    if os.path.isdir(path):
        path = os.path.join(path, "pip.conf")
        if not os.path.lexists(path):
            return True
    try:
        found = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(found)
        if not stat.S_ISREG(st.st_mode) or st.st_size > LIMIT:
            return False
        fd = os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return False
    finally:
        os.close(found)
    with open(fd, "rb") as f:
        data = f.read(LIMIT + 1)
    text = data.decode("utf-8", "replace")
    if len(data) > LIMIT or _URL_CREDENTIAL.search(text):
        return False
    return not any(_SECRET_KEY.search(line.split("=", 1)[0]) for line in text.splitlines() if "=" in line)
