"""The seccomp filter a sandboxed program runs under, assembled as classic BPF."""

from __future__ import annotations

import functools
import platform
import struct

from .policy import Policy

# machine → (audit arch, syscall numbers). Calls of any other ABI (i386 or x32 on x86_64, arm32 on
# aarch64) are refused whole: the filter reads arguments by the native ABI's numbers only.
_ARCH = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41,
            "socketpair": 53,
            "connect": 42,
            "listen": 50,
            "sendto": 44,
            "sendmsg": 46,
            "sendmmsg": 307,
            "prlimit64": 302,
            "setpgid": 109,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "seccomp": 317,
            "clone": 56,
            "unshare": 272,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "socket": 198,
            "socketpair": 199,
            "connect": 203,
            "listen": 201,
            "sendto": 206,
            "sendmsg": 211,
            "sendmmsg": 269,
            "prlimit64": 261,
            "setpgid": 154,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "seccomp": 277,
            "clone": 220,
            "unshare": 97,
        },
    ),
}
_IO_URING = (425, 426, 427)  # setup, enter, register: the same on every arch
_CLONE3 = 435  # the same on every arch
_CLONE_NEWUSER = 0x10000000
_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_SOCK_STREAM, _SOCK_DGRAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK, _NETLINK_ROUTE = 1, 2, 5, 0xF, 0
_IPPROTO_TCP, _IPPROTO_UDP = 6, 17
_MSG_FASTOPEN = 0x20000000
_EPERM, _EACCES, _ENOSYS, _EAFNOSUPPORT = 1, 13, 38, 97
_RET_ALLOW, _RET_ERRNO, _RET_USER_NOTIF = 0x7FFF0000, 0x00050000, 0x7FC00000
_FILTER_FLAG_NEW_LISTENER = 1 << 3
_LD, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, ALU|AND|K, RET|K
_TAX, _JEQ_X = 0x07, 0x1D  # BPF_MISC|TAX (X = A), JMP|JEQ|X (A == X)


SECCOMP_MACHINES = tuple(_ARCH)


def seccomp_supported() -> bool:
    """Whether ollie builds a seccomp filter for this machine's architecture."""
    return platform.machine() in _ARCH


def _arg(n: int) -> int:
    return 16 + 8 * n  # offset of args[n]'s low word in seccomp_data (little-endian machines)


def supervisable(policy: Policy, own_network: bool) -> bool:
    """Whether a supervised program (`seccomp_program`) differs from the plain one: in a network
    of the jail's own (whose connects the init may make), where the policy does not allow every
    Unix socket already."""
    return own_network and not policy.unix_sockets


def seccomp_program(policy: Policy, own_network: bool = False, supervised: bool = False) -> bytes:
    """The BPF filter a sandboxed program runs under, as the kernel's `struct sock_filter` array.
    `own_network`: the program runs in a network namespace of its own (`build_ruleset`), where
    TCP reaches nothing but its loopback, as if `network.unrestricted` held for TCP.
    `supervised` (with `own_network`, for a jail's native init): its connect(2) calls go to the
    jail's init, which makes them itself and connects a Unix socket only to an abstract name or a
    socket file on the jail's own /tmp or /dev/shm (jailinit.c's `supervise`); so AF_UNIX stream
    and seqpacket sockets may be made, and seccomp(2) may not make a listener of its own (the
    newest filter's listener is asked first, and could let a call through unexamined).

    - io_uring is refused (ENOSYS): its operations make sockets and open files without the
      system calls this filter sees.
    - no user namespace of its own: unshare(2) and clone(2) with CLONE_NEWUSER are refused (EPERM),
      and clone3(2), whose flags lie in memory this filter cannot read, is ENOSYS (libc then falls
      back to clone for threads and posix_spawn). In one, code would hold every capability over
      namespaces it makes there: net/sched, nftables and mounts, the kernel code of many privilege
      escalations (the jail's init also sets its user namespace's max_user_namespaces to 0).
    - the kernel keyrings are refused; prlimit64 acts on the caller only.
    - setpgid(2) only makes a process the leader of a group of its own (`setpgid(pid, 0)`,
      `setpgid(pid, pid)`), never moves one into another group: the stages of every jail share
      one session (the kernel's autogroup weighs them as one program), so without this a
      process could join a running stage's group and outlive its own stage. The filter cannot
      know the caller's pid, so `setpgid(0, getpid())` is refused too (EPERM).
    - socket(2) by list, everything else refused: AF_UNIX only with `network.unix` or `supervised`
      (Landlock does not govern connecting by path); TCP over IPv4/6 (Landlock governs its ports); with
      `network.unrestricted` any IPv4/6 socket and rtnetlink (name resolution needs them); in a
      network namespace of its own, UDP over IPv4/6 too (it reaches that loopback alone), and
      rtnetlink, read without capabilities (that loopback's interfaces).
      No UDP with the host's network, no MPTCP, raw, packet, vsock, sock_diag or other families.
    - without `network.unix`, socketpair(2) makes stream and seqpacket pairs only: a datagram one
      could send to any socket by path.
    - without `network.unrestricted`, no TCP Fast Open (sendto/sendmsg with MSG_FASTOPEN connect
      past Landlock's connect rule), and without `bind_tcp` (or `unix`) no listen(2) (which binds
      an unbound socket to a port Landlock's bind rule never sees).
    """
    supervised = supervised and supervisable(policy, own_network)
    flags = (policy.unix_sockets, policy.unrestricted_net, bool(policy.bind_tcp), own_network, supervised)
    return _program(platform.machine(), *flags)


@functools.lru_cache(maxsize=32)
def _program(
    machine_name: str, unix_sockets: bool, unrestricted_net: bool, bind_tcp: bool, own_network: bool, supervised: bool
) -> bytes:
    """`seccomp_program` for what of a policy it depends on: the same few programs for every
    sandbox, assembled once each (each sandbox's build asked for two)."""
    machine = _ARCH.get(machine_name)
    if machine is None:
        return b""
    arch, nr = machine
    unix = "allow" if unix_sockets else "stream_or_seqpacket" if supervised else "eacces"
    prog: list[tuple[int, int | str, int | str, int] | str] = [
        (_LD, 0, 0, 4),
        (_JEQ, 0, "enosys", arch),  # seccomp_data.arch
        (_LD, 0, 0, 0),
        (_JGE, "enosys", 0, 0x40000000),  # seccomp_data.nr; x32 calls have bit 30 set
        *[(_JEQ, "enosys", 0, n) for n in (*_IO_URING, _CLONE3)],
        (_JEQ, "newuser", 0, nr["clone"]),
        (_JEQ, "newuser", 0, nr["unshare"]),
        *[(_JEQ, "eperm", 0, nr[k]) for k in ("add_key", "request_key", "keyctl")],
        (_JEQ, "prlimit", 0, nr["prlimit64"]),
        (_JEQ, "setpgid", 0, nr["setpgid"]),
        (_JEQ, "socket", 0, nr["socket"]),
    ]
    if supervised:
        prog += [(_JEQ, "supervise", 0, nr["connect"]), (_JEQ, "seccomp", 0, nr["seccomp"])]
    if not unix_sockets:
        prog.append((_JEQ, "stream_or_seqpacket", 0, nr["socketpair"]))
    if not (unrestricted_net or own_network or bind_tcp or unix_sockets):
        prog.append((_JEQ, "eacces", 0, nr["listen"]))
    if not (unrestricted_net or own_network):
        prog += [
            (_JEQ, "flags3", 0, nr["sendto"]),
            (_JEQ, "flags3", 0, nr["sendmmsg"]),
            (_JEQ, "flags2", 0, nr["sendmsg"]),
        ]
    prog += [
        (_RET, 0, 0, _RET_ALLOW),
        "supervise",
        (_RET, 0, 0, _RET_USER_NOTIF),
        "seccomp",
        (_LD, 0, 0, _arg(1)),
        (_AND, 0, 0, _FILTER_FLAG_NEW_LISTENER),
        (_JEQ, "allow", "eperm", 0),
        "newuser",
        (_LD, 0, 0, _arg(0)),
        (_AND, 0, 0, _CLONE_NEWUSER),
        (_JEQ, "allow", "eperm", 0),
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
        "setpgid",  # pid_t arguments: the kernel reads the low words alone, as this does
        (_LD, 0, 0, _arg(1)),
        (_JEQ, "allow", 0, 0),
        (_TAX, 0, 0, 0),
        (_LD, 0, 0, _arg(0)),
        (_JEQ_X, "allow", "eperm", 0),
        "socket",
        (_LD, 0, 0, _arg(0)),
        (_JEQ, unix, 0, _AF_UNIX),
        (_JEQ, "inet", 0, _AF_INET),
        (_JEQ, "inet", 0, _AF_INET6),
    ]
    if unrestricted_net:
        prog += [
            (_JEQ, 0, "eafnosupport", _AF_NETLINK),
            (_LD, 0, 0, _arg(2)),
            (_JEQ, "allow", "eacces", _NETLINK_ROUTE),
            "inet",
            (_RET, 0, 0, _RET_ALLOW),
        ]
    else:
        # rtnetlink in a network of its own, read by programs with no capability (nor a user
        # namespace to hold one in): its loopback's interface and addresses (getifaddrs: Node's
        # os.networkInterfaces, ZeroMQ, Go's net.Interfaces); never sock_diag or another protocol,
        # nor with the host's network
        route = [
            (_JEQ, 0, "eafnosupport", _AF_NETLINK),
            (_LD, 0, 0, _arg(2)),
            (_JEQ, "allow", "eacces", _NETLINK_ROUTE),
        ]
        prog += [
            *(route if own_network else [(_RET, 0, 0, _RET_ERRNO | _EAFNOSUPPORT)]),
            "inet",
            (_LD, 0, 0, _arg(1)),
            (_AND, 0, 0, _SOCK_TYPE_MASK),
            *([(_JEQ, "udp", 0, _SOCK_DGRAM)] if own_network else []),
            (_JEQ, 0, "eacces", _SOCK_STREAM),
            (_LD, 0, 0, _arg(2)),
            (_JEQ, "allow", 0, 0),
            (_JEQ, "allow", "eacces", _IPPROTO_TCP),
        ]
        if own_network:  # UDP too: it reaches the jail's own loopback alone (a test's syslog or DNS)
            prog += ["udp", (_LD, 0, 0, _arg(2)), (_JEQ, "allow", 0, 0), (_JEQ, "allow", "eacces", _IPPROTO_UDP)]
    prog += [
        # socketpair(2), and a supervised socket(AF_UNIX): stream and seqpacket, which connect by
        # connect(2) alone (a datagram socket sends to a path by sendto)
        "stream_or_seqpacket",
        (_LD, 0, 0, _arg(1)),
        (_AND, 0, 0, _SOCK_TYPE_MASK),
        (_JEQ, "allow", 0, _SOCK_STREAM),
        (_JEQ, "allow", "eacces", _SOCK_SEQPACKET),
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
