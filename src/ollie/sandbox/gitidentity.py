"""The git identity sandboxed code commits with.

git dies ("unknown error occurred while reading the configuration files") on a global config it may
not read, and ~/.gitconfig lies outside the grants. In its place the sandbox's git reads, as its
global config (`GIT_CONFIG_GLOBAL`), a file holding only the user's name and email: no alias,
include, credential helper or URL rewrite (which may hold a token) crosses over, and a repository's
own `user.name` or `user.email` still wins, as global settings lose to local ones. The identity is
read from the file here, never by running a git found on a PATH the project may lead."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading

from .. import config

_SECTION = re.compile(r"\s*\[\s*([A-Za-z0-9.-]+)\s*(\"[^\"]*\")?\s*\]")
_VALUE = re.compile(r"\s*(name|email)\s*=\s*(.*)", re.IGNORECASE)


def global_config(granted: tuple[str, ...]) -> str:
    """What the sandbox's git reads as its global config: "" when the user has none or a grant
    (`granted`, real paths) lets it read the real one; /dev/null when it holds no identity; else
    a file in ollie's data (`identity_file`)."""
    real = _user_global_config()
    if not real or any(real == p or real.startswith(p.rstrip("/") + "/") for p in granted):
        return ""
    user = _user(real)
    return identity_file(user) if user else os.devnull


def identity_file(user: dict[str, str]) -> str:
    """A git config file of ollie's data holding `user` (name, email) and nothing else, shared by
    every sandbox of that identity; written whole under a temporary name, then renamed."""
    text = "[user]\n" + "".join(f'\t{key} = "{_quoted(value)}"\n' for key, value in sorted(user.items()))
    directory = config.data_dir("sandbox-git")
    path = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.gitconfig"
    if not path.exists():
        temporary = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
        temporary.write_text(text)
        os.replace(temporary, path)
    return str(path)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _user_global_config() -> str:
    """The global git config that exists, if any (git reads both; either unreadable is fatal)."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    found = [p for p in (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")) if os.path.exists(p)]
    return os.path.realpath(found[0]) if found else ""


def _user(path: str) -> dict[str, str]:
    """user.name and user.email of a git config file: its [user] section's, the last one set wins,
    as git has it; a quoted value unquoted, a comment (# or ;) after it dropped."""
    found: dict[str, str] = {}
    try:  # a regular file, opened without blocking: code working in $HOME could make it a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return found
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return found
        lines = f.read(1 << 20).decode("utf-8", "replace").splitlines()
    section = ""
    for line in lines:
        if header := _SECTION.match(line):
            section = header[1].lower() if header[2] is None else ""
            continue
        if section == "user" and (item := _VALUE.match(line)):
            value = item[2].strip()
            if value.startswith('"') and '"' in value[1:]:
                value = value[1 : value.index('"', 1)]
            else:
                value = re.split(r"\s[#;]", value, maxsplit=1)[0].strip()
            if value and "\0" not in value:
                found[item[1].lower()] = value
    return found
