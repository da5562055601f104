"""The sandbox behind execute_code and hooks (private; no stable API).

A policy says what sandboxed code may touch: filesystem paths by right (`ro`, `rox`, `rw`, `rwx`, and
`tmpfile` for unnamed temporary files), TCP ports (`bind_tcp`, `connect_tcp`, or `unrestricted`), Unix
sockets (`unix`), which environment variables pass, and resource `limits`.
It is a built-in policy (`default`, or `hooks` for hook commands) overlaid by
`$OLLIE_CFG_PATH/sandbox.yaml`, then by `$OLLIE_CFG_PATH/sandbox/<name>.yaml` (maps merge, lists
extend, scalars replace).

The parent builds the Landlock ruleset and the seccomp program once per policy and directory
(`Sandboxes.get`); a jail (`ollie._jail`) applies them to each program it starts, inside fresh
user, PID, IPC, mount and (unless the policy grants network) network namespaces. docs/sandbox.md
has the threat model.
"""

from __future__ import annotations

import asyncio
import ctypes
import fnmatch
import os
import platform
import re
import shutil
import stat
import struct
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from . import _jail, config
from .types import ConfigError


class SandboxError(ConfigError):
    """A policy is invalid, or the kernel cannot enforce it."""


# The parts of /etc that programs read: loader, users and groups, name resolution, time, locale,
# terminfo, CA certificates. Not shadow, gshadow, sudoers, ssh host keys or ssl/private.
_ETC = """ld.so.cache ld.so.conf ld.so.conf.d passwd group nsswitch.conf hosts host.conf resolv.conf
    gai.conf services protocols localtime timezone locale.alias locale.conf default/locale mime.types
    magic magic.mime inputrc terminfo ssl/certs ssl/openssl.cnf ca-certificates ca-certificates.conf
    pki/tls/certs os-release lsb-release debian_version perl python3 gitconfig""".split()

DEFAULT_POLICY: dict[str, Any] = {
    "filesystem": {
        # The system's programs and libraries, and the Python running ollie (pyenv or venv
        # outside /usr). Tool script directories are added per call. Not $OLLIE/x: plugins are
        # the user's to run, outside the sandbox.
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
        ],
        # /proc: ps, /dev/fd and Python need it; Landlock's ptrace rule already hides the environ,
        # memory and fds of every process outside the sandbox.
        "ro": [f"/etc/{p}" for p in _ETC] + ["/proc", "/sys/devices/system/cpu", "/dev/random", "/dev/urandom"],
        # /dev/ptmx and /dev/pts: expect's spawn needs a pseudo-terminal.
        # In a jail, /tmp and $TMPDIR are its private tmpfs (granted by the jail itself).
        "rw": ["{CWD}", "{TMPDIR}", "/dev/null", "/dev/zero", "/dev/full", "/dev/ptmx", "/dev/pts"],
        "rwx": [],
        "tmpfile": [],
    },
    "network": {"unrestricted": False, "bind_tcp": [], "connect_tcp": [], "unix": False},
    "env": ["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ"],
    "limits": {
        "processes": 512,  # processes and threads alive at once in a session's jail (at least 300)
        "memory": "4G",  # data (heap) of one process
        "cpu": 600,  # CPU seconds of one process
        "file_size": "1G",  # the largest file a process may write
        "timeout": 600,  # the most seconds a call may ask for
        "output": "10M",  # output kept of one call, all its stages and branches together
        "parallel": 64,  # branches of one parallel stage
        "tmpdir": "1G",  # size of the private /tmp (which holds $TMPDIR)
    },
    "general": {"best_effort": False},
}

# Hooks run commands from the agent's config: they read (and may run) the project, never change it.
HOOK_POLICY: dict[str, Any] = {
    **DEFAULT_POLICY,
    "filesystem": {
        **DEFAULT_POLICY["filesystem"],
        "rox": [*DEFAULT_POLICY["filesystem"]["rox"], "{CWD}"],
        "rw": [p for p in DEFAULT_POLICY["filesystem"]["rw"] if p != "{CWD}"],
    },
}
BUILTIN = {"default": DEFAULT_POLICY, "hooks": HOOK_POLICY}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FS_KEYS = ("ro", "rox", "rw", "rwx", "tmpfile")
_LIMIT_KEYS = tuple(DEFAULT_POLICY["limits"])
_SIZE_LIMITS = ("memory", "file_size", "output", "tmpdir")
_SCHEMA = {
    "filesystem": _FS_KEYS,
    "network": ("enabled", "unrestricted", "bind_tcp", "connect_tcp", "unix"),
    "env": None,
    "limits": _LIMIT_KEYS,
    "general": ("best_effort",),
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
    shared: tuple[str, ...]  # granted writable to every session (the memory, the plans): no symlinks there
    paths: dict[str, tuple[str, ...]]  # a _FS_KEYS name → absolute existing paths
    unrestricted_net: bool
    unix_sockets: bool  # may create AF_UNIX sockets (and so connect to any socket by path)
    bind_tcp: tuple[int, ...]
    connect_tcp: tuple[int, ...]
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


def load_policy(
    name: str,
    cwd: str,
    tmpdir: str,
    extra_rox: tuple[str, ...] = (),
    extra_ro: tuple[str, ...] = (),
    extra_rw: tuple[str, ...] = (),
) -> Policy:
    """Read, validate and expand the policy `name` for a call running in `cwd` ("" for `tmpdir`
    drops the policy's `{TMPDIR}` entries: a jail grants its private /tmp itself). The extra paths
    are ollie's own grants on top (tool script directories; the memory and the plans)."""
    global_file, named_file = policy_files(name)
    if name not in BUILTIN and not named_file.is_file():
        raise SandboxError(f"no sandbox policy {name!r}: create {named_file}")
    raw: dict[str, Any] = BUILTIN.get(name, DEFAULT_POLICY)
    for path in (global_file, named_file):
        raw = _overlay(raw, _read_policy_file(path))
    values = _template_values(cwd, tmpdir)
    paths = {key: _expand_paths(raw["filesystem"][key], values, f"filesystem.{key}") for key in _FS_KEYS}
    paths["rox"] += tuple(p for p in extra_rox if os.path.exists(p))
    paths["ro"] += tuple(p for p in extra_ro if os.path.exists(p))
    paths["rw"] += tuple(p for p in extra_rw if os.path.exists(p))
    net = raw["network"]
    return Policy(
        name=name,
        cwd=cwd,
        shared=tuple(p for p in extra_rw if os.path.exists(p)),
        paths=paths,
        unrestricted_net=bool(net.get("unrestricted") or net.get("enabled")),  # `enabled`: the Go name
        unix_sockets=bool(net.get("unix")),
        bind_tcp=_ports(net.get("bind_tcp"), "network.bind_tcp"),
        connect_tcp=_ports(net.get("connect_tcp"), "network.connect_tcp"),
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


def _template_values(cwd: str, tmpdir: str) -> dict[str, str]:
    home = os.path.expanduser("~")
    env = os.environ
    return {
        **env,
        "CWD": cwd,
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


def _expand_paths(entries: list[str], values: dict[str, str], where: str) -> tuple[str, ...]:
    out = []
    for entry in entries:
        names = _TEMPLATE.findall(entry)
        if any(not values.get(n) for n in names):
            continue  # an unset variable would silently widen the path (e.g. "{X}/" → "/")
        path = os.path.expanduser(_TEMPLATE.sub(lambda m: values[m.group(1)], entry))
        if not os.path.isabs(path):
            raise SandboxError(f"sandbox {where}: {entry!r} is not an absolute path")
        if os.path.exists(path):
            out.append(os.path.normpath(path))
    return tuple(dict.fromkeys(out))


def _ports(value: Any, where: str) -> tuple[int, ...]:
    value = value or []
    if not isinstance(value, list) or not all(type(p) is int and 0 <= p <= 65535 for p in value):
        raise SandboxError(f"sandbox {where} must be a list of port numbers (0-65535), got {value!r}")
    return tuple(value)


# ---- the kernel interface ------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CREATE_RULESET, _SYS_ADD_RULE = 444, 445  # the same on every arch

# Filesystem rights, and the ABI each appeared in.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_AND_REMOVE = sum(1 << i for i in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_RO = _READ_FILE | _READ_DIR
_RW = _RO | _WRITE_FILE | _MAKE_AND_REMOVE | _REFER | _TRUNCATE | _IOCTL_DEV
_RIGHTS = {"ro": _RO, "rox": _RO | _EXECUTE, "rw": _RW, "rwx": _RW | _EXECUTE, "tmpfile": _READ_FILE | _WRITE_FILE}
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # others on a file: EINVAL
_NET_BIND, _NET_CONNECT = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _syscall(nr: int, *args: Any) -> int:
    # syscall(2) reads every argument as a long: pass integers at that width
    r = _libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


@cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    try:
        return _syscall(_SYS_CREATE_RULESET, None, 0, 1)
    except OSError:
        return 0


def _fs_handled(abi: int) -> int:
    handled = _RW | _EXECUTE
    for bit, since in ((_REFER, 2), (_TRUNCATE, 3), (_IOCTL_DEV, 5)):
        if abi < since:
            handled &= ~bit
    return handled


def _build_ruleset(policy: Policy, abi: int) -> int:
    """A ruleset fd (close-on-exec) that the child enters."""
    restrict_net = not policy.unrestricted_net
    if restrict_net and abi < 4:
        if not policy.best_effort:
            raise SandboxError(
                f"this kernel's Landlock (ABI {abi}) cannot restrict TCP (needs ABI 4, Linux 6.7); "
                "set network.unrestricted or general.best_effort in the sandbox policy"
            )
        restrict_net = False
    handled = _fs_handled(abi)
    attr = _RulesetAttr(
        handled,
        _NET_BIND | _NET_CONNECT if restrict_net else 0,
        _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    try:
        for key, paths in policy.paths.items():
            for path in paths:
                _add_path_rule(fd, path, _RIGHTS[key] & handled, policy)
        if restrict_net:
            for right, ports in ((_NET_BIND, policy.bind_tcp), (_NET_CONNECT, policy.connect_tcp)):
                for port in ports:
                    rule = _NetPort(right, port)
                    _syscall(_SYS_ADD_RULE, fd, 2, ctypes.byref(rule), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_path_rule(ruleset: int, path: str, rights: int, policy: Policy) -> None:
    try:
        fd = _open_granted(path, policy.cwd)
    except FileNotFoundError:
        return  # removed since the policy was loaded
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneath(rights, fd)
        _syscall(_SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)
    except OSError as e:
        raise SandboxError(f"sandbox rule for {path}: {e.strerror}") from None
    finally:
        os.close(fd)


def _open_granted(path: str, cwd: str) -> int:
    """An O_PATH fd of `path`. The cwd is opened a component at a time, refusing any symlink: a
    session's cwd is kept as a real path, so a symlink on it now was put there since, by code that
    can write its parent (another session's sandbox, say), and following it would grant the
    link's target. Each step is an fd, so no swap can race the check. (Other grants, even under
    the cwd, follow links as the user set them up: a symlinked .venv, `/etc/localtime`.)"""
    if not cwd or path != cwd:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        for name in (p for p in path.split("/") if p):
            nxt = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise SandboxError(
                    f"the working directory {path} is reached through a symlink ({name}): a symlink put in place "
                    "of a directory since the cwd was set (or a cwd stored by an older ollie); set it again"
                )
        return fd
    except BaseException:
        os.close(fd)
        raise


# machine → (audit arch, syscall numbers). Calls of any other ABI (i386 or x32 on x86_64, arm32 on
# aarch64) are refused whole: the filter reads arguments by the native ABI's numbers only.
_ARCH = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "listen": 50,
            "sendto": 44,
            "sendmsg": 46,
            "sendmmsg": 307,
            "prlimit64": 302,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "listen": 201,
            "sendto": 206,
            "sendmsg": 211,
            "sendmmsg": 269,
            "prlimit64": 261,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
        },
    ),
}
_IO_URING = (425, 426, 427)  # setup, enter, register: the same on every arch
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK, _IPPROTO_TCP, _NETLINK_ROUTE = 1, 5, 0xF, 6, 0
_MSG_FASTOPEN = 0x20000000
_EPERM, _EACCES, _ENOSYS, _EAFNOSUPPORT = 1, 13, 38, 97
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, ALU|AND|K, RET|K


def _arg(n: int) -> int:
    return 16 + 8 * n  # offset of args[n]'s low word in seccomp_data (little-endian machines)


def seccomp_program(policy: Policy) -> bytes:
    """The BPF filter a sandboxed program runs under, as the kernel's `struct sock_filter` array.

    - io_uring is refused (ENOSYS): its operations make sockets and open files without the
      system calls this filter sees.
    - the kernel keyrings are refused; prlimit64 acts on the caller only.
    - socket(2) by list, everything else refused: AF_UNIX only with `network.unix` (Landlock does
      not govern connecting by path); TCP over IPv4/6 (Landlock governs its ports); with
      `network.unrestricted` any IPv4/6 socket and rtnetlink (name resolution needs them).
      No UDP, MPTCP, raw, packet, vsock, sock_diag or other families otherwise.
    - without `network.unix`, socketpair(2) makes stream and seqpacket pairs only: a datagram one
      could send to any socket by path.
    - without `network.unrestricted`, no TCP Fast Open (sendto/sendmsg with MSG_FASTOPEN connect
      past Landlock's connect rule), and without `bind_tcp` (or `unix`) no listen(2) (which binds
      an unbound socket to a port Landlock's bind rule never sees).
    """
    machine = _ARCH.get(platform.machine())
    if machine is None:
        return b""
    arch, nr = machine
    unix = "allow" if policy.unix_sockets else "eacces"
    prog: list[tuple[int, int | str, int | str, int] | str] = [
        (_LD, 0, 0, 4),
        (_JEQ, 0, "enosys", arch),  # seccomp_data.arch
        (_LD, 0, 0, 0),
        (_JGE, "enosys", 0, 0x40000000),  # seccomp_data.nr; x32 calls have bit 30 set
        *[(_JEQ, "enosys", 0, n) for n in _IO_URING],
        *[(_JEQ, "eperm", 0, nr[k]) for k in ("add_key", "request_key", "keyctl")],
        (_JEQ, "prlimit", 0, nr["prlimit64"]),
        (_JEQ, "socket", 0, nr["socket"]),
    ]
    if not policy.unix_sockets:
        prog.append((_JEQ, "socketpair", 0, nr["socketpair"]))
    if not (policy.unrestricted_net or policy.bind_tcp or policy.unix_sockets):
        prog.append((_JEQ, "eacces", 0, nr["listen"]))
    if not policy.unrestricted_net:
        prog += [
            (_JEQ, "flags3", 0, nr["sendto"]),
            (_JEQ, "flags3", 0, nr["sendmmsg"]),
            (_JEQ, "flags2", 0, nr["sendmsg"]),
        ]
    prog += [
        (_RET, 0, 0, _RET_ALLOW),
        "socketpair",
        (_LD, 0, 0, _arg(1)),
        (_AND, 0, 0, _SOCK_TYPE_MASK),
        (_JEQ, "allow", 0, _SOCK_STREAM),
        (_JEQ, "allow", "eacces", _SOCK_SEQPACKET),
        "flags3",
        (_LD, 0, 0, _arg(3)),
        (_AND, 0, 0, _MSG_FASTOPEN),
        (_JEQ, "allow", "eacces", 0),
        "flags2",
        (_LD, 0, 0, _arg(2)),
        (_AND, 0, 0, _MSG_FASTOPEN),
        (_JEQ, "allow", "eacces", 0),
        "prlimit",
        (_LD, 0, 0, _arg(0)),
        (_JEQ, 0, "eperm", 0),
        (_LD, 0, 0, _arg(0) + 4),
        (_JEQ, "allow", "eperm", 0),
        "socket",
        (_LD, 0, 0, _arg(0)),
        (_JEQ, unix, 0, _AF_UNIX),
        (_JEQ, "inet", 0, _AF_INET),
        (_JEQ, "inet", 0, _AF_INET6),
    ]
    if policy.unrestricted_net:
        prog += [
            (_JEQ, 0, "eafnosupport", _AF_NETLINK),
            (_LD, 0, 0, _arg(2)),
            (_JEQ, "allow", "eacces", _NETLINK_ROUTE),
            "inet",
            (_RET, 0, 0, _RET_ALLOW),
        ]
    else:
        prog += [
            (_RET, 0, 0, _RET_ERRNO | _EAFNOSUPPORT),
            "inet",
            (_LD, 0, 0, _arg(1)),
            (_AND, 0, 0, _SOCK_TYPE_MASK),
            (_JEQ, 0, "eacces", _SOCK_STREAM),
            (_LD, 0, 0, _arg(2)),
            (_JEQ, "allow", 0, 0),
            (_JEQ, "allow", "eacces", _IPPROTO_TCP),
        ]
    prog += [
        "eafnosupport",
        (_RET, 0, 0, _RET_ERRNO | _EAFNOSUPPORT),
        "allow",
        (_RET, 0, 0, _RET_ALLOW),
        "eperm",
        (_RET, 0, 0, _RET_ERRNO | _EPERM),
        "eacces",
        (_RET, 0, 0, _RET_ERRNO | _EACCES),
        "enosys",
        (_RET, 0, 0, _RET_ERRNO | _ENOSYS),
    ]
    return _assemble(prog)


def _assemble(prog: list) -> bytes:
    """Resolve string jump targets (labels placed in the list) into relative BPF offsets."""
    labels: dict[str, int] = {}
    code: list[tuple[int, int | str, int | str, int]] = []  # (op, jump if true, jump if false, k)
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    out = bytearray()
    for i, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out += struct.pack("<HBBI", op, jt, jf, k)
    return bytes(out)


_RLIMIT_CPU, _RLIMIT_FSIZE, _RLIMIT_DATA, _RLIMIT_CORE = 0, 1, 2, 4


class Sandbox:
    """A built policy: what a jail applies to each program it starts (the Landlock ruleset fd,
    the seccomp program, resource limits), the environment filter and the PATH directories the
    sandbox can execute from."""

    def __init__(self, policy: Policy):
        self.policy = policy
        abi = landlock_abi()
        if abi == 0 and not policy.best_effort:
            raise SandboxError(
                "this kernel has no Landlock (needs Linux 5.13+ with landlock in the lsm= list), "
                "so execute_code cannot be sandboxed; set general.best_effort: true in "
                f"{config.cfg_path() / 'sandbox.yaml'} to run without it"
            )
        ruleset = _build_ruleset(policy, abi) if abi else -1
        if ruleset >= 0:
            # Closed when the last call using this sandbox lets go of it, never before: a process
            # spawned with a closed ruleset's fd would run unconfined, or in another ruleset.
            weakref.finalize(self, os.close, ruleset)
        handled = _fs_handled(abi)
        limits = policy.limits
        self.confinement = _jail.Confinement(
            ruleset,
            {
                # The jail's own /proc, /tmp and pseudo-terminals, which the parent's rules cannot name.
                "jail_rules": [
                    ["/proc", _RO & handled],
                    ["/tmp", _RW & handled],
                    ["/dev/pts", _RW & handled],
                    ["/dev/ptmx", _RW & handled],
                ],
                "seccomp": seccomp_program(policy).hex(),
                "rlimits": [
                    [_RLIMIT_DATA, limits.memory, limits.memory],
                    [_RLIMIT_CPU, limits.cpu, limits.cpu + 1],
                    [_RLIMIT_FSIZE, limits.file_size, limits.file_size],
                    [_RLIMIT_CORE, 0, 0],
                ],
                # Every path granted, and whether writable: a jail shows those it hides (under /tmp, say).
                "expose": [
                    (path, key in ("rw", "rwx", "tmpfile"), path in policy.shared)
                    for key, paths in policy.paths.items()
                    for path in paths
                ],
            },
        )
        self._exec_roots = tuple(
            os.path.realpath(p).rstrip("/") + "/" for p in policy.paths["rox"] + policy.paths["rwx"]
        )
        self._search_paths: dict[str, str] = {}
        self._env_names = re.compile("|".join(fnmatch.translate(p) for p in policy.env) or "(?!)")
        self._environ: dict[str, str] | None = None

    def search_path(self, path: str) -> str:
        """`path` without the directories the sandbox cannot execute from, so a program resolves
        to one that runs (not, say, a pyenv shim under $HOME that fails with EACCES)."""
        kept = self._search_paths.get(path)
        if kept is None:
            dirs = [d for d in path.split(":") if d and (os.path.realpath(d) + "/").startswith(self._exec_roots)]
            kept = self._search_paths[path] = ":".join(dirs)
        return kept

    def environ(self) -> dict[str, str]:
        """The variables of ollie's environment that the policy lets in (read once: a sandbox is
        rebuilt when its policy changes, not when ollie's environment does)."""
        if self._environ is None:
            self._environ = {k: v for k, v in os.environ.items() if self._env_names.match(k)}
        return dict(self._environ)


class Jails:
    """The jails of one owner (a session's execute server, its hooks): one per network setting and
    limits, started on first use, restarted if one dies."""

    def __init__(self, view: Callable[[int], None] | None = None) -> None:
        self._jails: dict[_jail.JailSetup, _jail.Jail] = {}
        self._hide = hidden_paths()
        self._uv_cache = _uv_cache()
        # Serves a jail's view of ollie's files, mounted at $OLLIE in it, on the /dev/fuse
        # descriptor it is given (and closes it); None: no view.
        self._view = view

    async def get(self, policy: Policy) -> _jail.Jail:
        """The jail for `policy`; one without namespaces (the kernel refused them) only when the
        policy says general.best_effort, else SandboxError."""
        limits = policy.limits
        view, view_rights = "", 0
        if self._view is not None:
            view, view_rights = config.mount_point(), _RW & _fs_handled(landlock_abi())
        setup = _jail.JailSetup(
            policy.network,
            limits.processes,
            limits.tmpdir,
            self._hide,
            _PROTECTED + self._link_sources(policy),
            view,
            view_rights,
        )
        jail = self._jails.get(setup)
        if jail is None or not jail.alive:
            _refuse_replaceable_links(policy)
            jail = self._jails[setup] = await _jail.Jail.start(setup)
            if jail.view_fd >= 0 and self._view is not None:
                fd, jail.view_fd = jail.view_fd, -1
                try:
                    self._view(fd)
                except BaseException:
                    os.close(fd)  # the mount then fails every access instead of waiting on nobody
                    raise
                jail.has_view = True
        if jail.namespaces_refused and not policy.best_effort:
            raise SandboxError(
                f"the sandbox cannot isolate this: {jail.namespaces_refused}; allow user namespaces "
                f"(sysctl user.max_user_namespaces) or set general.best_effort: true in "
                f"{config.cfg_path() / 'sandbox.yaml'} to run with Landlock and seccomp alone "
                "(no process, network, /tmp or terminal isolation)"
            )
        return jail

    def _link_sources(self, policy: Policy) -> tuple[str, ...]:
        """Where installed packages may be hard links to: uv's cache (uv links by default).
        Writable there, a file is writable in the virtualenv too, whatever its mount says; so
        read-only in the jail, unless the policy grants the cache itself (not a directory around it)."""
        cache = self._uv_cache
        if not cache or any(
            p == cache or p.startswith(cache + "/") for key in ("rw", "rwx") for p in policy.paths[key]
        ):
            return ()
        return (cache,)

    async def close(self) -> None:
        jails, self._jails = list(self._jails.values()), {}
        await asyncio.gather(*(j.close() for j in jails))


def _refuse_replaceable_links(policy: Policy) -> None:
    """A jail hides ollie's directories where their paths lead when it starts. A symlink on such a
    path in a directory the sandbox can write (a dotfile manager's `~/.config/ollie -> ...`, a
    session in $HOME) could be pointed elsewhere: the next jail would then hide the wrong place,
    and ollie itself read its configuration (hooks included) from the sandbox's choice."""
    for path in _own_paths():
        parts = path.absolute().parts
        for n in range(2, len(parts) + 1):
            link = os.path.join(*parts[:n])
            if os.path.islink(link) and policy.writes(os.path.realpath(os.path.dirname(link))):
                raise SandboxError(
                    f"{path} is reached through the symlink {link}, which sandboxed code could "
                    f"replace; set the variable that names it to the real directory "
                    f"({os.path.realpath(path)})"
                )


# The Python that starts every jail, outside the sandbox: kept read-only in each jail even when a
# session's cwd contains it (a virtualenv in the project, pyenv under $HOME with the cwd at $HOME).
_PROTECTED = tuple(
    dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)))
)


def _uv_cache() -> str:
    cache = os.environ.get("UV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv"
    )
    return os.path.realpath(cache) if os.path.isdir(cache) else ""


def _own_paths() -> list[Path]:
    return [config.cfg_path(), config.data_path(), config.tmp_path(), config.namespace_path()]


def hidden_paths() -> tuple[str, ...]:
    """What a jail hides under empty mounts besides /tmp, whatever a policy grants around it:
    ollie's configuration (API keys, agent configs with hooks, policies), its stored sessions,
    the session scratch directories, the file server's socket directory and its mount (the jail
    also hides every mount of ollie's file server, wherever it is)."""
    paths = _own_paths()
    for path in paths:  # made now, so that a jail has them to hide and pin (it can only hide what exists)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    real = [os.path.realpath(p) for p in paths]  # a symlinked config is hidden where it is
    return tuple(dict.fromkeys([*real, config.mount_point()]))


class Sandboxes:
    """Built sandboxes, cached by policy, directories and the policy files' mtimes."""

    def __init__(self, size: int = 32):
        self._size = size
        self._cache: OrderedDict[tuple, Sandbox] = OrderedDict()
        self._files: dict[str, tuple[Path, Path]] = {}  # policy name -> its files (found once)

    def get(
        self,
        name: str,
        cwd: str,
        tmpdir: str,
        extra_rox: tuple[str, ...] = (),
        extra_ro: tuple[str, ...] = (),
        extra_rw: tuple[str, ...] = (),
    ) -> Sandbox:
        files = self._files.get(name) or self._files.setdefault(name, policy_files(name))
        stamp = tuple(_mtime(p) for p in files)
        key = (name, cwd, tmpdir, extra_rox, extra_ro, extra_rw, stamp)
        box = self._cache.get(key)
        if box is None:
            box = self._cache[key] = Sandbox(load_policy(name, cwd, tmpdir, extra_rox, extra_ro, extra_rw))
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return box

    def clear(self) -> None:
        self._cache.clear()


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def superpowers_prefix() -> list[str]:
    """`superpowers run-session --` when superpowerd runs (the seed's optional privilege scoping)."""
    exe = shutil.which("superpowers")
    if exe is None:
        return []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "superpowerd":
                        return [exe, "run-session", "--"]
            except OSError:
                continue
    return []
