"""The sandbox behind execute_code, hooks and tool servers (private; no stable API).

The parent builds the Landlock ruleset and the seccomp program once per policy and directory
(`Sandboxes.get_async`); a jail (`jail.py`, whose helper is `jaild.py`) applies them to each program it
starts, inside fresh user, PID, IPC, mount and (unless the policy grants network) network
namespaces. docs/sandbox.md has the threat model.

- `policy.py`: the policies, read and expanded
- `landlock.py`, `seccomp.py`: the two kernel layers built from a policy
- `jail.py`: the jail, as ollie's process drives it; `jaild.py`: the helper inside it
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import os
import platform
import re
import resource
import shutil
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .. import config
from ..config import hidden_dirs
from ..paths import (
    Decided,
    LinkRefused,
    as_decided,
    identities,
    identity,
    open_real,
    real_identity,
    real_path,
    resolved,
    within,
)
from . import grants
from .jail import PYTHON_DIRS, Confinement, GrantChanged, Jail, JailSetup, user_site_dirs, userns_hint
from .landlock import RO, RW, RWX, build_ruleset, fs_handled, landlock_abi
from .policy import (
    FS_KEYS,
    Limits,
    Policy,
    SandboxError,
    forget_trees,
    load_policy,
    missing_policy,
    policy_files,
    told_caches,
    tree_state,
    venv_stores,
)
from .repository import repository_root
from .seccomp import SECCOMP_MACHINES, seccomp_program, seccomp_supported, supervisable
from .userconfig import SYSTEM_GITCONFIG

_T = TypeVar("_T")

__all__ = [
    "Jails",
    "Policy",
    "Sandbox",
    "SandboxError",
    "Sandboxes",
    "confined",
    "decide_anew",
    "directory_within",
    "find_program",
    "hidden_paths",
    "load_policy",
    "missing_policy",
    "programs_found",
    "repository_root",
    "seccomp_supported",
]


_RLIMIT_CPU, _RLIMIT_FSIZE, _RLIMIT_DATA, _RLIMIT_CORE = 0, 1, 2, 4


class Sandbox:
    """A built policy: what a jail applies to each program it starts (the Landlock ruleset fd,
    the seccomp program, resource limits), the environment filter and the PATH directories the
    sandbox can execute from."""

    def __init__(self, policy: Policy, decided: list[grants.Grant] | None = None, in_jail: bool = False):
        """`decided`: the policy's grants, decided already (`_Decisions`; the caller closes them).
        `in_jail`: its programs run in a jail's namespaces (never without them: a jail whose
        namespaces the kernel refused runs another sandbox), whose network is its own loopback
        unless the policy reaches the host's."""
        self.policy = policy
        # The paths it was decided on that no call looks at itself, each as it was then (None:
        # missing): `_look_again` marks it `stale` once one is another file, or was made.
        self.named: tuple[tuple[str, Decided], ...] = ()
        # The configurations in its trees as they were judged (`policy.in_trees`): one tuple for
        # every sandbox built from the same listing, looked at once.
        self.in_trees = policy.in_trees
        self.stale = False
        abi = landlock_abi()
        if abi == 0 and not policy.best_effort:
            raise SandboxError(
                "this kernel has no Landlock (needs Linux 5.13+ with landlock in the lsm= list), "
                "so execute_code cannot be sandboxed; set general.best_effort: true in "
                f"{config.cfg_path() / 'sandbox.yaml'} to run without it"
            )
        if not seccomp_supported() and not policy.best_effort:
            raise SandboxError(
                f"ollie builds its seccomp filter for {' and '.join(SECCOMP_MACHINES)}, not for this "
                f"{platform.machine()}: without it sandboxed code could make any socket; set general.best_effort: "
                f"true in {config.cfg_path() / 'sandbox.yaml'} to run with Landlock and the namespaces alone"
            )
        # For every policy, not only a jail's first: a running jail takes a later ruleset (another
        # policy, or a cwd of `$HOME` after `/cwd ~`) whose code could replace such a link.
        _refuse_replaceable_links(policy)
        own_network = in_jail and not policy.network
        owned = decided is None
        if decided is None:
            decided = grants.decide(policy, identities(hidden_dirs()), identities(read_only_dirs()))
        try:
            ruleset = build_ruleset(policy, decided, abi, own_network) if abi else -1
            # Every path granted, as decided: the jail mounts a grant only if it is still that file.
            # In the policy's order (ro, rox, rw, rwx, tmpfile): a writable grant inside a readable
            # one is bound after it, on top.
            in_order = sorted(decided, key=lambda g: FS_KEYS.index(g.key))
            expose = [(g.path, g.writable, g.shared, g.own, *g.identity) for g in in_order]
            # The cwd and the user's directories code may write, as decided: one made again since
            # (a cwd cloned anew, a cache removed) is another sandbox's, and a running jail shows
            # the old. (Not ollie's own, nor /dev's.)
            self.watched = tuple(
                (g.path, g.identity)
                for g in decided
                if (g.writable or g.given == policy.cwd)
                and not g.own
                and not g.path.startswith("/dev/")
                and stat.S_ISDIR(os.fstat(g.fd).st_mode)
            )
            # Where a program on PATH can run from: the grants as decided, never resolved again.
            self._exec_roots = tuple(g.path.rstrip("/") + "/" for g in decided if g.key in ("rox", "rwx"))
        finally:
            if owned:
                grants.close(decided)
        if ruleset >= 0:
            # Closed when the last call using this sandbox lets go of it, never before: a process
            # spawned with a closed ruleset's fd would run unconfined, or in another ruleset.
            weakref.finalize(self, os.close, ruleset)
        handled = fs_handled(abi)
        self.confinement = Confinement(
            ruleset,
            {
                # The jail's own /proc, /tmp, /dev/shm and pseudo-terminals, which the parent's rules cannot name.
                "jail_rules": [
                    ["/proc", RO & handled],
                    ["/tmp", RWX & handled],
                    ["/dev/shm", RW & handled],
                    ["/dev/pts", RW & handled],
                    ["/dev/ptmx", RW & handled],
                ],
                "seccomp": seccomp_program(policy, own_network).hex(),
                # For a jail's native init, which makes the programs' connect(2) calls itself:
                # Unix sockets among the jail's own programs (a test's server, multiprocessing).
                "seccomp_supervised": (
                    seccomp_program(policy, own_network, supervised=True).hex()
                    if supervisable(policy, own_network)
                    else ""
                ),
                "expose": expose,
                # Your caches, seen copy-on-write at their places in the cwd's cache (`overlays.py`):
                # each in a slot the jail takes (`Jail.take_slots`).
                "overlays": [[o.name, o.target, o.lower, *o.identity, policy.cache] for o in policy.overlays],
                "overlay_slots": f"{policy.cache}/.overlay" if policy.cache else "",
                # Configurations in the trees it grants that hold a secret (or that ollie may not
                # look at): read as /dev/null reads; and the matches of what ollie could not list.
                "mask": list(policy.masked),
                "mask_matches": list(policy.unlisted),
                "mask_dirs": list(policy.masked_dirs),
            },
        )
        self._search_paths: dict[str, str] = {}
        self._env_names = re.compile("|".join(fnmatch.translate(p) for p in policy.env) or "(?!)")
        # Read when it is built (the builder's thread, for every session's): what they read lies
        # where code may write ($HOME's git config, the PATH's directories), and could be a FIFO
        # or lead into ollie's own mount, which the event loop would wait on.
        self._environ = _given_environ(policy, {k: v for k, v in os.environ.items() if self._env_names.match(k)})
        self.search_path(self._environ.get("PATH") or os.defpath)

    def take_as_is(self) -> None:
        """Its paths, as the last look saw them, counted as what it was decided on: a decision
        refuses the policy now (a link planted on a path it names), and the session keeps what it
        has, which grants no more than before, until one changes again. (Not once a configuration
        in its trees changed: kept, it would show one that took a secret.)"""
        self.named = tuple((path, _LOOKED.get(path, decided)) for path, decided in self.named)
        self.stale = False

    def search_path(self, path: str) -> str:
        """`path` without the directories the sandbox cannot execute from, so a program resolves
        to one that runs (not, say, a pyenv shim under $HOME that fails with EACCES)."""
        kept = self._search_paths.get(path)
        if kept is None:
            dirs = [d for d in path.split(":") if d and (resolved(d) + "/").startswith(self._exec_roots)]
            kept = self._search_paths[path] = ":".join(dirs)
        return kept

    async def search_path_async(self, path: str) -> str:
        """`search_path`, a PATH not seen yet (a session's own) judged in the builder's thread."""
        kept = self._search_paths.get(path)
        if kept is None:
            kept = await off_loop(self.search_path, path)
        return kept

    def environ(self) -> dict[str, str]:
        """The variables of ollie's environment that the policy lets in (read once: a sandbox is
        rebuilt when its policy changes, not when ollie's environment does)."""
        return dict(self._environ)


# The programs found on each PATH a sandbox leaves (`find_program`), for every session of that
# PATH, and when; and the lookups under way, which the calls that want the same share (500
# sessions' first stages at once look up `bash` once).
_FOUND: dict[str, tuple[float, dict[tuple[str, ...], str | None]]] = {}
_FINDING: dict[tuple[str, tuple[str, ...]], asyncio.Future[str | None]] = {}


def programs_found(path: str) -> dict[tuple[str, ...], str | None]:
    """What `find_program` found on `path`, by the names it looked for, for `RECHECK` seconds: a
    program installed or removed meanwhile is seen that much later."""
    now = time.monotonic()
    when, found = _FOUND.get(path, (0.0, {}))
    if now - when >= RECHECK:
        for old in [p for p, (then, _) in _FOUND.items() if now - then >= RECHECK]:
            del _FOUND[old]  # PATHs no session asked for since do not pile up
        when, found = _FOUND[path] = (now, {})
    return found


async def find_program(path: str, names: tuple[str, ...]) -> str | None:
    """The first of `names` found on `path` (a sandbox's `search_path`), looked up in a thread: code
    working in $HOME could plant a link in one of its directories (`~/.local/bin/bash`) leading
    into ollie's own mount, which the event loop serves. Kept in `programs_found`."""
    found = programs_found(path)
    if names in found:
        return found[names]
    key = (path, names)
    finding = _FINDING.get(key)
    if finding is None or finding.get_loop() is not asyncio.get_running_loop():  # (a loop closed mid-way)
        finding = _FINDING[key] = asyncio.ensure_future(asyncio.to_thread(_which, path, names))
        finding.add_done_callback(lambda _: _FINDING.pop(key, None))
    found[names] = await asyncio.shield(finding)
    return found[names]


def _which(path: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        found = name if os.path.isabs(name) and os.access(name, os.X_OK) else shutil.which(name, path=path)
        if found:
            return found
    return None


def rlimits(limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """The resource limits of a jail's programs: (resource, soft, hard)."""
    return (
        (_RLIMIT_DATA, limits.memory, limits.memory),
        (_RLIMIT_CPU, limits.cpu, limits.cpu + 1),
        (_RLIMIT_FSIZE, limits.file_size, limits.file_size),
        (_RLIMIT_CORE, 0, 0),
    )


def jail_idle() -> float:
    """Seconds a jail may sit idle (no program of it running) before it is closed:
    `OLLIE_JAIL_IDLE`, 600 by default (and when it is no number); 0 keeps jails for their owner's life."""
    try:
        return max(0.0, float(os.environ.get("OLLIE_JAIL_IDLE") or 600))
    except ValueError:
        return 600.0


def _given_environ(policy: Policy, passed: dict[str, str]) -> dict[str, str]:
    """The variables sandboxed code gets: those the policy passes (`passed`), and where the
    sandbox moved what they would find."""
    env = dict(passed)
    if policy.dns:  # the resolver over TCP: the policy's port 53 (UDP stays refused)
        env["RES_OPTIONS"] = " ".join([env.get("RES_OPTIONS", ""), "use-vc"]).strip()
    if policy.git_config:  # the identity commits need, in place of a ~/.gitconfig git may not read
        env["GIT_CONFIG_GLOBAL"] = policy.git_config
    if SYSTEM_GITCONFIG not in policy.paths["ro"]:  # one holding a token: git dies on a file it may not read
        env["GIT_CONFIG_NOSYSTEM"] = "1"
    for copy in policy.copies:  # /dev/null for one holding a token: yarn dies on one it may not read
        env.setdefault(copy.variable, copy.path)
    if policy.cache:  # where Go, pip, pre-commit, ccache and npm cache (unless the policy passes its own)
        env.setdefault("XDG_CACHE_HOME", policy.cache)
        env.setdefault("npm_config_cache", f"{policy.cache}/npm")
        env.setdefault("XDG_STATE_HOME", f"{policy.cache}/state")  # and keep logs (pdm died on ~/.local/state)
        env.setdefault("UV_LINK_MODE", "copy")  # its cache is another mount than the cwd: no hard link crosses
        # pnpm's store (yours, copy-on-write: `overlays.py`); not by the npm_config_ name, at which npm warns
        env.setdefault("pnpm_config_store_dir", f"{policy.cache}/pnpm-store")
    for venv in policy.environments:  # the virtualenv activated, granted: poetry and pipenv use it
        if venv in policy.paths["rox"]:
            env["VIRTUAL_ENV"] = venv
    poetry = venv_stores(os.environ, os.path.expanduser("~"))[0]  # (where the cwd's own cache would have it look)
    if any(p.startswith(poetry.rstrip("/") + "/") for p in policy.paths["rox"]):
        env.setdefault("POETRY_VIRTUALENVS_PATH", poetry)
    for variable, cached in told_caches().items():  # what tests run from your cache, where granted
        if os.path.normpath(cached) in policy.paths["rox"]:
            env.setdefault(variable, cached)
    return env


class Jails:
    """The jails of one owner (a session's execute server, its hooks): one per network setting and
    limits, started on first use, restarted if one dies, closed once idle for `idle` seconds
    (`jail_idle()`; 0: never) and started again on the next use (its private /tmp goes with it)."""

    def __init__(self, view: Callable[[int], None] | None = None, idle: float | None = None) -> None:
        self._jails: dict[JailSetup, Jail] = {}
        self._idle = jail_idle() if idle is None else idle
        self._timer: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._starting: dict[JailSetup, asyncio.Future[Jail]] = {}
        self._retired: set[Jail] = set()  # replaced by a new jail: closed once no program of theirs runs
        self._hide = hidden_paths()
        self._read_only = read_only_dirs()
        self._uv_cache = _uv_cache()
        # Serves a jail's view of ollie's files, mounted at $OLLIE in it, on the /dev/fuse
        # descriptor it is given (and closes it); None: no view.
        self._view = view

    async def get(self, policy: Policy) -> Jail:
        """The jail for `policy`; one without namespaces (the kernel refused them) only when the
        policy says general.best_effort, else SandboxError."""
        limits = policy.limits
        view, view_rights = "", 0
        if self._view is not None:
            view, view_rights = config.mount_point(), RW & fs_handled(landlock_abi())
        setup = JailSetup(
            policy.network,
            limits.processes,
            limits.tmpdir,
            self._hide,
            self._read_only + self._link_sources(policy),
            view,
            view_rights,
            rlimits(limits),
        )
        jail = self._jails.get(setup)
        if jail is None or not jail.alive:
            if jail is not None and jail.running:  # ending once its programs have: closed once they have
                self._retired.add(jail)
            starting = self._starting.get(setup)
            if starting is None:  # one start for the calls that come meanwhile (none left running unowned)
                starting = self._starting[setup] = asyncio.ensure_future(self._start(setup))
                starting.add_done_callback(lambda _: self._starting.pop(setup, None))
            jail = await asyncio.shield(starting)
        jail.touch()
        self._watch()
        if jail.namespaces_refused and not policy.best_effort:
            allow = userns_hint() or "; allow user namespaces (sysctl user.max_user_namespaces)"
            raise SandboxError(
                f"the sandbox cannot isolate this: {jail.namespaces_refused}{allow}, or set general.best_effort: "
                f"true in {config.cfg_path() / 'sandbox.yaml'} to run with Landlock and seccomp alone "
                "(no process, network, /tmp or terminal isolation)"
            )
        return jail

    async def _start(self, setup: JailSetup) -> Jail:
        if setup.view:
            _make_mount_point(setup.view)
        jail = self._jails[setup] = await Jail.start(setup)
        if jail.view_fd >= 0 and self._view is not None:
            fd, jail.view_fd = jail.view_fd, -1
            try:
                self._view(fd)
            except BaseException:
                os.close(fd)  # the mount then fails every access instead of waiting on nobody
                raise
            jail.has_view = True
        return jail

    def _link_sources(self, policy: Policy) -> tuple[str, ...]:
        """Where installed packages may be hard links to: uv's cache (uv links by default).
        Writable there, a file is writable in the virtualenv too, whatever its mount says; so
        read-only in the jail, unless the policy grants the cache itself (not a directory around it).
        And the other way round, the cwd's installs linked from such a store (`policy.linked`)."""
        cache = self._uv_cache
        if not cache or any(
            p == cache or p.startswith(cache + "/") for key in ("rw", "rwx") for p in policy.paths[key]
        ):
            return policy.linked
        return (cache, *policy.linked)

    def _watch(self, delay: float | None = None) -> None:
        """Look at the jails after `delay` (by default the idle time; none when jails are never
        closed for idleness), or sooner if already asked: the retired ones are closed then, once
        none of their programs runs."""
        if delay is None:
            if self._idle <= 0:
                return
            delay = self._idle
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if self._timer is not None and self._timer.when() <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._close_idle)

    def _close_idle(self) -> None:
        """Close the retired jails none of whose programs runs, and the jails idle for `idle`
        seconds; look again when the next one would be."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now, soonest = loop.time(), self._idle or 0.5
        for jail in [j for j in self._retired if not j.busy]:
            self._retired.discard(jail)
            task = loop.create_task(jail.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        for setup, jail in list(self._jails.items()) if self._idle > 0 else ():
            if not jail.alive:
                del self._jails[setup]
                if jail.running:
                    self._retired.add(jail)  # closed at the next look, once none of its programs runs
            elif jail.busy:
                continue
            elif (left := jail.last_used + self._idle - now) > 0:
                soonest = min(soonest, left)
            else:
                del self._jails[setup]  # the next get starts another
                task = loop.create_task(jail.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        if self._retired:  # programs of theirs run: looked at again soon, not at the idle time
            soonest = min(soonest, 0.5)
        if self._retired or (self._jails and self._idle > 0):
            self._watch(max(soonest, 0.05))

    def renew(self) -> None:
        """Start new jails at the next calls (the running ones show a working directory made
        again since they started); each running one is closed as soon as none of its programs
        runs (its private /tmp with it)."""
        for jail in self._jails.values():
            if jail.running:
                self._retired.add(jail)
        self._jails.clear()
        if self._retired:
            self._watch(0)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._starting:  # what starts now is closed with the rest (a failure is its callers' to see)
            await asyncio.wait(list(self._starting.values()))
        jails, self._jails = [*self._jails.values(), *self._retired], {}
        self._retired.clear()
        await asyncio.gather(*(j.close() for j in jails), *self._closing)


async def confined(sandboxes: Sandboxes, jails: Jails, build: Callable[[], Awaitable[Sandbox]]) -> tuple[Sandbox, Jail]:
    """The sandbox `build` gives (from `sandboxes`) and its jail (of `jails`), the sandbox set up
    in the jail, as a first call would have them now: the working directory (`rm -rf proj && git
    clone … proj`) or a directory code may write (a cache) made again or removed since the sandbox
    was decided has every sandbox of `sandboxes` built anew and new jails started (the running
    ones show the old directory); a read-only grant replaced or a path made (`Sandbox.stale`) has
    the sandbox built anew, in the same jail (`Sandboxes.get_async`). A grant the jail finds
    changed when it mounts it (a directory made again, a symlink put on its way) has every policy
    decided anew, once, rather than failing every call of the session."""
    await _look_again_if_due()
    box = await build()
    # real paths, none of them followed through a link: one planted since could lead into ollie's
    # own mount, whose requests this very loop would have to answer
    if any(real_identity(path) != identity for path, identity in box.watched):
        sandboxes.clear()
        jails.renew()  # whatever the build says: they show the old directory
        box = await build()  # a refusal is this call's error, and the next's, until it is fixed
    jail = await jails.get(box.policy)
    try:
        await jail.confine(box.confinement)
    except GrantChanged:
        sandboxes.forget(box)
        decide_anew()
        box = await build()
        jail = await jails.get(box.policy)
        await jail.confine(box.confinement)
    return box, jail


def _make_mount_point(path: str) -> None:
    """The directory a jail mounts its view on (every mount of its is read-only: it cannot make one
    there). mkdir, never a stat: were the file server's own mount there, that would be a request to
    this very process."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except OSError:
        pass  # there already, or nowhere to make it: the jail says why it has no view


def _refuse_replaceable_links(policy: Policy) -> None:
    """A jail hides ollie's directories where their paths lead when it starts, and ollie reads its
    configuration (agents with their hooks), its data (the jails' native init) and tool scripts by
    those paths. A symlink on one in a directory the sandbox can write (a dotfile manager's
    `~/.config/ollie -> ...`, a session in $HOME, an agents directory in the project) could be
    pointed elsewhere: the next jail would then hide the wrong place, and ollie read its
    configuration and run its init from the sandbox's choice."""
    for path in [*config.own_paths(), *config.agents_path(), *config.tools_path(), *config.skills_path()]:
        if not _through_symlink(str(path.absolute())):
            continue
        parts = path.absolute().parts
        for n in range(2, len(parts) + 1):
            link = os.path.join(*parts[:n])
            if os.path.islink(link) and policy.writes(os.path.realpath(os.path.dirname(link))):
                raise SandboxError(
                    f"{path} is reached through the symlink {link}, which sandboxed code could "
                    f"replace; set the variable that names it to the real directory "
                    f"({os.path.realpath(path)})"
                )


def _through_symlink(path: str) -> bool:
    """Whether a symlink lies on `path`'s way, up to its first missing part: one system call
    (`openat2` refusing symlinks) where a jail's start would otherwise `lstat` every component of
    each of ollie's paths."""
    try:
        os.close(open_real(path))
    except LinkRefused:
        return True
    except OSError:  # missing (a symlink before the missing part is met first), or no directory
        pass
    return False


_PROTECTED = PYTHON_DIRS  # (a name of its own: tests add a virtualenv of theirs)


def _uv_cache() -> str:
    cache = os.environ.get("UV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv"
    )
    return os.path.realpath(cache) if os.path.isdir(cache) else ""


def hidden_paths() -> tuple[str, ...]:
    """What a jail hides under empty mounts besides /tmp, whatever a policy grants around it: the
    hidden directories (`hidden_dirs`, made now if missing: a jail can only hide, and pin, what
    exists, and sandboxed code must not make an agents directory in the project first) and the
    file server's mount (the jail also hides every mount of ollie's file server, wherever it is)."""
    return tuple(dict.fromkeys([*_made(hidden_dirs()), config.mount_point()]))


def _made(paths: list[str]) -> list[str]:
    """The real paths of `paths`, each made first if missing (a jail can only hide or protect, and
    pin, what exists, and sandboxed code must not make a directory ollie reads first), but for those
    inside one of ollie's own directories (hidden whole) and those nobody may make here."""
    if not paths:
        return []
    own = [os.path.realpath(p) for p in config.own_paths()]
    made = []
    for path in map(Path, paths):
        real = os.path.realpath(path)  # a symlinked config is hidden where it is
        if real not in own and any(real.startswith(o + "/") for o in own):
            continue
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue  # not ours to make (nor, then, the sandbox's)
        made.append(real)
    return made


def read_only_dirs() -> tuple[str, ...]:
    """What a jail keeps read-only whatever a policy grants around it: the Python that starts
    every jail and the user's site-packages and scripts it reads (made if missing, so that code
    in a cwd of $HOME cannot make them first), and the tool script and skill directories (code
    runs and reads them; ollie serves them to every session)."""
    dirs = [str(p) for p in (*config.tools_path(), *config.skills_path())]
    inside_own = [os.path.realpath(p) for p in dirs if os.path.isdir(p)]  # _made leaves those out
    return tuple(dict.fromkeys([*_PROTECTED, *_made(user_site_dirs()), *_made(dirs), *inside_own]))


def directory_within(path: str, bound: str) -> str:
    """A sub-agent's working directory: `path` (absolute, or relative to `bound`) resolved beneath
    `bound` (its parent's cwd, a real path) by descriptor, following no symlink, and neither one of
    ollie's hidden directories nor inside one. Returns the real path read back from the
    descriptor, to be kept and used as it is (every later use refuses a symlink on it); raises
    SandboxError naming why."""
    full = os.path.normpath(os.path.join(bound, os.path.expanduser(path)))
    if full != bound and not full.startswith(bound.rstrip("/") + "/"):
        raise SandboxError(f"{path} is outside {bound}, the working directory it must stay in")
    mount = config.mount_point()  # never looked up: it may be this very process's FUSE mount
    if full == mount or full.startswith(mount.rstrip("/") + "/"):
        raise SandboxError(f"{path} is on ollie's file server's mount {mount}: a sub-agent may not work there")
    try:
        top = open_real(bound)
    except OSError as e:
        raise SandboxError(f"{bound} (the directory {path} must stay in) cannot be opened: {e.strerror}") from None
    try:
        fd = open_real(os.path.relpath(full, bound), beneath=top)
    except LinkRefused:
        raise SandboxError(f"{path} leads through a symlink, which a sub-agent's cwd may not") from None
    except OSError as e:
        raise SandboxError(f"{path}: {e.strerror}") from None
    finally:
        os.close(top)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise SandboxError(f"{path} is not a directory")
        if (hidden := within(fd, identities(hidden_dirs()))) is not None:
            raise SandboxError(
                f"{path} is {'' if identity(fd) in identities([hidden]) else 'inside '}ollie's own directory "
                f"{hidden}, which sandboxed code never sees: a sub-agent may not work there"
            )
        if (kept := within(fd, identities(read_only_dirs()))) is not None:
            raise SandboxError(
                f"{path} lies in {kept}, which every sandbox keeps read-only (the Python that runs ollie, "
                "tool scripts, skills): a sub-agent may not work there"
            )
        return real_path(fd)
    finally:
        os.close(fd)


class Sandboxes:
    """Built sandboxes, cached by policy, directories and the policy files' mtimes."""

    def __init__(self, size: int = 32):
        self._size = size
        self._cache: OrderedDict[tuple, Sandbox] = OrderedDict()
        self._files: dict[str, tuple[Path, Path]] = {}  # policy name -> its files (found once)
        self._building: dict[tuple, asyncio.Future[Sandbox]] = {}

    async def get_async(
        self,
        name: str,
        cwd: str,
        tmpdir: str,
        extra_rox: tuple[str, ...] = (),
        extra_ro: tuple[str, ...] = (),
        extra_rw: tuple[str, ...] = (),
        extra_rwx: tuple[str, ...] = (),
        in_jail: bool = False,
    ) -> Sandbox:
        """The sandbox of a policy for a cwd, built in the builder's thread if it is not yet, or
        built anew if it is `stale`: reading the policy and judging its grants take 2-3 ms, which
        a burst of sessions' first calls would each stall the event loop for, and what they look
        at could lead into ollie's own mount. Calls that come meanwhile share the build.
        `in_jail`: as `Sandbox` takes it."""
        key = self._key(name, cwd, tmpdir, extra_rox, extra_ro, extra_rw, extra_rwx, in_jail)
        box = self._cache.get(key)
        if box is not None and not box.stale:
            self._cache.move_to_end(key)
            return box
        building = self._building.get(key)
        if building is None:
            building = self._building[key] = asyncio.ensure_future(_build_anew(key[:-1], box))
            building.add_done_callback(lambda _: self._building.pop(key, None))
        return self._keep(key, await asyncio.shield(building))

    def _key(self, name: str, *rest: Any) -> tuple:
        files = self._files.get(name) or self._files.setdefault(name, policy_files(name))
        return (name, *rest, tuple(_version(p) for p in files))

    def _keep(self, key: tuple, box: Sandbox) -> Sandbox:
        self._cache[key] = box
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return box

    def forget(self, box: Sandbox) -> None:
        """Build `box`'s sandbox anew at its next `get_async` (a path it grants changed since)."""
        for key in [k for k, b in self._cache.items() if b is box]:
            del self._cache[key]

    def clear(self) -> None:
        self._cache.clear()


async def _build_anew(args: tuple, stale: Sandbox | None) -> Sandbox:
    """`_build`, in the builder's thread; a `stale` sandbox (a path it was decided on changed) is
    kept if a decision now refuses the policy (a link planted on a path it names): it grants no
    more than before, and a new session gets the refusal."""
    try:
        return await off_loop(_build, *args)
    except SandboxError:
        if stale is None or await off_loop(_trees_changed, stale):
            raise  # (kept, it would show a configuration that took a secret, unmasked)
        stale.take_as_is()
        return stale


def _trees_changed(box: Sandbox) -> bool:
    return any(tree_state(path) != seen for path, seen in box.in_trees)


_BUILDER: ThreadPoolExecutor | None = None


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """`fn(*args)` in the builder's thread: whatever reads the file system to decide a sandbox
    (a policy, its paths, a PATH's directories, a program's place), which code working in $HOME
    or a project can point into ollie's own mount: the thread's request is answered, where the
    event loop that serves the mount would wait on itself."""
    return await asyncio.get_running_loop().run_in_executor(_builder(), fn, *args)


def _builder() -> ThreadPoolExecutor:
    """One thread builds every sandbox of the process, one at a time: more would hold the GIL the
    event loop waits for more often, and end no sooner."""
    global _BUILDER
    if _BUILDER is None:
        _BUILDER = ThreadPoolExecutor(1, thread_name_prefix="ollie-sandbox")
    return _BUILDER


def _build(
    name: str,
    cwd: str,
    tmpdir: str,
    extra_rox: tuple[str, ...],
    extra_ro: tuple[str, ...],
    extra_rw: tuple[str, ...],
    extra_rwx: tuple[str, ...],
    in_jail: bool,
) -> Sandbox:
    """A sandbox, on decisions shared by every session of the policy (`_Decisions`): only the
    paths they cannot share (`extra_ro`, a session's own scratch directory; its cwd) decided anew.
    Only in the builder's thread (`off_loop`), the one that touches `_DECISIONS`."""
    if _DECISIONS_STALE.is_set():
        _DECISIONS_STALE.clear()
        while _DECISIONS:
            _DECISIONS.popitem()[1].close()
    key = (name, tmpdir, extra_rox, extra_rw, extra_rwx, tuple(_version(p) for p in policy_files(name)))
    # read for every session: the variables its templates name may have changed since
    policy = load_policy(name, cwd, tmpdir, extra_rox, (), extra_rw, extra_rwx)
    base = _DECISIONS.pop(key, None)
    if base is None or not base.fresh():
        if base is not None:
            base.close()
        base = _Decisions(policy)
    _DECISIONS[key] = base  # the newest last
    budget = _descriptor_budget()
    while len(_DECISIONS) > _DECISIONS_KEPT or (
        len(_DECISIONS) > 1 and sum(len(d.grants) for d in _DECISIONS.values()) > budget
    ):
        _DECISIONS.pop(next(iter(_DECISIONS))).close()
    return base.sandbox(policy, extra_ro, in_jail)


class _Decisions:
    """A policy's grants decided once for every session of the policy (reading the policy and
    judging some fifty paths by descriptor: 2-3 ms), their descriptors kept open; each session's
    sandbox adds its own scratch directory, judged as it would be with the others (against the
    same writable grants), and builds its own Landlock ruleset on the descriptors.
    Each session reads the policy for itself (the variables its templates name may have changed).
    One whose policy reads otherwise (another cwd, another value) shares only the grants that do
    not depend on that: a path its policy names too, reached without a symlink (a grant through
    one is judged against where code may write, the cwd included), and not its cwd; the rest is
    decided anew as it would have been.
    Decisions are only reused while every path the policy names is still what it was: the same
    file (followed as a `stat` follows it), or still missing, and ollie's hidden and read-only
    directories are the same (`fresh`); else decided anew, as a new session always did."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.hidden, self.read_only = identities(hidden_dirs()), identities(read_only_dirs())
        # Before deciding (a path swapped meanwhile is then not fresh); the missing paths as the
        # policy's reading found them (one made since is then granted by the next build).
        self._seen = self._existing() + (None,) * len(policy.missing)
        named = [*(p for key in FS_KEYS for p in policy.paths[key]), *policy.missing]
        self._seen_by_path = dict(zip(named, self._seen, strict=True))
        self.grants = grants.decide(policy, self.hidden, self.read_only)
        self._any_cwd = {(g.key, g.given): g for g in self.grants if not g.linked and g.given != policy.cwd}

    def _existing(self) -> tuple:
        return tuple(as_decided(p) for key in FS_KEYS for p in self.policy.paths[key])

    def _look(self) -> tuple:
        """What each path the policy names is now: a file, or missing (granted once it is made)."""
        return self._existing() + tuple(as_decided(p) for p in self.policy.missing)

    def fresh(self) -> bool:
        """Still what a new decision would be: the same paths, and the same directories hidden
        and kept read-only (ollie's configuration may name others since)."""
        return (
            self._look() == self._seen
            and identities(hidden_dirs()) == self.hidden
            and identities(read_only_dirs()) == self.read_only
        )

    def _named(self, policy: Policy) -> tuple[tuple[str, Decided], ...]:
        """What `policy`'s sandbox takes from the host that none of its calls looks at itself: its
        read-only grants and its paths still missing, as they are now (the shared ones as `fresh`
        just saw them). Not its cwd nor its writable grants, which each call looks at
        (`Sandbox.watched`); nor ollie's own, which the jail finds changed when it mounts them
        (GrantChanged); nor what lies in its cwd, which the cwd's rule covers. And the files given
        as copies (`userconfig.judged_copy`), as they were judged, and the files masked: one the
        host replaced since (`git config --global` renames a new file over ~/.gitconfig) is bare
        in a running jail until a new ruleset masks it again."""
        seen = self._seen_by_path
        in_cwd = policy.cwd.rstrip("/") + "/" if policy.cwd.rstrip("/") else "\0"  # none, or not /
        named = [(key, p) for key in FS_KEYS for p in policy.paths[key]] + [("", p) for p in policy.missing]
        return (
            tuple(
                (p, seen[p] if p in seen else as_decided(p))
                for key, p in named
                if p != policy.cwd and not p.startswith(in_cwd) and p not in policy.own and key not in grants.WRITABLE
            )
            + tuple((copy.source, copy.seen) for copy in policy.copies)
            + tuple((p, as_decided(p)) for p in policy.masked)
        )

    def sandbox(self, policy: Policy, extra_ro: tuple[str, ...], in_jail: bool) -> Sandbox:
        """The sandbox of `policy` (the same policy read for this session: for another cwd, or
        with other values of its templates' variables) with `extra_ro` added (`in_jail`: as
        `Sandbox` takes it)."""
        same = policy.cwd == self.policy.cwd and policy.paths == self.policy.paths
        extra = tuple(p for p in extra_ro if os.path.exists(p))  # as load_policy adds them
        policy = dataclasses.replace(
            policy, paths={**policy.paths, "ro": policy.paths["ro"] + extra}, own=policy.own | frozenset(extra_ro)
        )
        if same:
            shared, rest = self.grants, {"ro": extra}
        else:
            reusable = {k: g for k, g in self._any_cwd.items() if k[1] != policy.cwd and k[1] not in extra}
            shared = [reusable[(k, p)] for k in FS_KEYS for p in policy.paths[k] if (k, p) in reusable]
            rest = {k: tuple(p for p in policy.paths[k] if (k, p) not in reusable) for k in FS_KEYS}
        named = self._named(policy)  # before deciding: a path swapped meanwhile is then seen changed
        mine = grants.decide(dataclasses.replace(policy, paths=rest), self.hidden, self.read_only, writable=shared)
        place = {(key, path): n for key in FS_KEYS for n, path in enumerate(policy.paths[key])}
        try:  # in the policy's order, as one decision gives them (the jail binds them in it)
            box = Sandbox(policy, sorted([*shared, *mine], key=lambda g: place.get((g.key, g.given), 0)), in_jail)
        finally:
            grants.close(mine)
        box.named = named
        _LIVE[id(box)] = box
        return box

    def close(self) -> None:
        grants.close(self.grants)


# Seconds between two looks at the paths the running sessions' sandboxes were decided on
# (`_look_again`): how late a replaced or new grant may reach a running session, and how often code
# that can replace a path other sessions' policies name can make each of them build its sandbox anew.
RECHECK = 5.0
# every sandbox `_Decisions.sandbox` built, by id: its removals may come from any thread, and
# `valuerefs` copies the references at once
_LIVE: weakref.WeakValueDictionary[int, Sandbox] = weakref.WeakValueDictionary()
_LOOKED: dict[str, Decided] = {}  # what the last look saw
_next_look = 0.0


async def _look_again_if_due() -> None:
    """`_look_again`, in the builder's thread (where the sandboxes were decided: a path leading
    into ollie's own mount is answered there, never waited on by the loop that serves it), at most
    once a RECHECK seconds, whichever call comes first."""
    global _next_look
    now = time.monotonic()
    if now < _next_look:
        return
    _next_look = now + RECHECK
    await off_loop(_look_again)


def _look_again() -> None:
    """Mark `stale` every running sandbox one of whose `named` paths is another file now, or was
    made (`ldconfig` replaced /etc/ld.so.cache, a DHCP client /etc/resolv.conf, rustup made
    ~/.cargo/bin), or a configuration in one of the trees it grants changed (masked, or read, as
    a new decision would judge it): it refuses or lacks what a new decision would grant. Each
    path is looked at once (some fifty `stat`s, however many sessions)."""
    global _LOOKED
    forget_trees()  # (the builds this look makes stale list and judge the trees anew)
    looked: dict[str, Decided] = {}
    trees: dict[int, bool] = {}  # whether the configurations of a listing changed, by the listing
    for box in [ref() for ref in _LIVE.valuerefs()]:
        if box is None:
            continue
        for path, decided in box.named:
            if path not in looked:
                looked[path] = as_decided(path)
            if looked[path] != decided:
                box.stale = True
        if (changed := trees.get(id(box.in_trees))) is None:
            changed = trees[id(box.in_trees)] = _trees_changed(box)
        box.stale |= changed
    _LOOKED = looked


_DECISIONS: OrderedDict[tuple, _Decisions] = OrderedDict()
_DECISIONS_KEPT = 16


def _descriptor_budget() -> int:
    """How many descriptors the kept decisions may hold (some seventy each): a quarter of the
    process's limit. An app embedding ollie at the usual soft limit of 1,024 (a test suite giving
    each test a $HOME of its own: a policy decided anew each time) came within fifty of it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft // 4


# Set when a jail found a grant changed that `fresh` may not see (a directory swapped for a
# symlink to itself): the next build decides every policy anew.
_DECISIONS_STALE = threading.Event()


def decide_anew() -> None:
    """Have the next build decide every policy anew: a jail found a grant changed since its
    decision, in a way the decisions' freshness may not see (a directory swapped for a symlink
    to itself), or a file to mask that is not there."""
    _DECISIONS_STALE.set()
    forget_trees()


def _version(path: Path) -> tuple[int, ...]:
    """Which version of a policy file is there: its inode, size and times, the change time
    included (`cp -p`, `rsync -a` and `touch -r` set the modification time back; nothing sets
    the change time)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
