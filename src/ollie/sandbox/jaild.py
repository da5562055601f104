"""The jail helper: the fork server that starts jails, and each jail's setup.

Run by `ollie.sandbox.jail` once, as `python -s -S -P -c SOURCE FD [INIT PYTHON PATH JAILD]`, with
PYTHONHOME alone in its environment (its source read once, when ollie started: a file a sandbox
could rewrite is never run again): a fork server (`fork_server`) that has imported what a jail
needs and forks a jail for each SOCK_SEQPACKET socket ollie sends it on `FD`; the jail reads its
setup from that socket. It imports nothing of ollie (stdlib only, so it starts lean and trusts no
package directory) and decides nothing: the parent sends the finished Landlock ruleset, seccomp
program and resource limits; this process only applies them.

The jail's first process enters new user, mount, IPC, PID (and, unless the setup grants network) network
namespaces (bringing the new one's loopback up), then forks the jail's PID 1 and exits. PID 1
mounts a fresh /proc, private tmpfs on /tmp and /dev/shm, a new /dev/pts instance, hides the setup's `hide`
directories under empty tmpfs mounts, caps the number of PIDs, and serves its socket until it
closes, when everything in the jail dies.
Given a `view` path, it also mounts a FUSE file system there whose /dev/fuse descriptor it sends
the parent with its first message: the parent serves the jail's own view of ollie's files on it
(a FUSE mount must be made with a descriptor opened in the mounting user namespace).

For each ruleset the parent asks PID 1 for a channel, a socket of its own (JSON on the control
socket), and asks on it for each program (NUL-separated fields: see `Channel.receive`). Once the
first channel is open, PID 1 execs the native init (`jailinit.c`, the descriptors INIT, PYTHON
and JAILD) in its own place, handing it what it serves (`Jail.become_native`): each program is
then started by a child of the init that confines itself (no new privileges, Landlock, seccomp,
no capabilities) and execs it, and a later ruleset's channel by `build`, which the init runs in
a child of its own. Without the native init, PID 1 stays this Python process and starts each
ruleset's programs from a thread confined by it (`Confined`). Either way no process of the jail
but its programs is in a program's Landlock domain. Replies are JSON, one per packet; a payload
too large for a packet (a channel's spec, a long argv or env) travels in a memfd whose descriptor
comes with it.
"""

import _thread
import array
import ctypes
import errno
import fcntl
import fnmatch
import gc
import json
import os
import re
import resource
import selectors
import signal
import socket
import stat
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000,
    0x8000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE = 38, 22, 2, 36, 4
SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF, SYS_CLOSE_RANGE = 445, 446, 436  # the same on every arch
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_OPENAT2, SYS_MOUNT_SETATTR = 428, 429, 437, 442  # the same on every arch
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSYMFOLLOW = 0x1, 0x2, 0x8, 0x200000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_RECURSIVE = 0x1, os.O_CLOEXEC, 0x1000, 0x8000
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
M_ARENA_MAX = -8
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = 47, 2, 4
JAIL_NICE = 4  # the jails' priority below ollie's loop (schedule_as_batch)

libc = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return result


def mount(source, target, fstype, flags, data=None):
    check(
        libc.mount(
            source and source.encode(),
            target.encode(),
            fstype and fstype.encode(),
            ctypes.c_ulong(flags),
            data and data.encode(),
        ),
        f"mount {target}",
    )


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_path(path, resolve, flags=0, dir_fd=-100):
    """An O_PATH descriptor by openat2(2): `resolve` says which links and escapes to refuse."""
    how = OpenHow(os.O_PATH | os.O_CLOEXEC | flags, 0, resolve | RESOLVE_NO_MAGICLINKS)
    return check(
        libc.syscall(
            ctypes.c_long(SYS_OPENAT2), ctypes.c_long(dir_fd), path.encode(), ctypes.byref(how), ctypes.c_long(24)
        ),
        path,
    )


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("set", ctypes.c_uint64),
        ("clear", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns", ctypes.c_uint64),
    ]


def set_mount_attrs(dir_fd, path, add, remove, flags=AT_RECURSIVE):
    """mount_setattr(2) (Linux 5.12, older than any Landlock): on the mount at `path` and, with
    AT_RECURSIVE, every mount under it."""
    attr = MountAttr(add, remove, 0, 0)
    check(
        libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR),
            ctypes.c_long(dir_fd),
            path.encode(),
            ctypes.c_long(flags),
            ctypes.byref(attr),
            ctypes.c_long(ctypes.sizeof(attr)),
        ),
        f"mount_setattr {path}",
    )


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CAP_HEADER, NO_CAPS = CapHeader(0x20080522, 0), (CapData * 2)()


# ---- setting the jail up -------------------------------------------------------------------------


def enter_namespaces(network):
    """Unshare what can be; returns a description of what was not (empty: all of it)."""
    uid, gid = os.geteuid(), os.getegid()
    rest = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID | (0 if network else CLONE_NEWNET)
    try:
        check(libc.unshare(CLONE_NEWUSER | rest), "unshare")
    except OSError as e:
        if uid != 0:  # without a user namespace only root may make the others
            return f"user namespaces are refused ({os.strerror(e.errno or 0)})"
        try:
            check(libc.unshare(rest), "unshare")
        except OSError as e2:
            return f"namespaces are refused ({os.strerror(e2.errno or 0)})"
        return ""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    # No user namespace in this one (as bubblewrap's --disable-userns), under the seccomp filter's
    # refusal: where /proc/sys is read-only (some containers), the filter alone
    try:
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    except OSError:
        pass
    return ""


SIOCSIFFLAGS, IFF_UP = 0x8914, 0x1


def loopback_up():
    """The jail's own network namespace has a loopback, down: up, its programs' servers and
    clients reach each other over it (a test's server on any port), and nothing else."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, b"lo".ljust(16, b"\0") + IFF_UP.to_bytes(2, sys.byteorder) + bytes(22))


# The jail's own tmpfs, over the host's directories (/dev/shm: POSIX shared memory and semaphores,
# multiprocessing's); what a policy grants under them is shown again.
PRIVATE_TMPFS = ("/tmp", "/dev/shm")
OWN_MOUNTS = ("/proc", "/dev/pts", "/dev/ptmx")  # mounted anew in the jail: not the host's files
# Opening a grant's file on the host: it is gone, or reached through a symlink, since ollie decided it.
GRANT_CHANGED = (errno.ELOOP, errno.ENOENT, errno.ENOTDIR)
# A file to mask: as a grant's, or out of reach (a directory locked, a path past PATH_MAX).
MASK_CHANGED = (*GRANT_CHANGED, errno.EACCES, errno.ENAMETOOLONG)
MASKS_PER_DIR = 32  # configurations with secrets masked one by one in a directory of versions; past it, it whole


class GrantChanged(OSError):
    """A grant changed since ollie decided it (ollie then decides its sandbox anew)."""


class Mounts:
    """The jail's view of the filesystem, built as bubblewrap builds one: every mount read-only
    (so that no chmod, utime, setxattr or truncate reaches a file outside the grants, which
    Landlock does not govern), hidden directories (a private /tmp, `hide`) under empty mounts,
    and the grants bound writable, or shown again from under a hidden directory.

    Every mount is made by descriptor, never by a path that could be resolved twice: a target is
    opened refusing any symlink (the paths ollie sends are real), a bind is a clone of the source's
    tree whose attributes (read-only, no symlinks followed) are set before it is attached."""

    def __init__(self, hide, protect, tmp_size):
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here shows outside
        set_mount_attrs(-100, "/", MOUNT_ATTR_RDONLY, 0)
        self.hidden: dict[str, int] = {}  # hidden directory -> O_PATH fd of what it hid, to bind from
        self.exposed = {}  # path -> (writable, shared, identity): how it was bound, to bind it so again
        self.view, self.view_root = "", -1  # the view's mount point, and an O_PATH fd of its root
        self.pinned = set()  # directories bound onto themselves, so that they cannot be renamed
        self.masked = {}  # the files `mask` masked (a dict: ordered, looked up at once)
        self.masked_dirs = {}  # the directories `mask_dir` hid
        self.overlaid = {}  # the caches `overlay` mounted (a dict: ordered)
        self.own_devices = [0] * len(PRIVATE_TMPFS)  # each private tmpfs's device as made (0: none made)
        for path in [*PRIVATE_TMPFS, *hide]:
            if path not in self.hidden:
                try:  # by the real path ollie resolved: a symlink on it now was planted since
                    self.hidden[path] = open_path(path, RESOLVE_NO_SYMLINKS, os.O_DIRECTORY)
                except FileNotFoundError:
                    continue
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for path in self.hidden:
            if path not in PRIVATE_TMPFS and self._root(os.path.dirname(path)) is None:  # not under a hidden parent
                self._hide(path, "/")
        self.servers = ollie_mounts()  # hidden wherever they are: their directories may have moved
        for path in self.servers:
            if self._root(path) is None:
                self._hide(path, "/")
        self.protected = list(protect)  # what starts the next jail, outside the sandbox: never the sandbox's
        for path in protect:
            if os.path.isdir(path) and self._root(path) is None:
                self._protect(path, "/")
        self._own_filesystems(tmp_size)

    def _own_filesystems(self, tmp_size):
        """The jail's private tmpfs (over the host's directories, kept in `hidden` to show what a
        policy grants there again) and its own pseudo-terminals. Their devices are noted as they
        are made, before any grant is bound over them: where a socket file is the jail's own."""
        for path in PRIVATE_TMPFS:
            if path in self.hidden:
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_size},mode=1777")
                self.own_devices[PRIVATE_TMPFS.index(path)] = os.stat(path).st_dev
        try:
            mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
            mount("/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)
        except OSError:
            pass  # no /dev/pts to replace: pseudo-terminals stay unavailable

    def state(self):
        """What a later ruleset's `build` (another process) needs to go on from here; descriptors by number."""
        return {
            "hidden": self.hidden,
            "exposed": self.exposed,
            "view": [self.view, self.view_root],
            "pinned": sorted(self.pinned),
            "protected": self.protected,
            "servers": self.servers,
            "masked": list(self.masked),
            "masked_dirs": list(self.masked_dirs),
            "overlaid": list(self.overlaid),
        }

    def descriptors(self):
        return [*self.hidden.values(), *([self.view_root] if self.view_root >= 0 else [])]

    @classmethod
    def restore(cls, state):
        mounts = cls.__new__(cls)
        mounts.hidden, mounts.protected, mounts.servers = state["hidden"], state["protected"], state["servers"]
        mounts.exposed = {
            path: (w, shared, tuple(identity)) for path, (w, shared, identity) in state["exposed"].items()
        }
        mounts.view, mounts.view_root = state["view"]
        mounts.pinned = set(state["pinned"])
        mounts.masked = dict.fromkeys(state.get("masked", ()))
        mounts.masked_dirs = dict.fromkeys(state.get("masked_dirs", ()))
        mounts.overlaid = dict.fromkeys(state.get("overlaid", ()))
        return mounts

    def mount_view(self, path):
        """Mount a FUSE file system at `path` (hidden by now); returns its /dev/fuse descriptor.
        noexec: the view serves files to read and write, never programs to run outside the sandbox."""
        fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        options = f"fd={fuse},rootmode=40000,user_id={os.geteuid()},group_id={os.getegid()}"
        with opened(path, make=stat.S_IFDIR) as target:
            mount("ollie", f"/proc/self/fd/{target}", "fuse.ollie", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
        # Its root, held now (no code runs in the jail yet): what every ruleset's Landlock rule is
        # added on, and what is bound back where a grant around it covers it, whatever its path
        # leads to later (its directories are the jail's tmpfs, which code may rename).
        self.view, self.view_root = path, open_path(path, RESOLVE_NO_SYMLINKS)
        return fuse

    def _rebind_view(self, above):
        """The view, hidden again under a tmpfs by the exposure of a directory around it: bind it back."""
        self._pin(self.view, above)
        with opened(self.view) as target:
            attach(self.view_root, target)

    def expose(self, path, writable, shared, own, dev, ino):
        """Grant `path` as ollie decided it: bound writable, or shown again (read-only) from under a
        hidden directory, but only if it is still the file ollie judged (`dev`, `ino`), reached
        without a symlink. Only ollie's `own` grants (tool scripts, the scratch directory, the
        memory and the plans) come from under a hidden directory, and no writable grant lies in a
        read-only directory. A `shared` directory (one every session writes) follows no symlink:
        one session could plant a link there that another session's code, writing what it takes
        for its own file, would follow into its cwd."""
        if any(path == m or path.startswith(m + "/") for m in OWN_MOUNTS):
            return  # the jail's own, granted by its own rules
        root = self._root(path)
        # (the host's /tmp and /dev/shm are hidden as a whole, and shown again in part)
        if root not in (None, *PRIVATE_TMPFS) and not own:
            raise OSError(errno.EACCES, f"{path}: one of ollie's hidden directories")
        if writable and any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.protected):
            raise OSError(errno.EACCES, f"{path}: in a directory the jail keeps read-only")
        # Read-only where it is granted writable too (as Landlock's rights add up), but ollie's own.
        around = any(w and (path + "/").startswith(p.rstrip("/") + "/") for p, (w, _, _) in self.exposed.items())
        if self.exposed.get(path, (None,))[0] == writable or not (writable or (root is not None and not around)):
            if own and not writable:  # a tool directory in the project: read-only in the jail
                self._keep_read_only(path)
            return
        before = self.exposed.get(path)
        self.exposed[path] = (writable, shared, (dev, ino))
        view_inside = self.view and self.view.startswith(path.rstrip("/") + "/")
        try:
            self._bind(path, writable, (dev, ino), shared)
        except OSError:  # not bound: a later ruleset binds it as it is decided then
            if before is None:
                del self.exposed[path]
            else:
                self.exposed[path] = before
            raise
        self._restore_inside(path, writable)
        for covered in [t for t in self.overlaid if t.startswith(path.rstrip("/") + "/")]:
            del self.overlaid[covered]  # mounted again by the ruleset that asks for it
        if view_inside:
            self._rebind_view(path)

    def mask(self, path):
        """Mask the file `path` as Docker masks paths, under /dev/null, read-only (a configuration
        in a granted tree that holds a secret): whatever a policy grants around it, code reads
        nothing there, nor reaches it around the mount (a hard link to it crosses a mount; a rename
        of it, or of a directory above it, is refused, those being pinned). Masked again where it
        no longer is (the host renamed another file over it, which took the mounts on it along; a
        later grant bound the host's file there). Passed over where it leads to no file now, or
        through a symlink (the next look judges what is there), or out of sight."""
        self._masking(path, self._mask)

    def overlay(self, target, lower, identity, slot):
        """Mount at `target` (a cache's place in the cwd's cache) an overlay of the user's cache
        `lower`, read-only beneath, and of the `upper` directory of the slot ollie locked for this
        jail (`slot`: its path and identity), which takes what code writes (`overlays.py`): only
        if `lower` and the slot are still the directories ollie decided, reached without a
        symlink, `lower` out of every hidden directory and holding none, nor a masked file (an
        overlay shows what lies beneath the mounts that hide or mask). Passed over where the
        kernel or the file system refuses it: code then finds the cwd's cache alone."""
        inside = [*self.hidden, *self.servers, *self.masked, *self.masked_dirs]
        if target in self.overlaid or self._root(lower) is not None:
            return
        if any(p == lower or p.startswith(lower.rstrip("/") + "/") for p in inside):
            return
        opened_fds = []
        try:
            for path, expected in ((lower, identity), (slot[0], slot[1:])):
                opened_fds.append(open_path(path, RESOLVE_NO_SYMLINKS, os.O_DIRECTORY))
                st = os.fstat(opened_fds[-1])
                if (st.st_dev, st.st_ino) != tuple(expected):
                    return
            below, top = opened_fds
            for name in ("upper", "work"):
                opened_fds.append(_directory_beneath(top, name))
            upper, work = opened_fds[2:]
            with opened(target, make=stat.S_IFDIR) as at:
                layers = f"lowerdir=/proc/self/fd/{below},upperdir=/proc/self/fd/{upper},workdir=/proc/self/fd/{work}"
                mount("overlay", f"/proc/self/fd/{at}", "overlay", MS_NOSUID | MS_NODEV, f"{layers},userxattr")
        except OSError:
            return
        finally:
            for fd in opened_fds:
                os.close(fd)
        self.overlaid[target] = None

    def hide_slots(self, path):
        """Hide the overlays' slots of a cwd's cache under an empty read-only tmpfs, in every jail
        of that cache, whether it took a slot or not (the overlays hold theirs): code changing
        what an overlay writes to, beneath it, is what the kernel leaves undefined."""
        if path in self.masked_dirs:
            return
        try:
            with opened(path, make=stat.S_IFDIR) as target:
                mount(
                    "tmpfs",
                    f"/proc/self/fd/{target}",
                    "tmpfs",
                    MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                    "size=4096",
                )
        except OSError:
            return
        self.masked_dirs[path] = None

    def mask_matches(self, where, glob_part, rest):
        """Mask `rest` in each entry of `where` that `glob_part` matches: ollie could not list that
        directory, the jail's root, which overrides modes in its namespace, can. Past MASKS_PER_DIR
        files, `where` is hidden whole instead (each mask is a mount or more in every jail)."""
        try:
            with os.scandir(where) as entries:
                names = [e.name for e in entries if fnmatch.fnmatchcase(e.name, glob_part)]
        except OSError:
            return
        found = [f"{where}/{name}/{rest}" for name in names if os.path.isfile(f"{where}/{name}/{rest}")]
        if len(found) > MASKS_PER_DIR:
            self.mask_dir(where)
            return
        for path in found:
            self.mask(path)

    def mask_dir(self, path):
        """Hide the directory `path` under an empty read-only tmpfs, in this ruleset and every later
        one: it holds more configurations with secrets than MASKS_PER_DIR, which code working in
        $HOME could plant by the thousand to fail every jail at the kernel's limit of mounts."""
        self._masking(path, self._mask_dir)

    def _masking(self, path, how):
        if self._out_of_sight(path):
            return
        try:
            how(path, "/")
        except OSError as e:
            if e.errno not in MASK_CHANGED:
                raise

    def _mask_dir(self, path, above):
        self._pin(path, above, again=True)
        if path in self.masked_dirs and mount_root(path):
            return  # hidden still
        with opened(path) as target:
            if not stat.S_ISDIR(os.fstat(target).st_mode):
                return  # swapped for another kind since: the next look judges it
            flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
            mount("tmpfs", f"/proc/self/fd/{target}", "tmpfs", flags, "size=4096,mode=555")
        self.masked_dirs[path] = None

    def _out_of_sight(self, path):
        """Whether `path` lies in a hidden directory, not shown again from under it, or on a mount
        of ollie's file server."""
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in self.servers):
            return True
        return self._root(path) is not None and not any(
            path == p or path.startswith(p.rstrip("/") + "/") for p in self.exposed
        )

    def _mask(self, path, above):
        self._pin(path, above, again=True)
        null = open_path("/dev/null", RESOLVE_NO_SYMLINKS)
        try:
            st = os.fstat(null)
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(1, 3):
                raise OSError(errno.EINVAL, "/dev/null is not the null device")
            with opened(path) as target:  # (after the pins, which cover the file's first mount)
                mode = os.fstat(target).st_mode
                if stat.S_ISCHR(mode):
                    return  # masked still
                if not stat.S_ISREG(mode):  # swapped for another kind since: the next look judges it
                    return
                attach(null, target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, 0, whole=False)
        finally:
            os.close(null)
        self.masked[path] = None

    def _restore_inside(self, path, writable):
        """What the new mount at `path` covered: hidden directories hidden again (with what was
        shown from under them), read-only ones read-only again, masked files masked again."""
        self.pinned -= {p for p in self.pinned if p.startswith(path.rstrip("/") + "/")}  # covered over
        inside = [h for h in [*self.hidden, *self.servers] if h != path and h.startswith(path.rstrip("/") + "/")]
        for hidden in inside:
            if any(hidden.startswith(h + "/") for h in inside):
                continue  # gone with a hidden directory around it
            self._hide(hidden, path)
            for inner, (w, shared, expected) in list(self.exposed.items()):
                if inner.startswith(hidden + "/"):
                    self._bind(inner, w, expected, shared)
        for protected in self.protected:
            if any(protected.startswith(h + "/") for h in inside):
                continue  # hidden again (or bound again, read-only, if shown from under it)
            if writable and (protected == path or protected.startswith(path.rstrip("/") + "/")):
                self._protect(protected, path)
        for masked, again in [
            *((m, self._mask) for m in self.masked),
            *((d, self._mask_dir) for d in self.masked_dirs),
        ]:
            if masked.startswith(path.rstrip("/") + "/") and not any(masked.startswith(h + "/") for h in inside):
                try:
                    again(masked, path)
                except OSError as e:
                    if e.errno not in MASK_CHANGED:  # (else gone from the host, or a link: nothing to mask)
                        raise

    def _keep_read_only(self, path):
        if path in self.protected:
            return
        self.protected.append(path)
        around = [p for p, (w, _, _) in self.exposed.items() if w and (path + "/").startswith(p.rstrip("/") + "/")]
        if around:
            self._protect(path, max(around, key=len))

    def _root(self, path):
        roots = [h for h in self.hidden if path == h or path.startswith(h.rstrip("/") + "/")]
        return max(roots, key=len) if roots else None

    def _bind(self, path, writable, expected=None, shared=False):
        """Mount `path`'s file on the path itself, from under its hidden directory if it has one
        (then from the inode the hidden directory's descriptor holds, beneath it, following no
        symlink); `expected`, the identity ollie decided, is checked first."""
        root = self._root(path)
        try:  # the host's file: gone, or reached through a symlink, it changed since ollie decided it
            if root is None:
                source = open_path(path, RESOLVE_NO_SYMLINKS)
            else:
                source = open_path(
                    os.path.relpath(path, root), RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH, dir_fd=self.hidden[root]
                )
        except OSError as e:
            if e.errno in GRANT_CHANGED:
                raise GrantChanged(e.errno, e.strerror, e.filename) from None
            raise
        try:
            st = os.fstat(source)
            if expected is not None and (st.st_dev, st.st_ino) != tuple(expected):
                raise GrantChanged(errno.ESTALE, f"{path} is no longer the file ollie granted (replaced since)")
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                return  # a device: written through a read-only mount as well
            # The target's directories may be in writable places (the private /tmp, a hiding
            # tmpfs): made, and opened, a component at a time, refusing any symlink planted there.
            with opened(path, make=stat.S_IFMT(st.st_mode)) as target:
                flags = MOUNT_ATTR_NOSYMFOLLOW if shared else 0
                # The hidden directory itself: what it holds, not the mount that hides it (which a
                # copy of the mounts at its place would bring along); _restore_inside hides again.
                whole = path != root
                if writable:
                    attach(source, target, flags, MOUNT_ATTR_RDONLY, whole)
                else:
                    attach(source, target, flags | MOUNT_ATTR_RDONLY, 0, whole)
        finally:
            os.close(source)

    def _hide(self, path, above):
        """An empty tmpfs over `path`."""
        self._pin(path, above)
        with opened(path) as target:
            mount("tmpfs", f"/proc/self/fd/{target}", "tmpfs", MS_NOSUID | MS_NODEV, "size=1048576,mode=755")

    def _protect(self, path, above):
        """`path` read-only, whatever a policy grants around it."""
        self._pin(path, above)
        with opened(path) as target:
            attach(target, target, MOUNT_ATTR_RDONLY, 0)

    def _pin(self, path, above, again=False):
        """Bind the directories between `above` (a mount) and `path` onto themselves: a mount point
        cannot be renamed, and a renamed parent would move `path` out of the next jail's sight
        (it finds what to hide or protect by path). `again`: each pinned before too, if it is no
        mount point now (the host replaced it, which took the mounts on it along)."""
        parts = os.path.relpath(path, above).split("/")[:-1]
        for n in range(1, len(parts) + 1):
            ancestor = os.path.join(above, *parts[:n])
            if ancestor not in self.pinned or (again and not mount_root(ancestor)):
                with opened(ancestor) as fd:
                    attach(fd, fd)
                self.pinned.add(ancestor)


def mount_root(path):
    """Whether a mount is attached at `path` (a real path): it is crossed into from its parent."""
    parent, name = os.path.split(path)
    with opened(parent) as fd:
        try:
            os.close(open_path(name, RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV, dir_fd=fd))
        except OSError as e:
            if e.errno == errno.EXDEV:
                return True
            raise
    return False


class opened:
    """`with opened(path[, make=S_IFDIR or S_IFREG]) as fd`: an O_PATH descriptor of `path`, an
    absolute real path, opened a component at a time refusing any symlink; with `make`, missing
    directories on the way (and `path` itself, a directory or an empty file) are made first."""

    def __init__(self, path, make=0):
        self.path, self.make = path, make

    def __enter__(self):
        if not self.make:
            self.fd = open_path(self.path, RESOLVE_NO_SYMLINKS)
            return self.fd
        fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        names = [n for n in self.path.split("/") if n]
        try:
            for i, name in enumerate(names):
                last = i == len(names) - 1
                try:
                    if last and self.make == stat.S_IFREG:
                        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644, dir_fd=fd))
                    else:
                        os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = open_path(name, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return fd

    def __exit__(self, *exc):
        os.close(self.fd)


def attach(source, target, add=0, remove=0, whole=True):
    """Mount a copy of the mounts at the descriptor `source` (and, `whole`, under it: else the one
    mount alone, where the host allows that) on the descriptor `target`, its attributes changed
    first (`add`, `remove`: MOUNT_ATTR_*) while nothing can reach it; a mount the host keeps
    read-only stays so (then only the copy's top changes)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH
    try:
        tree = check(
            libc.syscall(
                ctypes.c_long(SYS_OPEN_TREE),
                ctypes.c_long(source),
                b"",
                ctypes.c_long(flags | (AT_RECURSIVE if whole else 0)),
            ),
            "open_tree",
        )
    except OSError as e:
        if whole or e.errno != errno.EINVAL:  # EINVAL: mounts of the host's lie under it, which go along
            raise
        tree = check(
            libc.syscall(ctypes.c_long(SYS_OPEN_TREE), ctypes.c_long(source), b"", ctypes.c_long(flags | AT_RECURSIVE)),
            "open_tree",
        )
    try:
        if add or remove:
            try:
                set_mount_attrs(tree, "", add, remove, AT_EMPTY_PATH | AT_RECURSIVE)
            except OSError as e:
                if e.errno != errno.EPERM:
                    raise
                set_mount_attrs(tree, "", add, remove, AT_EMPTY_PATH)
        check(
            libc.syscall(
                ctypes.c_long(SYS_MOVE_MOUNT),
                ctypes.c_long(tree),
                b"",
                ctypes.c_long(target),
                b"",
                ctypes.c_long(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
            ),
            "move_mount",
        )
    finally:
        os.close(tree)


def _directory_beneath(fd, name):
    """The directory `name` in the directory `fd`, made if missing, opened refusing any symlink."""
    try:
        os.mkdir(name, 0o700, dir_fd=fd)
    except FileExistsError:
        pass
    return open_path(name, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH, os.O_DIRECTORY, dir_fd=fd)


def ollie_mounts():
    """The mount points of ollie's file servers (FUSE, fsname "ollie") in this mount namespace."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, fs = line.partition(" - ")
            fstype, source = (fs.split() + ["", ""])[:2]
            if fstype.startswith("fuse") and (fstype == "fuse.ollie" or source == "ollie"):
                point = fields.split()[4]
                found.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point))  # \040 is a space
    return found


# ---- starting a stage ----------------------------------------------------------------------------


def add_rules(ruleset, rules):
    """Grant the jail's own mounts (a fresh /proc, the private /tmp, the view: a path, or the
    descriptor of one): the parent built its rules on the host's inodes, which the jail does not see
    there."""
    for where, rights in rules:
        try:
            fd = os.dup(where) if isinstance(where, int) else open_path(where, RESOLVE_NO_SYMLINKS)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= 1 | 2 | 4 | (1 << 14) | (1 << 15)  # the rights a file can have
            rule = PathBeneath(rights, fd)
            check(
                libc.syscall(
                    ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                    ctypes.c_long(ruleset),
                    ctypes.c_long(1),
                    ctypes.byref(rule),
                    ctypes.c_long(0),
                ),
                f"landlock rule for {where}",
            )
        finally:
            os.close(fd)


def confine(ruleset, seccomp):
    """Confine the calling thread, and so every program it starts, in this order: no new
    privileges, the Landlock domain, the seccomp filter (last but one: it refuses calls the others
    make), no capabilities. Each is the thread's own (the limits and not being dumpable are the
    process's: PID 1 sets them, `limit`)."""
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if ruleset >= 0:
        check(
            libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_long(ruleset), ctypes.c_long(0)),
            "landlock_restrict_self",
        )
    if seccomp is not None:
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(seccomp)), "seccomp")
    check(libc.capset(ctypes.byref(CAP_HEADER), NO_CAPS), "capset")


def limit(rlimits):
    """PID 1's limits, which every program inherits: the jail's (one jail per set of limits).
    Its own CPU time counts too: past the soft limit (SIGXCPU) it retires (`Jail.serve`)."""
    for which, soft, hard in rlimits:
        resource.setrlimit(which, (soft, hard))


def receive_fds(sock, size=65536, most=8):
    """socket.recv_fds, its descriptors close-on-exec as they arrive (recv_fds passes no flags)."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_LEN(most * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds), None, None


def close_all_but(fd, keep):
    """Close every descriptor but `fd` (moved to 3), `keep` (the native init's, moved to 4 and on,
    -1 kept as -1) and the standard three: a jail keeps none of the fork server's, nor another
    jail's socket. Returns the new numbers."""
    wanted = [fd, *(k for k in keep if k >= 0)]
    high = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, 64) for f in wanted]  # out of the way of the numbers they take
    for n, f in enumerate(high):
        os.dup2(f, 3 + n, inheritable=False)  # a program holding one could speak for us
    check(
        libc.syscall(
            ctypes.c_long(SYS_CLOSE_RANGE), ctypes.c_long(3 + len(high)), ctypes.c_long(0xFFFFFFFF), ctypes.c_long(0)
        ),
        "close_range",
    )
    moved = iter(range(4, 4 + len(high)))
    return 3, tuple(next(moved) if k >= 0 else -1 for k in keep)


class Channel:
    """One ruleset's socket to the parent: its spawn and kill requests in, its stages' exits out;
    its programs are started by its `worker`, a thread confined by the ruleset (started with the
    first of them: a jail that hands its channels to the native init never starts one)."""

    def __init__(self, sock, ruleset, seccomp, supervised=""):
        self.sock, self.ruleset, self.seccomp = sock, ruleset, seccomp
        self.supervised = supervised  # the native init's program, whose connect(2) calls it makes (hex; "": none)
        self._worker = None
        self.pids = {}  # request id -> pid, while running
        self.closed = False

    @property
    def worker(self):
        if self._worker is None:
            self._worker = Confined(self.ruleset, seccomp_program(self.seccomp))
        return self._worker

    def receive(self):
        """The next request (its op, id and body's fields) and its descriptors, or None at the end.
        A request is NUL-separated fields, as the native init reads them: `spawn ID` and the body
        ARGC CWD ARGV... ENV... (in the packet, or in the memfd that comes as a fourth descriptor,
        after the program's stdin, stdout and stderr), or `kill ID`."""
        try:  # close-on-exec as they arrive: a program gets only what is passed to it on purpose
            data, fds, _, _ = receive_fds(self.sock)
        except ConnectionError:
            return None
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        try:
            op, rid, body = [*data.split(b"\0", 2), b"", b""][:3]
            if op == b"spawn" and len(fds) == 4:
                body = os.pread(fds[3], os.fstat(fds[3]).st_size, 0)
            return op.decode(), int(rid), body.split(b"\0")[:-1], fds
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def send(self, message, fds=()):
        if self.closed:
            return
        try:
            socket.send_fds(self.sock, [json.dumps(message).encode()], list(fds))
        except OSError:
            pass  # the parent is gone: the next receive ends the channel

    def close(self):
        self.closed = True
        self.sock.close()
        if self.ruleset >= 0:
            os.close(self.ruleset)
        if self._worker is not None:
            self._worker.stop()


class Jail:
    """PID 1 (or, without namespaces, the jail's only server): serves the parent's control socket
    (a request per ruleset, answered with that ruleset's socket) and every ruleset's socket (a
    request per program to start or kill).

    Each ruleset's programs are started by a thread of this process confined by it (`Confined`):
    nothing of the jail but this process is alive between stages. Every descriptor it holds is
    close-on-exec, so a program gets its three streams and nothing else. Each program runs in a
    process group of its own, which no other process can join (the seccomp filter refuses a
    setpgid into another group); when it exits its group is killed. A process that left its group
    (setsid, setpgid) and lost its parent comes to us (we are the PID namespace's init, or a
    subreaper) and is killed: nothing outlives its stage, and looking costs one read of our
    children's list, not a walk of /proc."""

    def __init__(self, sock, mounts, pid_one, view_rights=0, native=None, own_network=False):
        self.sock = sock
        self.own_network = own_network  # in a network namespace of its own (the native init may then supervise)
        self.native = native  # (init, python, its path, source): what become_native execs, or None
        self.view_rights = view_rights  # the Landlock rights every program gets on the view
        self.mounts = mounts
        self.pid_one = pid_one  # in a PID namespace: kill(-1) ends all
        self.channels = set()
        self.stages = {}  # pid -> (channel, request id)
        self.selector = selectors.DefaultSelector()
        self.retiring = False  # its own CPU time passed the limit: it ends once no program runs
        # Kept open: reading it again from offset 0 lists the children anew.
        self.children = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY | os.O_CLOEXEC)

    def serve(self):
        """Until the control socket closes; then everything in the jail dies, and we exit last."""
        read_wake, write_wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(write_wake)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)  # a program may signal its worker thread
        signal.signal(signal.SIGXCPU, self.retire)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(read_wake, selectors.EVENT_READ)
        running = True
        while running:
            for key, _ in self.selector.select():
                if key.fileobj is read_wake:
                    while True:
                        try:
                            os.read(read_wake, 512)
                        except BlockingIOError:
                            break
                    self.reap()
                elif key.fileobj is self.sock:
                    running = self.control()
                elif key.data in self.channels:
                    self.serve_channel(key.data)
            if self.retiring and not self.stages:
                break  # the parent sees the jail gone, and starts another for the next call
        self.end()

    def retire(self, *_):
        if not self.retiring:
            self.retiring = True
            reply(self.sock, {"id": 0, "retire": True})  # the parent starts another for new calls

    def end(self):
        for channel in list(self.channels):
            self.end_channel(channel)
        if self.pid_one:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing left to kill
            while True:  # every orphan comes to us: once none is left, the parent sees our end last
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
        else:
            self.sweep()

    def control(self):
        """A request for a ruleset's channel; False once the parent is gone."""
        channel = answer_request(self.sock, self.mounts, self.view_rights)
        if channel is None:
            return False
        if channel:
            self.channels.add(channel)
            self.selector.register(channel.sock, selectors.EVENT_READ, channel)
            if self.native is not None and not self.stages:
                self.become_native()  # returns only if it could not
        return True

    def become_native(self):
        """Exec the native init (jailinit.c) in our place, so that between stages the jail costs a
        few pages, not a Python process. It is handed what it serves (the control socket, each
        channel's socket, ruleset and seccomp programs, where the jail's own sockets are) and what
        a later ruleset's `build` needs (the mounts' state, the interpreter, this source), with our
        capabilities made ambient (an exec keeps them then; its programs drop them). Returns only
        if the exec failed: we serve on."""
        init, python, python_path, source = self.native
        state = {"mounts": self.mounts.state() if self.mounts else None, "view_rights": self.view_rights}
        made = [memfd("ollie-jail-state", json.dumps(state).encode())]
        channels = []
        for c in self.channels:
            made.append(memfd("ollie-seccomp", bytes.fromhex(c.seccomp)) if c.seccomp else -1)
            made.append(memfd("ollie-seccomp", bytes.fromhex(c.supervised)) if c.supervised else -1)
            channels.append(f"{c.sock.fileno()},{c.ruleset},{made[-2]},{made[-1]}")
        handed = [self.sock.fileno(), python, source, *(self.mounts.descriptors() if self.mounts else [])]
        handed += [fd for c in self.channels for fd in (c.sock.fileno(), c.ruleset) if fd >= 0]
        for fd in handed:
            os.set_inheritable(fd, True)
        pid_one = "1" if self.pid_one else "0"
        if self.pid_one and self.own_network and self.mounts:
            pid_one = ",".join(map(str, [2, *self.mounts.own_devices]))  # where the jail's own sockets are
        args = [str(self.sock.fileno()), pid_one, str(made[0]), str(python), python_path]
        try:
            ambient_capabilities(True)
            home = {"PYTHONHOME": os.environ["PYTHONHOME"]} if "PYTHONHOME" in os.environ else {}
            os.execve(init, ["ollie-jail-init", *args, str(source), *channels], home)  # for its builds
        except OSError:
            ambient_capabilities(False)
            for fd in handed:
                os.set_inheritable(fd, False)
            for fd in made:
                if fd >= 0:
                    os.close(fd)
            self.native = None

    def serve_channel(self, channel):
        try:
            received = channel.receive()
        except (ValueError, TypeError):
            received = None  # not ollie's words: the channel ends
        if received is None:
            self.end_channel(channel)
            return
        op, rid, fields, fds = received
        try:
            if op == "spawn":
                self.spawn(channel, rid, fields, fds)
            elif op == "kill" and rid in channel.pids:
                kill_group(channel.pids[rid])
        finally:
            for fd in fds:
                os.close(fd)

    def end_channel(self, channel):
        """The parent closed a channel (its ruleset out of use, or the jail closing): its programs end."""
        self.channels.discard(channel)
        self.selector.unregister(channel.sock)
        for pid in channel.pids.values():
            kill_group(pid)
        channel.close()

    def spawn(self, channel, rid, fields, fds):
        try:
            if len(fds) < 3:
                raise ValueError("no streams to run with")
            argc = int(fields[0]) if fields else 0
            if not (0 < argc <= len(fields) - 2 and fields[2]):
                raise ValueError("no program to run")
            cwd, argv = os.fsdecode(fields[1]), [os.fsdecode(a) for a in fields[2 : 2 + argc]]
            env = dict(os.fsdecode(e).partition("=")[::2] for e in fields[2 + argc :])
            pid = spawn_in(channel.worker, argv, env, cwd, fds[:3])
        except (OSError, ValueError, TypeError) as e:
            channel.send({"id": rid, "error": describe(e)})
            return
        self.stages[pid] = (channel, rid)
        channel.pids[rid] = pid

    def reap(self):
        while True:  # stages, and (as PID 1 or a subreaper) every orphan of the jail
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            pid = info.si_pid
            channel, rid = self.stages.pop(pid, (None, None))
            if channel is not None:
                kill_group(pid)  # before the reap: until then the group's id cannot be reused
                channel.pids.pop(rid, None)
            _, status = os.waitpid(pid, 0)
            if channel is not None:
                channel.send({"id": rid, "status": os.waitstatus_to_exitcode(status)})
            self.sweep()  # after the answer, which need not wait for it

    def sweep(self):
        """Kill our children that are neither a running program nor in one's group: strays."""
        for pid in map(int, os.pread(self.children, 1 << 16, 0).split()):
            if pid in self.stages:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    group = int(f.read().rsplit(b")", 1)[1].split()[2])
                if group not in self.stages:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue


def reply(sock, message, fds=()):
    try:
        socket.send_fds(sock, [json.dumps(message).encode()], list(fds))
    except OSError:
        pass  # the parent is gone: the next receive ends this process


def answer_request(sock, mounts, view_rights):
    """Read a request for a ruleset's channel on the control socket `sock` and answer it: returns
    the new Channel, False if it failed (the parent told why), None once the parent is gone."""
    try:
        data, fds, _, _ = receive_fds(sock)
    except ConnectionError:
        return None
    if not data:
        return None
    rid = None
    try:
        request = json.loads(data)
        rid = request["id"]
        given = dict(zip(request.get("fds", []), fds, strict=True))
        ours, theirs = make_channel(given, mounts, view_rights, request.get("slots", ()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        reply(sock, {"id": rid, "error": describe(e), "changed": isinstance(e, GrantChanged)})
        return False
    finally:
        for fd in fds:
            os.close(fd)
    with theirs:
        reply(sock, {"id": rid}, [theirs.fileno()])
    return ours


def make_channel(fds, mounts, view_rights, slots=()):
    """A channel for the ruleset and the spec in `fds`; returns it and the parent's end of its
    socket. `slots`: the slot each of the spec's overlays takes in this jail ("": none free)."""
    spec = json.loads(os.pread(fds["spec"], os.fstat(fds["spec"]).st_size, 0))
    ruleset = fds.get("ruleset", -1)
    if mounts is not None:
        for grant in spec["expose"]:
            mounts.expose(*grant)
        for path in spec.get("mask", ()):
            mounts.mask(path)
        for path in spec.get("mask_dirs", ()):
            mounts.mask_dir(path)
        for where, glob_part, rest in spec.get("mask_matches", ()):
            mounts.mask_matches(where, glob_part, rest)
        for (_, target, lower, dev, ino, _), slot in zip(spec.get("overlays", ()), slots, strict=False):
            if slot:
                mounts.overlay(target, lower, (dev, ino), slot)
        if spec.get("overlay_slots"):  # out of code's reach once mounted: what the overlays write to
            mounts.hide_slots(spec["overlay_slots"])
        if ruleset >= 0:
            view = [[mounts.view_root, view_rights]] if mounts.view else []
            add_rules(ruleset, spec["jail_rules"] + view)
    # Not dumpable before any thread is confined: a program could otherwise trace its
    # worker, whose memory is PID 1's. Not before: a process that is not dumpable has its
    # /proc files owned by the host's root (a user's test of the setup could not read them).
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")
    theirs, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(True)
    ruleset = os.dup(ruleset) if ruleset >= 0 else -1
    return Channel(ours, ruleset, spec["seccomp"], spec.get("seccomp_supervised", "")), theirs


def build(control, state_fd, result):
    """A new ruleset's channel, for the native init, which runs this in a fresh interpreter (the
    jail has no Python process to fork any more): answer the request on the control socket and
    hand the init "A C R S U T" (whether the request was answered, and whether a channel's socket,
    its ruleset, its seccomp program, its supervised one and the mounts' new state follow), the
    state whatever came of the request (a grant refused half-way leaves the mounts it made), in a
    new memfd: the old one stays whole for the next build should this one die."""
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "dumpable")  # before anything: exec made us dumpable
    state = json.loads(os.pread(state_fd, os.fstat(state_fd).st_size, 0))
    mounts = Mounts.restore(state["mounts"]) if state["mounts"] else None
    sock = socket.socket(fileno=control)
    sock.setblocking(True)
    answered, channel = False, None
    with socket.socket(fileno=result) as out:
        try:
            channel = answer_request(sock, mounts, state["view_rights"])
            answered = True
        finally:
            fds, flags = [], [answered, bool(channel), False, False, False, mounts is not None]
            if channel:
                fds.append(channel.sock.fileno())
                if channel.ruleset >= 0:
                    fds.append(channel.ruleset)
                    flags[2] = True
                if channel.seccomp:
                    fds.append(memfd("ollie-seccomp", bytes.fromhex(channel.seccomp)))
                    flags[3] = True
                if channel.supervised:
                    fds.append(memfd("ollie-seccomp", bytes.fromhex(channel.supervised)))
                    flags[4] = True
            if mounts is not None:
                state["mounts"] = mounts.state()
                fds.append(memfd("ollie-jail-state", json.dumps(state).encode()))
            socket.send_fds(out, [" ".join(str(int(f)) for f in flags).encode()], fds)


def memfd(name, data):
    """A memfd holding `data`, inheritable (for the native init)."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    return fd


def ambient_capabilities(raise_them):
    """Make our capabilities (every one, in the jail's user namespace) ambient, so that an exec
    keeps them; or drop them from the ambient set again."""
    if not raise_them:
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        return
    caps = (CapData * 2)()
    check(libc.capget(ctypes.byref(CAP_HEADER), caps), "capget")
    for data in caps:
        data.inheritable = data.permitted
    check(libc.capset(ctypes.byref(CAP_HEADER), caps), "capset")
    permitted = caps[0].permitted | caps[1].permitted << 32
    for cap in range(64):
        if permitted >> cap & 1:
            check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0), "ambient capabilities")


class Confined:
    """A thread of PID 1 that confines itself once (no new privileges, the Landlock ruleset, the
    seccomp filter, no capabilities: all of them the calling thread's alone) and then starts its
    ruleset's programs with posix_spawn, which they inherit. PID 1's main thread, which holds
    the mounts, stays outside the domain; the process is not dumpable, so no program can trace
    or read the thread (nor its process), and as the PID namespace's init it ignores the signals
    a program may send the thread (SIGKILL and SIGSTOP included). Used by the main thread alone,
    one call at a time (a bare `_thread`: `threading` would cost every jail its pages)."""

    def __init__(self, ruleset, seccomp):
        self.go, self.done = _thread.allocate_lock(), _thread.allocate_lock()
        self.go.acquire()
        self.done.acquire()
        self.fn = None
        self.value, self.error = None, None  # what the last call returned, or raised
        _thread.start_new_thread(self.run, (ruleset, seccomp))
        self.done.acquire()
        if self.error is not None:
            raise self.error

    def run(self, ruleset, seccomp):
        try:
            confine(ruleset, seccomp)
        except OSError as e:
            self.error = e
            self.done.release()
            return
        self.done.release()
        while True:
            self.go.acquire()
            if self.fn is None:
                return
            try:
                self.value = self.fn()
            except Exception as e:  # noqa: BLE001 (handed to the caller)
                self.error = e
            self.done.release()

    def call(self, fn):
        self.fn = fn
        self.go.release()
        self.done.acquire()
        value, error = self.value, self.error
        self.fn = self.value = self.error = None
        if error is not None:
            raise error
        return value

    def stop(self):
        self.fn = None
        self.go.release()


def spawn_in(worker, argv, env, cwd, stdio):
    """Start `argv` from `worker`'s thread: in `cwd` (opened by that thread, as any path a program
    names), its streams `stdio`, in a process group of its own; returns its pid.

    Not in a session of its own: the kernel's autogroup scheduling weighs each session as one
    program, so 200 stages each in a session took 200 shares of the CPU against ollie's one, and
    its loop waited whole time slices (lag p99 23 ms, max 1.9 s, `bench/jails.py --busy`). In the
    fork server's session, all jails together weigh as one program (lag p99 under 1 ms). That the
    groups share a session would let a process join another stage's group: seccomp refuses it."""

    def spawn():
        os.chdir(cwd)  # the process's: every spawn sets it
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            setpgroup=0,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # Python ignores them
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(stdio)],
        )

    return worker.call(spawn)


def seccomp_program(hex_code):
    if not hex_code:
        return None
    raw = bytes.fromhex(hex_code)
    filters = (SockFilter * (len(raw) // 8)).from_buffer_copy(raw)
    prog = SockFprog(len(filters), filters)
    prog._keep = filters  # the program points into it
    return prog


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def describe(error):
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename or 'sandbox'}: {error.strerror}" if error.filename else error.strerror
    return str(error)


def schedule_as_batch():
    """Jails and their programs are batch work, below ollie's loop (inherited by every jail and
    stage): SCHED_BATCH, so that a burst of stages (hundreds of sessions' at once) does not
    preempt the loop at each of their wakeups, and a nice of JAIL_NICE, set on the process and on
    the session's autogroup (the fork server's session holds every jail, and the kernel weighs an
    autogroup as one program against ollie's), so that the loop, when it has work, gets a CPU
    before them. At 500 agents the loop then answers `cat state` within 12-18 ms (p99) instead
    of 25-30 ms, the jails' work waiting instead (the turn 1.05-1.09x its ideal against 1.03x;
    at nice 10, 1.13-1.22x). Any process may lower its own priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        pass
    try:
        with open("/proc/self/autogroup", "w") as f:  # absent without autogroup scheduling
            f.write(str(JAIL_NICE))
    except OSError:
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, JAIL_NICE)
    except OSError:
        pass


def fork_server(fd, native):
    """Serve ollie's requests for jails on socket `fd` until it closes: each request is one
    descriptor (the new jail's socket, its payload nothing) and is answered by a fork, whose child
    becomes the jail (`start`), reading its setup from that socket itself.

    Nothing of a session ever passes through this process, so nothing of one can reach another's
    jail: no setup, path or grant (those travel on the jail's own socket, to the child alone), no
    Landlock ruleset (sent later to the jail's PID 1, over that same socket). The child keeps none
    of this process's descriptors but the jail's socket, `native`'s and the standard three (its
    /dev/null stdin, ollie's stdout and stderr, as a helper started directly had): its first act
    is close_range. Its memory is this process's: the standard library and the empty requests, no
    secret (started with PYTHONHOME its whole environment, no site directory, no package of
    ollie). `native`: the native init's descriptors and the interpreter's path (init, python, its
    path, source, the same for every jail), or None (every jail's PID 1 stays this Python)."""
    sock = socket.socket(fileno=fd)
    sock.settimeout(1.0)  # a look for exited children at least every second
    schedule_as_batch()
    libc.mallopt(M_ARENA_MAX, 1)  # a jail's threads allocate from the one heap, not an arena each
    gc.collect()
    gc.freeze()  # what is imported stays in pages the jails share (no reference count writes them)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 16, 4)
        except TimeoutError:
            data, fds = b"-", []
        except OSError:
            return
        if not data:
            return  # ollie is gone; its jails live on until their own sockets close
        for jail_fd in fds:
            if len(fds) == 1 and data == b"jail":
                try:
                    pid = os.fork()
                except OSError:
                    pid = -1  # the jail's socket closes unanswered: its start fails, saying the helper exited
                if pid == 0:
                    status = 1
                    try:
                        sock.detach()  # closed below with the rest; no object left to close its number again
                        keep = (native[0], native[1], native[3]) if native else ()
                        jail, kept = close_all_but(jail_fd, keep)
                        status = start(jail, (kept[0], kept[1], native[2], kept[2]) if native else None)
                    finally:
                        os._exit(status)
            os.close(jail_fd)
        while True:  # the first process of each jail exits once its PID 1 is forked
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def start(fd, native):
    """Become a jail: read the setup from socket `fd` (the only descriptor left beside 0-2), enter
    the namespaces, fork PID 1 and exit; PID 1 serves the socket."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    data = sock.recv(1 << 20)
    if not data:
        return 0
    setup = json.loads(data)
    refused = enter_namespaces(setup["network"])
    if not refused and not setup["network"]:
        loopback_up()
    if os.fork():
        return 0  # the server lives on (in a jail, as its PID 1); the parent watches it through the socket
    if refused:
        check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")  # orphans come to us to reap
        sock.send(json.dumps({"id": 0, "ready": True, "namespaces": refused}).encode())
        limit(setup["rlimits"])
        Jail(sock, None, pid_one=False, native=native).serve()
        return 0
    fuse, view_error = [], ""
    try:
        mounts = Mounts(setup["hide"], setup["protect"], setup["tmp_size"])
        with open("/proc/sys/kernel/pid_max", "w") as f:
            f.write(str(setup["processes"] + 1))  # PIDs run from 1 (this process) to pid_max - 1
    except OSError as e:
        sock.send(json.dumps({"id": 0, "ready": False, "error": describe(e)}).encode())
        return 1
    if setup["view"]:
        try:
            fuse.append(mounts.mount_view(setup["view"]))
        except OSError as e:  # no FUSE here (no /dev/fuse, or not ours to open): a jail without the view
            view_error = describe(e)
    hello = {"id": 0, "ready": True, "namespaces": "", "view": bool(fuse), "view_error": view_error}
    socket.send_fds(sock, [json.dumps(hello).encode()], fuse)
    for fd in fuse:
        os.close(fd)
    limit(setup["rlimits"])
    libc.malloc_trim(0)  # the free pages the setup left, back to the system: every jail keeps its own
    own_network = not setup["network"]
    Jail(sock, mounts, pid_one=True, view_rights=setup["view_rights"], native=native, own_network=own_network).serve()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "build":  # run by the native init, for a new ruleset
        build(*map(int, sys.argv[2:5]))
    else:  # SOCKET [INIT PYTHON PYTHON_PATH SOURCE]
        fds = sys.argv[1:]
        fork_server(int(fds[0]), (int(fds[1]), int(fds[2]), fds[3], int(fds[4])) if len(fds) == 5 else None)
