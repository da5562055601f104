"""Landlock: the kernel interface, and a policy's ruleset built from it."""

from __future__ import annotations

import ctypes
import os
import stat
from functools import cache
from typing import Any

from .grants import Grant
from .policy import Policy, SandboxError

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_CREATE_RULESET, _SYS_ADD_RULE = 444, 445  # the same on every arch

# Filesystem rights, and the ABI each appeared in.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_AND_REMOVE = sum(1 << i for i in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
RO = _READ_FILE | _READ_DIR
RW = RO | _WRITE_FILE | _MAKE_AND_REMOVE | _REFER | _TRUNCATE | _IOCTL_DEV
RWX = RW | _EXECUTE
_RIGHTS = {"ro": RO, "rox": RO | _EXECUTE, "rw": RW, "rwx": RWX, "tmpfile": _READ_FILE | _WRITE_FILE}
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


def fs_handled(abi: int) -> int:
    handled = RW | _EXECUTE
    for bit, since in ((_REFER, 2), (_TRUNCATE, 3), (_IOCTL_DEV, 5)):
        if abi < since:
            handled &= ~bit
    return handled


def build_ruleset(policy: Policy, grants: list[Grant], abi: int, own_network: bool = False) -> int:
    """A ruleset fd (close-on-exec) that the child enters: the policy's network rules, and its
    filesystem rules on the descriptors `grants` decided. `own_network`: the child runs in a
    network namespace of its own, its loopback all there is to reach (a jail's, when the policy
    reaches no host network): TCP is not restricted there, so that a test's server on any port,
    and its clients, work."""
    restrict_net = not (policy.unrestricted_net or own_network)
    if restrict_net and abi < 4:
        if not policy.best_effort:
            raise SandboxError(
                f"this kernel's Landlock (ABI {abi}) cannot restrict TCP (needs ABI 4, Linux 6.7); "
                "set network.unrestricted or general.best_effort in the sandbox policy"
            )
        restrict_net = False
    handled = fs_handled(abi)
    attr = _RulesetAttr(
        handled,
        _NET_BIND | _NET_CONNECT if restrict_net else 0,
        _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    try:
        for grant in grants:
            _add_rule(fd, grant, _RIGHTS[grant.key] & handled)
        if restrict_net:
            for right, ports in ((_NET_BIND, policy.bind_tcp), (_NET_CONNECT, policy.connect_tcp)):
                for port in ports:
                    rule = _NetPort(right, port)
                    _syscall(_SYS_ADD_RULE, fd, 2, ctypes.byref(rule), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_rule(ruleset: int, grant: Grant, rights: int) -> None:
    if not stat.S_ISDIR(os.fstat(grant.fd).st_mode):
        rights &= _FILE_RIGHTS
    rule = _PathBeneath(rights, grant.fd)
    try:
        _syscall(_SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)
    except OSError as e:
        raise SandboxError(f"sandbox rule for {grant.path}: {e.strerror}") from None
