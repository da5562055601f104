"""Sandbox policies: what sandboxed code may touch, read from the built-in policies and the user's
policy files, validated and expanded for one working directory.

A policy says what sandboxed code may touch: filesystem paths by right (`ro`, `rox`, `rw`, `rwx`, and
`tmpfile` for unnamed temporary files), TCP ports (`bind_tcp`, `connect_tcp`, or `unrestricted`), Unix
sockets (`unix`), which environment variables pass, and resource `limits`.
It is a built-in policy (`default`, or `hooks` for hook commands) overlaid by
`$OLLIE_CFG_PATH/sandbox.yaml`, then by `$OLLIE_CFG_PATH/sandbox/<name>.yaml` (maps merge, lists
extend, scalars replace).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import stat
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..paths import identity, within
from ..types import ConfigError


class SandboxError(ConfigError):
    """A policy is invalid, or the kernel cannot enforce it."""


# The parts of /etc that programs read: loader, users and groups, name resolution, time, locale,
# terminfo, CA certificates, fontconfig. Not shadow, gshadow, sudoers, ssh host keys or ssl/private.
_ETC = """ld.so.cache ld.so.conf ld.so.conf.d passwd group nsswitch.conf hosts host.conf resolv.conf
    gai.conf services protocols localtime timezone locale.alias locale.conf default/locale mime.types
    magic magic.mime inputrc terminfo ssl/certs ssl/openssl.cnf ca-certificates ca-certificates.conf
    pki/tls/certs os-release lsb-release debian_version perl python3 gitconfig fonts""".split()
# A JDK's configuration (its lib/jvm.cfg and conf/security/java.security are links there on Debian:
# without it javac, Gradle and Maven fail with "Error loading java.security file").
_ETC += sorted(name for name in os.listdir("/etc") if name.startswith("java-")) if os.path.isdir("/etc") else []

_HOME_TOOLCHAINS = [
    "{RUSTUP_HOME}",
    "{HOME}/.rustup",
    "{CARGO_HOME}/bin",
    "{HOME}/.cargo/bin",
    "{NVM_DIR}",
    "{HOME}/.nvm",
    "{HOME}/.pyenv",
    "{HOME}/.local/bin",
    "{HOME}/.local/share/uv/python",
    "{HOME}/.local/share/uv/tools",
    "{HOME}/.local/share/pipx/venvs",
    "{HOME}/.sdkman/candidates",
    "{HOME}/go/bin",
    "{HOME}/.bun/bin",
    "{HOME}/.deno/bin",
]

DEFAULT_POLICY: dict[str, Any] = {
    "filesystem": {
        # The system's programs and libraries, and the Python running ollie (pyenv or venv
        # outside /usr). Tool script directories are added per call.
        "rox": [
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/opt",
            "/etc/alternatives",
            sys.base_prefix,
            sys.prefix,
            # Toolchains and programs installed under $HOME, read and run (none holds a secret:
            # not ~/.cargo itself, whose credentials.toml does): `cargo test`, `npm test` under nvm, ...
            *_HOME_TOOLCHAINS,
            # The git work tree a cwd below its root lies in (`repository_root`): git finds its
            # repository, a monorepo's hoisted node_modules/.bin and .venv run.
            "{REPO}",
        ],
        # /proc: ps, /dev/fd and Python need it; Landlock's ptrace rule already hides the environ,
        # memory and fds of every process outside the sandbox.
        "ro": [f"/etc/{p}" for p in _ETC]
        + ["/var/cache/fontconfig", "/proc", "/sys/devices/system/cpu", "/dev/random", "/dev/urandom"],
        # /dev/ptmx and /dev/pts: expect's spawn needs a pseudo-terminal.
        "rw": ["/dev/null", "/dev/zero", "/dev/full", "/dev/ptmx", "/dev/pts"],
        # The project and $TMPDIR run what they hold (./configure, make check's ./t, .venv/bin/pytest,
        # node_modules/.bin): refusing it bought nothing, since code runs anything through an
        # interpreter or ld.so. In a jail, /tmp and $TMPDIR are its private tmpfs (granted by the jail).
        "rwx": ["{CWD}", "{TMPDIR}"],
        "tmpfile": [],
    },
    # dns: with connect_tcp, name resolution too (over TCP port 53: UDP stays refused).
    "network": {"unrestricted": False, "bind_tcp": [], "connect_tcp": [], "unix": False, "dns": True},
    "env": [
        *["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ"],
        *["RUSTUP_HOME", "CARGO_HOME", "NVM_DIR", "GOPATH", "GOROOT", "JAVA_HOME"],  # where toolchains are
    ],
    "limits": {
        "processes": 512,  # processes and threads alive at once in a session's jail (at least 300)
        "memory": "4G",  # data (heap) of one process
        "cpu": 600,  # CPU seconds of one process
        "file_size": "1G",  # the largest file a process may write
        "timeout": 600,  # the most seconds a call may ask for
        "output": "10M",  # output kept of one call, all its stages and branches together
        "parallel": 64,  # branches of one parallel stage
        "tmpdir": "1G",  # size of the private /tmp (which holds $TMPDIR), and of the private /dev/shm
    },
    "general": {"best_effort": False, "repository": True},
}

# Hooks run commands from the agent's config: they read (and may run) the project, never change it.
HOOK_POLICY: dict[str, Any] = {
    **DEFAULT_POLICY,
    "filesystem": {
        **DEFAULT_POLICY["filesystem"],
        "rox": [*DEFAULT_POLICY["filesystem"]["rox"], "{CWD}"],
        "rwx": [p for p in DEFAULT_POLICY["filesystem"]["rwx"] if p != "{CWD}"],
    },
}
# Stdio tool servers: the user's own programs, which ollie starts in a jail of their own, in a
# directory of their own (never the project the model writes, whose files a server would import or
# run): the network most of them reach, the project read-only, $HOME a directory of each server's
# own (where npx, uvx and pip cache what they fetch). The program and what it needs are added.
TOOLS_POLICY: dict[str, Any] = {
    **DEFAULT_POLICY,
    "filesystem": {
        **DEFAULT_POLICY["filesystem"],
        # not the work tree around the cwd: a program planted there (a .venv/bin on PATH) would be
        # found and run, with the server's network and its secrets
        "rox": [p for p in DEFAULT_POLICY["filesystem"]["rox"] if p != "{REPO}"],
        "ro": [*DEFAULT_POLICY["filesystem"]["ro"], "{CWD}"],
        "rwx": ["{TMPDIR}"],
    },
    "network": {**DEFAULT_POLICY["network"], "unrestricted": True},
    "env": [v for v in DEFAULT_POLICY["env"] if v != "HOME"],
}
BUILTIN = {"default": DEFAULT_POLICY, "hooks": HOOK_POLICY, "tools": TOOLS_POLICY}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
FS_KEYS = ("ro", "rox", "rw", "rwx", "tmpfile")
_LIMIT_KEYS = tuple(DEFAULT_POLICY["limits"])
_SIZE_LIMITS = ("memory", "file_size", "output", "tmpdir")
_SCHEMA = {
    "filesystem": FS_KEYS,
    "network": ("enabled", "unrestricted", "bind_tcp", "connect_tcp", "unix", "dns"),
    "env": None,
    "limits": _LIMIT_KEYS,
    "general": ("best_effort", "repository"),
}


@dataclass(frozen=True, slots=True)
class Limits:
    processes: int
    memory: int
    cpu: int
    file_size: int
    timeout: float
    output: int
    parallel: int
    tmpdir: int


@dataclass(frozen=True, slots=True)
class Policy:
    """A policy with templates expanded and missing paths dropped."""

    name: str
    cwd: str  # the working directory it was expanded for (a real path; "" for none)
    repo: str  # the git work tree it lies in below the root (`repository_root`; "" for none)
    shared: tuple[str, ...]  # granted writable to every session (the memory, the plans): no symlinks there
    own: frozenset[str]  # ollie's own grants (tools, scratch, memory, plans): shown from under its hidden directories
    optional: frozenset[str]  # built-in grants left out, rather than refused, when a planted symlink leads there
    paths: dict[str, tuple[str, ...]]  # a FS_KEYS name → absolute existing paths
    missing: tuple[str, ...]  # the paths it names that did not exist (granted once they do)
    unrestricted_net: bool
    unix_sockets: bool  # may create AF_UNIX sockets (and so connect to any socket by path)
    bind_tcp: tuple[int, ...]
    connect_tcp: tuple[int, ...]  # with `dns`, port 53 among them
    dns: bool  # names resolve over TCP (RES_OPTIONS=use-vc): connect_tcp's obvious use needs it
    env: tuple[str, ...]  # variable names or fnmatch patterns
    limits: Limits
    best_effort: bool

    def writes(self, path: str) -> bool:
        """Whether sandboxed code may write `path` (a real path) under this policy."""
        return any(
            path == p or path.startswith(p.rstrip("/") + "/")
            for key in ("rw", "rwx", "tmpfile")
            for p in map(os.path.realpath, self.paths[key])
        )

    @property
    def network(self) -> bool:
        """Whether the policy reaches the host's network at all (else a jail gets none)."""
        return self.unrestricted_net or bool(self.bind_tcp or self.connect_tcp)


def policy_files(name: str) -> tuple[Path, Path]:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SandboxError(f"invalid sandbox name {name!r}: use letters, digits, '.', '_' and '-'")
    return config.cfg_path() / "sandbox.yaml", config.cfg_path() / "sandbox" / f"{name}.yaml"


def missing_policy(name: str) -> str:
    """Why there is no policy `name` to load ("" when there is one), by its name alone."""
    try:
        named_file = policy_files(name)[1]
    except SandboxError as e:
        return str(e)
    return "" if name in BUILTIN or named_file.is_file() else f"no sandbox policy {name!r}: create {named_file}"


def load_policy(
    name: str,
    cwd: str,
    tmpdir: str,
    extra_rox: tuple[str, ...] = (),
    extra_ro: tuple[str, ...] = (),
    extra_rw: tuple[str, ...] = (),
    extra_rwx: tuple[str, ...] = (),
    program_rox: tuple[str, ...] = (),
) -> Policy:
    """Read, validate and expand the policy `name` for a call running in `cwd` ("" for `tmpdir`
    drops the policy's `{TMPDIR}` entries: a jail grants its private /tmp itself). The extra paths
    are ollie's own grants on top (tool script directories; the memory and the plans, `extra_rw`,
    shared by every session; a tool server's cache, `extra_rwx`). `program_rox` are what a tool
    server's program needs to read and run: granted as the policy's own entries are, and judged
    as they are (never one of ollie's hidden directories)."""
    if why := missing_policy(name):
        raise SandboxError(why)
    global_file, named_file = policy_files(name)
    raw: dict[str, Any] = BUILTIN.get(name, DEFAULT_POLICY)
    for path in (global_file, named_file):
        raw = _overlay(raw, _read_policy_file(path))
    values = _template_values(cwd, tmpdir, repository=raw["general"].get("repository") is not False)
    named = {key: _expand_paths(raw["filesystem"][key], values, f"filesystem.{key}") for key in FS_KEYS}
    named["rox"] += extra_rox + program_rox
    named["ro"] += extra_ro
    named["rw"] += extra_rw
    named["rwx"] += extra_rwx
    paths = {key: tuple(dict.fromkeys(p for p in named[key] if os.path.exists(p))) for key in FS_KEYS}
    net = raw["network"]
    unrestricted = bool(net.get("unrestricted") or net.get("enabled"))  # `enabled`: the Go name
    connect = _ports(net.get("connect_tcp"), "network.connect_tcp")
    dns = bool(connect) and not unrestricted and bool(net.get("dns", True))
    return Policy(
        name=name,
        cwd=cwd,
        repo=values["REPO"],
        shared=tuple(p for p in extra_rw if os.path.exists(p)),
        own=frozenset([*extra_rox, *extra_ro, *extra_rw, *extra_rwx, *([os.path.normpath(tmpdir)] if tmpdir else [])]),
        optional=frozenset(_expand_paths([*_HOME_TOOLCHAINS, "{REPO}"], values, "filesystem.rox")),
        paths=paths,
        missing=tuple(dict.fromkeys(p for key in FS_KEYS for p in named[key] if p not in paths[key])),
        unrestricted_net=unrestricted,
        unix_sockets=bool(net.get("unix")),
        bind_tcp=_ports(net.get("bind_tcp"), "network.bind_tcp"),
        connect_tcp=tuple(dict.fromkeys([*connect, *([53] if dns else [])])),
        dns=dns,
        env=tuple(raw["env"]),
        limits=_limits(raw["limits"]),
        best_effort=bool(raw["general"].get("best_effort")),
    )


def _limits(raw: dict[str, Any]) -> Limits:
    values = {}
    for key in _LIMIT_KEYS:
        value = raw[key]
        if key in _SIZE_LIMITS:
            value = _size(value, f"limits.{key}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise SandboxError(f"sandbox limits.{key} must be a positive number, got {value!r}")
        values[key] = value if key == "timeout" else int(value)
    if values["processes"] < 300:
        raise SandboxError("sandbox limits.processes must be at least 300 (a PID namespace cannot hold fewer)")
    return Limits(**values)


def _size(value: Any, where: str) -> int:
    """Bytes from a number or a string such as 512K, 64M, 2G."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", str(value), re.IGNORECASE)
    if not match or int(match[1]) == 0:
        raise SandboxError(f"sandbox {where} must be a size such as 512M or 2G, got {value!r}")
    return int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2].upper()]


def _read_policy_file(path: Path) -> dict[str, Any]:
    """The policy in `path` ({} if there is none), its shape checked against _SCHEMA."""
    import yaml  # only when a policy file exists

    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise SandboxError(f"{path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise SandboxError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SandboxError(f"{path}: a sandbox policy must be a mapping of {', '.join(_SCHEMA)}")
    for key, value in data.items():
        _check_section(path, key, value)
    return data


def _check_section(path: Path, key: Any, value: Any) -> None:
    """One top-level key of a policy file: known, and holding what it must."""
    if key not in _SCHEMA:
        raise SandboxError(f"{path}: unknown key {key!r}; known keys: {', '.join(_SCHEMA)}")
    subkeys = _SCHEMA[key]
    if subkeys is None:
        if not _is_str_list(value):
            raise SandboxError(f"{path}: {key} must be a list of variable names")
        return
    if not isinstance(value, dict):
        raise SandboxError(f"{path}: {key} must be a mapping with keys {', '.join(subkeys)}")
    for sub, v in value.items():
        if sub not in subkeys:
            raise SandboxError(f"{path}: unknown key {key}.{sub}; known: {', '.join(subkeys)}")
        if key == "filesystem" and not _is_str_list(v):
            raise SandboxError(f"{path}: {key}.{sub} must be a list of paths")


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = _overlay(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            out[key] = old + [v for v in value if v not in old]
        else:
            out[key] = value
    return out


def _template_values(cwd: str, tmpdir: str, repository: bool = True) -> dict[str, str]:
    home = os.path.expanduser("~")
    env = os.environ
    return {
        **env,
        "CWD": cwd,
        "REPO": repository_root(cwd, home) if repository and cwd else "",
        "HOME": home,
        "TMPDIR": tmpdir,
        "XDG_CONFIG_HOME": env.get("XDG_CONFIG_HOME") or f"{home}/.config",
        "XDG_DATA_HOME": env.get("XDG_DATA_HOME") or f"{home}/.local/share",
        "XDG_CACHE_HOME": env.get("XDG_CACHE_HOME") or f"{home}/.cache",
        "XDG_STATE_HOME": env.get("XDG_STATE_HOME") or f"{home}/.local/state",
        "OLLIE_CFG_PATH": str(config.cfg_path()),
        "OLLIE_DATA_PATH": str(config.data_path()),
        "OLLIE": str(config.mount_path()),
    }


def repository_root(cwd: str, home: str) -> str:
    """The root of the git work tree that `cwd` (a real path) lies in, "" if none: the nearest
    directory strictly above it whose `.git` is a directory of the user's. The cwd's own `.git` is
    not looked at: its code writes it, and would otherwise choose (by making it a file, or removing
    it) whether its next sandbox reads the tree around it. Found only strictly below $HOME (told by
    identity: a bind mount or a link names it otherwise; not when $HOME is / or not the user's),
    with no dot-directory on the way from $HOME to the cwd, and not in a dotfiles repository (one
    $HOME's files link into, as `stow` makes them, or one marked as such): a work tree granted
    whole would grant their secrets. Only when the repository tracks the cwd's directory at its
    top (`_tracks`): a stray `git init` in ~/work is not the project of every repository below it.
    Never through a directory another user may write (`_only_mine`: git refuses some of those
    too), nor across a mount (as git does). Only a candidate: the grant is then opened and judged
    by descriptor."""
    try:
        here, top = os.lstat(cwd), os.stat(home)
    except OSError:
        return ""
    uid = os.geteuid()
    if top.st_uid != uid or os.path.realpath(home) == "/":
        return ""
    home_id, found, path = (top.st_dev, top.st_ino), "", cwd
    while True:
        if os.path.basename(path).startswith("."):
            return ""  # ~/.config/nvim, ~/dotfiles/nvim/.config/nvim: a dot-directory on the way
        parent = os.path.dirname(path)
        try:
            st = os.lstat(parent)
        except OSError:
            return ""
        if (st.st_dev, st.st_ino) == home_id:
            if not found or _dotfiles(found) or _linked_from(home, found):
                return ""
            return found if _tracks(found, os.path.relpath(cwd, found).split("/")[0]) else ""
        if parent == path or st.st_dev != here.st_dev or not _only_mine(parent, st):
            return ""  # / reached without $HOME; another file system; a directory shared
        if not found:
            try:
                git = os.lstat(os.path.join(parent, ".git"))
                if stat.S_ISDIR(git.st_mode) and git.st_uid == uid:
                    found = parent
            except OSError:
                pass
        path = parent


def _only_mine(path: str, st: os.stat_result) -> bool:
    """Whether only the user may write the directory `path`: theirs, neither sticky nor writable
    by others, with no ACL (whose mask shows as the group's bits), and writable by its group only
    when that is the user's private group (named as the user, no other member)."""
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWOTH | stat.S_ISVTX):
        return False
    try:
        os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
        return False
    except OSError:
        pass  # ENODATA: none (or no ACLs on this file system)
    if not st.st_mode & stat.S_IWGRP:
        return True
    try:
        group, me = grp.getgrgid(st.st_gid), pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return False
    return st.st_gid == os.getegid() and group.gr_name == me and set(group.gr_mem) <= {me}


# Files at a work tree's root that say it holds dotfiles (stow, dotbot, chezmoi, dotter, rcm): code
# below the root cannot make or remove them.
_DOTFILES_MARKS = (
    ".stowrc",
    ".stow-local-ignore",
    "install.conf.yaml",
    ".chezmoiroot",
    ".chezmoiignore",
    ".dotter",
    "rcrc",
)


def _dotfiles(tree: str) -> bool:
    return os.path.basename(tree) in ("dotfiles", "dots") or any(
        os.path.lexists(os.path.join(tree, mark)) for mark in _DOTFILES_MARKS
    )


_LINKED_FOR = 5.0  # seconds a look for $HOME's links into a work tree is kept (each session reads its policy)
_linked: dict[tuple[str, str], tuple[float, bool]] = {}


def _linked_from(home: str, tree: str) -> bool:
    """Whether a symlink in $HOME, or below its dot-directories (three levels: ~/.zshrc,
    ~/.config/gh/hosts.yml, ~/.config/fish/conf.d/x.fish), leads to `tree` or into it (by
    identity: a bind mount names it otherwise): a dotfiles repository, whose files `stow` (or the
    user) linked into place, holding the secrets they keep there. Directories of more than 1,000
    entries (caches) are passed over."""
    now = time.monotonic()
    known = _linked.get((home, tree))
    if known is not None and now - known[0] < _LINKED_FOR:
        return known[1]
    try:
        tree_fd = os.open(tree, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return True  # gone since: grant nothing
    try:
        found = _links_into(home, {identity(tree_fd): tree})
    finally:
        os.close(tree_fd)
    if len(_linked) > 256:
        _linked.clear()
    _linked[(home, tree)] = (now, found)
    return found


# File systems whose lookups may wait on another process or host (and never end, if it is gone):
# the scan for links neither follows a link into one nor lists one.
_FAR = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "autofs", "afs", "lustre", "gpfs")


def _links_into(home: str, tree: dict[tuple[int, int], str]) -> bool:
    far = [point.rstrip("/") + "/" for point, kind in config.mounts() if kind.startswith("fuse") or kind in _FAR]
    todo = [(home, 0)]
    while todo:
        directory, depth = todo.pop()
        try:
            with os.scandir(directory) as it:
                entries = [e for _, e in zip(range(1001), it, strict=False)]
        except OSError:
            continue
        if len(entries) > 1000 and depth:
            continue
        for entry in entries:
            if entry.is_symlink():
                if _leads_into(entry.path, tree, far):
                    return True
            elif depth < 3 and (depth or entry.name.startswith(".")) and entry.is_dir(follow_symlinks=False):
                if entry.path + "/" not in far:
                    todo.append((entry.path, depth + 1))
    return False


def _leads_into(link: str, tree: dict[tuple[int, int], str], far: list[str]) -> bool:
    """Whether the symlink `link` leads to `tree` or into it, by identity; a link whose target
    lies on a far file system (`_FAR`, FUSE: ollie's own mount among them) is not followed."""
    try:
        target = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link))) + "/"
    except OSError:
        return False
    if any(target.startswith(point) for point in far):
        return False
    try:
        fd = os.open(link, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False  # dangling
    try:
        return within(fd, tree) is not None
    finally:
        os.close(fd)


def _tracked_names(data: bytes, hash_size: int) -> frozenset[str]:
    """The first path components of every entry of a git index (formats 2 to 4); empty when
    `data` cannot be read as one. Only the names at the top are kept, for a large index."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return frozenset()
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        return frozenset()
    names: set[bytes] = set()
    pos, previous = 12, b""
    fixed = 40 + hash_size + 2  # stat data, the object's name, the flags
    try:
        for _ in range(count):
            flags = struct.unpack(">H", data[pos + fixed - 2 : pos + fixed])[0]
            start = pos + fixed + (2 if version >= 3 and flags & 0x4000 else 0)
            if version == 4:
                strip, start = _varint(data, start)
                end = data.index(b"\0", start)
                path = previous[: len(previous) - strip] + data[start:end]
                pos, previous = end + 1, path
            else:
                end = data.index(b"\0", start)
                path = data[start:end]
                pos += (end - pos + 8) // 8 * 8  # NUL-padded to a multiple of 8, at least one NUL
            names.add(path.split(b"/", 1)[0])
    except (ValueError, IndexError, struct.error):
        return frozenset()
    return frozenset(n.decode("utf-8", "surrogateescape") for n in names)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (index format 4): the value and the position after it."""
    byte = data[pos]
    value, pos = byte & 0x7F, pos + 1
    while byte & 0x80:
        byte = data[pos]
        value, pos = ((value + 1) << 7) | (byte & 0x7F), pos + 1
    return value, pos


INDEX_LIMIT = 512 << 20  # bytes of a git index read at most (a monorepo of a million files: ~100 MB)


# The top names of each git index read, by what the index file was (device, inode, mtime, size).
_tracked: dict[tuple[int, int, int, int, int], frozenset[str]] = {}


def _tracks(root: str, top: str) -> bool:
    """Whether the repository at `root` tracks something in its top-level directory `top` (the
    one the cwd lies in): what the user committed or added, which code below the root cannot
    change. A split or unreadable index tracks nothing here."""
    try:
        return top in _index_names(os.path.join(root, ".git"))
    except OSError:
        return False


def _index_names(git: str) -> frozenset[str]:
    with _regular(os.path.join(git, "config"), 1 << 20) as config:
        if config is None:
            return frozenset()
        hash_size = 32 if b"sha256" in _read(config, 1 << 20) else 20
    with _regular(os.path.join(git, "index"), INDEX_LIMIT) as index:
        if index is None:
            return frozenset()
        st = os.fstat(index)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, hash_size)
        names = _tracked.get(key)
        if names is None:
            if len(_tracked) >= 64:
                _tracked.clear()
            names = _tracked[key] = _tracked_names(_read(index, INDEX_LIMIT), hash_size)
    return names


@contextlib.contextmanager
def _regular(path: str, limit: int) -> Iterator[int | None]:
    """A descriptor of `path` if it is a regular file of at most `limit` bytes, else None: never
    a FIFO (whose open would wait for a writer) nor a device, whatever a link there leads to."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield fd if stat.S_ISREG(st.st_mode) and st.st_size <= limit else None
    finally:
        os.close(fd)


def _read(fd: int, limit: int) -> bytes:
    parts, size = [], 0
    while size <= limit and (part := os.read(fd, 1 << 20)):
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _expand_paths(entries: list[str], values: dict[str, str], where: str) -> tuple[str, ...]:
    out = []
    for entry in entries:
        names = _TEMPLATE.findall(entry)
        if any(not values.get(n) for n in names):
            continue  # an unset variable would silently widen the path (e.g. "{X}/" → "/")
        path = os.path.expanduser(_TEMPLATE.sub(lambda m: values[m.group(1)], entry))
        if not os.path.isabs(path):
            raise SandboxError(f"sandbox {where}: {entry!r} is not an absolute path")
        out.append(os.path.normpath(path))
    return tuple(dict.fromkeys(out))


def _ports(value: Any, where: str) -> tuple[int, ...]:
    value = value or []
    if not isinstance(value, list) or not all(type(p) is int and 0 <= p <= 65535 for p in value):
        raise SandboxError(f"sandbox {where} must be a list of port numbers (0-65535), got {value!r}")
    return tuple(value)
