"""The Landlock sandbox behind execute_code (private; no stable API).

A policy says what sandboxed code may touch: filesystem paths by right (`ro`, `rox`, `rw`, `rwx`, and
`tmpfile` for unnamed temporary files), TCP ports (`bind_tcp`, `connect_tcp`, or `unrestricted`), Unix
sockets (`unix`), and which environment variables pass.
It is the built-in DEFAULT_POLICY overlaid by `$OLLIE_CFG_PATH/sandbox.yaml`, then by
`$OLLIE_CFG_PATH/sandbox/<name>.yaml` (maps merge, lists extend, scalars replace).

The parent builds the kernel ruleset once per policy and directory (`Sandboxes.get`). Between fork
and exec the child only makes four prepared calls (`Sandbox.enter`): no-new-privs, enter the
ruleset, a seccomp filter (setsid/setpgid become no-ops so killing the stage's process group
reaches every descendant; no Unix sockets), and dropping all capabilities (root inside is not root).
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
import platform
import re
import shutil
import stat
import sys
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from . import config
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
        # The system's programs and libraries, the Python running ollie (pyenv or venv outside
        # /usr), and $OLLIE/x (on PATH). Tool script directories are added per call.
        "rox": ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/etc/alternatives",
                sys.base_prefix, sys.prefix, "{OLLIE}/x"],
        # /proc: ps, /dev/fd and Python need it; Landlock's ptrace rule already hides the environ,
        # memory and fds of every process outside the sandbox.
        "ro": [f"/etc/{p}" for p in _ETC] + ["/proc", "/sys/devices/system/cpu", "/dev/random", "/dev/urandom"],
        # /dev/ptmx and /dev/pts: expect's spawn needs a pseudo-terminal.
        "rw": ["{CWD}", "{TMPDIR}", "/dev/null", "/dev/zero", "/dev/full", "/dev/ptmx", "/dev/pts"],
        "rwx": [],
        # tmpfile(3) (ed's buffer) opens an unnamed O_TMPFILE in /tmp whatever $TMPDIR says. This
        # grants read/write of files but neither listing /tmp nor creating names in it.
        "tmpfile": ["/tmp"],
    },
    "network": {"unrestricted": False, "bind_tcp": [], "connect_tcp": [], "unix": False},
    "env": ["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ"],
    "general": {"best_effort": False},
}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FS_KEYS = ("ro", "rox", "rw", "rwx", "tmpfile")
_SCHEMA = {"filesystem": _FS_KEYS, "network": ("enabled", "unrestricted", "bind_tcp", "connect_tcp", "unix"),
           "env": None, "general": ("best_effort",)}


@dataclass(frozen=True, slots=True)
class Policy:
    """A policy with templates expanded and missing paths dropped."""

    name: str
    paths: dict[str, tuple[str, ...]]  # a _FS_KEYS name → absolute existing paths
    unrestricted_net: bool
    unix_sockets: bool  # may create AF_UNIX sockets (and so connect to any socket by path)
    bind_tcp: tuple[int, ...]
    connect_tcp: tuple[int, ...]
    env: tuple[str, ...]  # variable names or fnmatch patterns
    best_effort: bool


def policy_files(name: str) -> tuple[Path, Path]:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SandboxError(f"invalid sandbox name {name!r}: use letters, digits, '.', '_' and '-'")
    return config.cfg_path() / "sandbox.yaml", config.cfg_path() / "sandbox" / f"{name}.yaml"


def load_policy(name: str, cwd: str, tmpdir: str, extra_rox: tuple[str, ...] = ()) -> Policy:
    """Read, validate and expand the policy `name` for a call running in `cwd`."""
    global_file, named_file = policy_files(name)
    if name != "default" and not named_file.is_file():
        raise SandboxError(f"no sandbox policy {name!r}: create {named_file}")
    raw: dict[str, Any] = DEFAULT_POLICY
    for path in (global_file, named_file):
        raw = _overlay(raw, _read_policy_file(path))
    values = _template_values(cwd, tmpdir)
    paths = {key: _expand_paths(raw["filesystem"][key], values, f"filesystem.{key}") for key in _FS_KEYS}
    paths["rox"] += tuple(p for p in extra_rox if os.path.exists(p))
    net = raw["network"]
    return Policy(
        name=name,
        paths=paths,
        unrestricted_net=bool(net.get("unrestricted") or net.get("enabled")),  # `enabled`: the Go name
        unix_sockets=bool(net.get("unix")),
        bind_tcp=_ports(net.get("bind_tcp"), "network.bind_tcp"),
        connect_tcp=_ports(net.get("connect_tcp"), "network.connect_tcp"),
        env=tuple(raw["env"]),
        best_effort=bool(raw["general"].get("best_effort")),
    )


def _read_policy_file(path: Path) -> dict[str, Any]:
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
        if key not in _SCHEMA:
            raise SandboxError(f"{path}: unknown key {key!r}; known keys: {', '.join(_SCHEMA)}")
        subkeys = _SCHEMA[key]
        if subkeys is None:
            if not _is_str_list(value):
                raise SandboxError(f"{path}: {key} must be a list of variable names")
            continue
        if not isinstance(value, dict):
            raise SandboxError(f"{path}: {key} must be a mapping with keys {', '.join(subkeys)}")
        for sub, v in value.items():
            if sub not in subkeys:
                raise SandboxError(f"{path}: unknown key {key}.{sub}; known: {', '.join(subkeys)}")
            if key == "filesystem" and not _is_str_list(v):
                raise SandboxError(f"{path}: {key}.{sub} must be a list of paths")
    return data


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
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every arch
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

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
            raise SandboxError(f"this kernel's Landlock (ABI {abi}) cannot restrict TCP (needs ABI 4, Linux 6.7); "
                               "set network.unrestricted or general.best_effort in the sandbox policy")
        restrict_net = False
    handled = _fs_handled(abi)
    attr = _RulesetAttr(handled, _NET_BIND | _NET_CONNECT if restrict_net else 0,
                        _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    try:
        for key, paths in policy.paths.items():
            for path in paths:
                _add_path_rule(fd, path, _RIGHTS[key] & handled)
        if restrict_net:
            for right, ports in ((_NET_BIND, policy.bind_tcp), (_NET_CONNECT, policy.connect_tcp)):
                for port in ports:
                    rule = _NetPort(right, port)
                    _syscall(_SYS_ADD_RULE, fd, 2, ctypes.byref(rule), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_path_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
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


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


# machine → per ABI (native, then 32-bit): (audit arch, setsid, setpgid, socket, socketcall or None)
_SYSCALLS = {
    "x86_64": ((0xC000003E, 112, 109, 41, None), (0x40000003, 66, 57, 359, 102)),
    "aarch64": ((0xC00000B7, 157, 154, 198, None), (0x40000028, 66, 57, 281, None)),
}
_AF_UNIX, _EACCES = 1, 13
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000


def _seccomp_program(allow_unix: bool) -> _SockFprog | None:
    """A filter that (1) makes setsid and setpgid succeed without acting, so no descendant leaves
    the stage's process group (a daemon stays killable; expect and `setsid` still run), and
    (2) unless `allow_unix`, refuses socket(AF_UNIX): Landlock does not govern connecting to a
    socket by path, which would reach tmux, ssh-agent, docker or ollie's own server.
    socketpair(2) stays allowed."""
    abis = _SYSCALLS.get(platform.machine())
    if abis is None:
        return None
    ld, jeq, and_, ret = 0x20, 0x15, 0x54, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_ALU|AND|K, BPF_RET|K
    prog: list[tuple[int, int | str, int | str, int]] = [(ld, 0, 0, 4)]  # seccomp_data.arch
    for n, (arch, setsid, setpgid, sock, socketcall) in enumerate(abis):
        prog += [(jeq, 0, f"abi{n + 1}", arch), (ld, 0, 0, 0), (and_, 0, 0, 0xBFFFFFFF),  # nr, x32 bit cleared
                 (jeq, "fake", 0, setsid), (jeq, "fake", 0, setpgid)]
        if not allow_unix:
            if socketcall is not None:
                prog.append((jeq, "deny", 0, socketcall))  # its arguments are out of the filter's sight
            prog += [(jeq, 0, "allow", sock), (ld, 0, 0, 16), (jeq, "deny", "allow", _AF_UNIX)]  # args[0]
        prog.append((ret, 0, 0, _RET_ALLOW))
        prog.append(f"abi{n + 1}")
    prog += [(ret, 0, 0, _RET_ALLOW), "allow", (ret, 0, 0, _RET_ALLOW), "fake", (ret, 0, 0, _RET_ERRNO),
             "deny", (ret, 0, 0, _RET_ERRNO | _EACCES)]
    return _assemble(prog)


def _assemble(prog: list) -> _SockFprog:
    """Resolve string jump targets (labels placed in the list) into relative BPF offsets."""
    labels, code = {}, []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    out = []
    for i, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out.append(_SockFilter(op, jt, jf, k))
    return _SockFprog(len(out), (_SockFilter * len(out))(*out))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_HEADER = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
_NO_CAPS = (_CapData * 2)()
_SECCOMP = {allow: _seccomp_program(allow) for allow in (False, True)}


class Sandbox:
    """A built policy: the ruleset fd, the environment filter and the PATH directories the
    sandbox can execute from."""

    def __init__(self, policy: Policy):
        self.policy = policy
        abi = landlock_abi()
        if abi == 0 and not policy.best_effort:
            raise SandboxError("this kernel has no Landlock (needs Linux 5.13+ with landlock in the lsm= list), "
                               "so execute_code cannot be sandboxed; set general.best_effort: true in "
                               f"{config.cfg_path() / 'sandbox.yaml'} to run without it")
        ruleset = _build_ruleset(policy, abi) if abi else -1
        if ruleset >= 0:
            # Closed when the last call using this sandbox lets go of it, never before: a process
            # spawned with a closed ruleset's fd would run unconfined, or in another ruleset.
            weakref.finalize(self, os.close, ruleset)
        self._exec_roots = tuple(os.path.realpath(p).rstrip("/") + "/"
                                 for p in policy.paths["rox"] + policy.paths["rwx"])
        self._search_paths: dict[str, str] = {}
        self._env_names = re.compile("|".join(fnmatch.translate(p) for p in policy.env) or "(?!)")
        # The child's calls, with their C arguments built here: between fork and exec every page
        # the child touches is copied, so it only loops over this tuple.
        long = ctypes.c_long
        calls = [(_libc.prctl, (long(_PR_SET_NO_NEW_PRIVS), long(1), long(0), long(0), long(0)), "no_new_privs")]
        if ruleset >= 0:
            calls.append((_libc.syscall, (long(_SYS_RESTRICT_SELF), long(ruleset), long(0)), "landlock_restrict_self"))
        seccomp = _SECCOMP[policy.unix_sockets]
        if seccomp is not None:
            calls.append((_libc.prctl, (long(_PR_SET_SECCOMP), long(_SECCOMP_MODE_FILTER), ctypes.byref(seccomp)),
                          "seccomp"))
        calls.append((_libc.capset, (ctypes.byref(_CAP_HEADER), _NO_CAPS), "capset"))
        self._child_calls = tuple(calls)

    def enter(self) -> None:
        """Runs in the child between fork and exec: no-new-privs, the Landlock ruleset, the
        seccomp filter, no capabilities."""
        for call, args, name in self._child_calls:
            if call(*args) != 0:
                raise OSError(ctypes.get_errno(), name)

    def search_path(self, path: str) -> str:
        """`path` without the directories the sandbox cannot execute from, so a program resolves
        to one that runs (not, say, a pyenv shim under $HOME that fails with EACCES)."""
        kept = self._search_paths.get(path)
        if kept is None:
            dirs = [d for d in path.split(":") if d and (os.path.realpath(d) + "/").startswith(self._exec_roots)]
            kept = self._search_paths[path] = ":".join(dirs)
        return kept

    def environ(self, source: Mapping[str, str]) -> dict[str, str]:
        """The variables of `source` that the policy lets in."""
        return {k: v for k, v in source.items() if self._env_names.match(k)}


class Sandboxes:
    """Built sandboxes, cached by policy, directories and the policy files' mtimes."""

    def __init__(self, size: int = 32):
        self._size = size
        self._cache: OrderedDict[tuple, Sandbox] = OrderedDict()

    def get(self, name: str, cwd: str, tmpdir: str, extra_rox: tuple[str, ...] = ()) -> Sandbox:
        stamp = tuple(_mtime(p) for p in policy_files(name))
        key = (name, cwd, tmpdir, extra_rox, stamp)
        box = self._cache.get(key)
        if box is None:
            box = self._cache[key] = Sandbox(load_policy(name, cwd, tmpdir, extra_rox))
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
