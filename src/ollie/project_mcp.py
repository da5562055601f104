"""A project's own MCP servers: the `.mcp.json` that other MCP hosts read (Claude Code, Cursor),
whose servers start only once the user has trusted that exact content.

Sandboxed code writes the project, so it can write this file too: a server it declared would start
at the next session, with the network and the variables its entry names. So a file starts nothing
until `ollie trust` has recorded the sha256 of its bytes in `$OLLIE_DATA_PATH/trusted-mcp.json`
(ollie's data, hidden from every sandbox), under the file's path; a file that changed since starts
nothing again until it is trusted again. Each file is read once, by descriptor (no symlink, a
regular file, at most MAX_BYTES): the bytes hashed are the bytes parsed, and the path is not read a
second time, so nothing swapped in after the check is ever what runs.

Which files: the session's cwd's, and that of the root of the git repository the cwd lies in (the
nearest directory above holding `.git`), as Claude Code reads a project's file at its root; where
both declare a name, the cwd's entry wins. Trusted servers run as an agent config's do (`mcp.py`),
but under the `tools` policy always: a project file may not name a sandbox (`parse_spec`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shlex
import stat
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import paths
from .config import data_path, private_dir
from .types import ConfigError

FILE_NAME = ".mcp.json"
MAX_BYTES = 256 << 10  # a project's .mcp.json; a larger one is not read
_STORE_MAX = 16 << 20  # the trust store
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(slots=True)
class ProjectFile:
    """One project's `.mcp.json` as read once: its bytes, or why it could not be read."""

    path: str  # its directory's real path, then /.mcp.json: the name it is trusted under
    data: bytes = b""
    error: str = ""  # why it was not read ("" when it was)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def servers(self) -> dict[str, Any]:
        """Its `mcpServers`, by name; ConfigError naming the file when they cannot be had."""
        try:
            doc = json.loads(self.data.decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise ConfigError(f"{self.path}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{self.path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        if not isinstance(doc, dict):
            raise ConfigError(f'{self.path}: must be a JSON object: {{"mcpServers": {{...}}}}')
        servers = doc.get("mcpServers", {})
        if not isinstance(servers, dict):
            raise ConfigError(f"{self.path}: mcpServers must be an object of servers by name")
        return servers

    def variables(self) -> list[str]:
        """The environment variables its entries expand (`${NAME}`): what of yours a server gets."""
        return sorted(set(_VAR.findall(self.data.decode("utf-8", errors="replace"))))


def directories(cwd: str) -> list[str]:
    """The directories whose `.mcp.json` a session in `cwd` reads, the outer first: the root of
    the git repository `cwd` lies in (when it is not `cwd` itself), then `cwd`."""
    here = cwd
    while True:
        if os.path.lexists(os.path.join(here, ".git")):
            return [here, cwd] if here != cwd else [cwd]
        up = os.path.dirname(here)
        if up == here:
            return [cwd]
        here = up


def read(directory: str) -> ProjectFile | None:
    """`directory`'s `.mcp.json`, read once by descriptor; None when there is none. A symlink is
    refused (the trust is given to a file in the project, and a link there is the project's
    to re-point), as are what is not a regular file (a FIFO is not waited on) and a file over
    MAX_BYTES; `error` says which."""

    path = os.path.join(directory, FILE_NAME)
    try:
        top = paths.open_real(directory)  # a real path: a symlink on it was planted since
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        return ProjectFile(path, error=f"{path} not read: {directory} is not reachable without a symlink")
    try:
        path = os.path.join(paths.real_path(top), FILE_NAME)
        try:
            fd = os.open(FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=top)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                why = (
                    "it is a symbolic link; ollie reads a project's .mcp.json only as a file of its own (copy it there)"
                )
            else:
                why = e.strerror or str(e)
            return ProjectFile(path, error=f"{path} not read: {why}")
    finally:
        os.close(top)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ProjectFile(path, error=f"{path} not read: not a regular file")
        data = _read(fd, MAX_BYTES + 1)
    except OSError as e:
        return ProjectFile(path, error=f"{path} not read: {e.strerror or e}")
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return ProjectFile(path, error=f"{path} not read: it is over {MAX_BYTES >> 10} KiB")
    return ProjectFile(path, data)


def declared(cwd: str, taken: Collection[str] = ()) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """The servers that the trusted `.mcp.json` files of a session in `cwd` declare, as (name,
    entry, the file declaring it), but those whose name is `taken` (the agent config's own, which
    win); and notices for the user: a file not trusted, or changed since, a name given up."""
    infos: list[str] = []
    try:
        trusted = _load()
    except ConfigError as e:  # fail closed: nothing of a project starts
        trusted = {}
        infos.append(f"{e}; no project's {FILE_NAME} is trusted until it is")
    chosen: dict[str, tuple[Any, str]] = {}
    for directory in directories(cwd):
        found = read(directory)
        if found is None:
            continue
        if found.error:
            infos.append(found.error)
            continue
        digest = trusted.get(found.path, {}).get("sha256")
        if digest != found.sha256:
            if notice := _untrusted(found, changed=digest is not None):
                infos.append(notice)
            continue
        try:
            servers = found.servers()
        except ConfigError as e:
            infos.append(f"{e}; none of its MCP servers started")
            continue
        for name, entry in servers.items():
            if name in chosen:
                infos.append(f"{found.path}: mcp server {shown(name)} replaces the one {chosen[name][1]} declares")
            chosen[name] = (entry, found.path)
    servers_found = []
    for name, (entry, path) in chosen.items():
        if name in taken:
            infos.append(f"{path}: mcp server {shown(name)} skipped: the agent config declares one of that name")
        else:
            servers_found.append((name, entry, path))
    return servers_found, infos


def _read(fd: int, limit: int) -> bytes:
    pieces, left = [], limit
    while left > 0 and (piece := os.read(fd, left)):
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def _untrusted(found: ProjectFile, changed: bool) -> str:
    try:
        names = list(found.servers())
    except ConfigError:
        names = []  # it starts nothing either way; `ollie trust` says what is wrong with it
    else:
        if not names:
            return ""  # nothing to start, nothing to say

    listed = ", ".join(shown(n[:40]) for n in names[:5]) + (", ..." if len(names) > 5 else "")
    what = f"its MCP servers ({listed})" if listed else "its MCP servers"
    why = "it changed since you trusted it" if changed else "it is not trusted yet"
    return (
        f"{found.path}: {what} not started: {why}; review the file, then run "
        f"`ollie trust {shlex.quote(found.directory)}` to start them"
    )


def shown(text: str) -> str:
    """`text` from a file the model may have written, on one line and with nothing that could
    drive a terminal or disguise itself: each unprintable character (controls, line breaks, bidi
    overrides, zero-width ones) as an escape."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" for c in text)


# ---- the trust store --------------------------------------------------------------------------


def store_path() -> Path:
    """Where trusted files are remembered: ollie's data, which no sandbox sees."""
    return data_path() / "trusted-mcp.json"


def trusted_files() -> dict[str, dict[str, str]]:
    """Each trusted file's path, and its "sha256" and when it was trusted ("at")."""
    return _load()


def trust(found: ProjectFile) -> None:
    """Remember `found`'s bytes as trusted for its path (replacing what was trusted there)."""
    with _locked() as files:
        files[found.path] = {"sha256": found.sha256, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def revoke(path: str) -> bool:
    """Forget the trust of the file at `path`; whether it was trusted."""
    with _locked() as files:
        return files.pop(path, None) is not None


@contextmanager
def _locked() -> Iterator[dict[str, dict[str, str]]]:
    """The store's entries to change, written back atomically (a temporary file renamed over it,
    0600) on a clean exit; one `ollie trust` at a time (a lock beside it)."""
    path = store_path()
    private_dir(path.parent)
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        files = _load()
        yield files
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump({"version": 1, "files": files}, out, indent=1, sort_keys=True)
                out.write("\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        os.close(lock)


def _load() -> dict[str, dict[str, str]]:
    path = store_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the trusted MCP files: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file; remove it")
        raw = _read(fd, _STORE_MAX)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
        files = doc["files"]
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()
        ):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path}: not the trusted MCP files ollie writes; remove it (and trust again)") from None
    return files
