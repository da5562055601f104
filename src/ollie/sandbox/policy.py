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

import base64
import errno
import fnmatch
import hashlib
import itertools
import logging
import os
import re
import resource
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..paths import Decided, decided, identities, resolved
from ..types import ConfigError
from . import gitidentity, overlays, userconfig
from .caches import cache_dir
from .linked import LinkedLayout, linked_installs
from .overlays import Overlay
from .repository import repository_root

log = logging.getLogger(__name__)


class SandboxError(ConfigError):
    """A policy is invalid, or the kernel cannot enforce it."""


# The parts of /etc that programs read: loader, users and groups, name resolution, time, locale,
# terminfo, CA certificates, fontconfig. Not shadow, gshadow, sudoers, ssh host keys or ssl/private.
_ETC = """ld.so.cache ld.so.conf ld.so.conf.d passwd group nsswitch.conf hosts host.conf resolv.conf
    gai.conf services protocols localtime timezone locale.alias locale.conf default/locale mime.types
    magic magic.mime inputrc terminfo ssl/certs ssl/openssl.cnf ca-certificates ca-certificates.conf
    pki/tls/certs os-release lsb-release debian_version perl python3 fonts
    maven/m2.conf maven/logging maven/toolchains.xml chromium.d""".split()  # maven/settings.xml: userconfig


# chromium.d: what Debian's chromium launcher sources (its apikeys are the distribution's own,
# the same on every Debian, not the user's).
# A JDK's configuration (its lib/jvm.cfg and conf/security/java.security are links there on Debian:
# without it javac, Gradle and Maven fail with "Error loading java.security file"), but for its
# management/ (JMX's agent: jmxremote.password is where its passwords go).
def _listing(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


_ETC += sorted(
    f"{jdk}/{name}"
    for jdk in _listing("/etc")
    if jdk.startswith("java-")
    for name in _listing(f"/etc/{jdk}")
    if name != "management"
)

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
    # what ~/.local/bin's programs lead to: `pip install --user`'s packages, npm's with the prefix
    # ~/.local, poetry's and pdm's official installers; npm's documented prefix of your own
    "{HOME}/.local/lib",
    "{HOME}/.local/share/pypoetry/venv",
    "{HOME}/.local/share/pdm/venv",
    "{HOME}/.npm-global",
]
# What toolchains downloaded, read-only (written by a sandbox, they would change the user's own
# builds): a Go or Rust project's dependencies build offline. Not ~/.cargo itself
# (credentials.toml), nor ~/go/src (GOPATH-era projects of the user's own).
_HOME_DOWNLOADS = [
    "{GOMODCACHE}",
    "{GOPATH}/pkg/mod",
    "{HOME}/go/pkg/mod",
    "{CARGO_HOME}/registry",
    "{CARGO_HOME}/git",
    "{HOME}/.cargo/registry",
    "{HOME}/.cargo/git",
    "{HOME}/.m2/repository",  # Maven's artifacts (~/.m2/settings.xml when it holds no password: userconfig)
    "{HOME}/.yarn/berry/cache",  # yarn 4's packages, which Plug'n'Play runs from their zips
]
# What tools keep under your cache that a project's tests run, read and run where they lie (not
# written): in a sandbox, whose $XDG_CACHE_HOME is the cwd's own, none finds it where it looks, and
# getting it again needs the network; each is told where (`told_caches`). The browsers Playwright and
# Puppeteer downloaded; pre-commit's hook environments (its `git commit` hook too); the package
# managers corepack fetched (yarn 4, pnpm by `packageManager`).
_TOLD_CACHES = [
    *("{PLAYWRIGHT_BROWSERS_PATH}", "{XDG_CACHE_HOME}/ms-playwright"),
    *("{PUPPETEER_CACHE_DIR}", "{HOME}/.cache/puppeteer"),
    *("{PRE_COMMIT_HOME}", "{XDG_CACHE_HOME}/pre-commit"),
    *("{COREPACK_HOME}", "{XDG_CACHE_HOME}/node/corepack"),
]
# The virtualenv activated where ollie started, when it lies in a store of virtualenvs (`active_venv`),
# read and run: its `pytest` comes first on the PATH code is given, and the tests import what it holds.
_ACTIVE_ENVS = ["{VENV}"]

_AUTH_FILES = ["{XDG_CONFIG_HOME}/pypoetry/auth.toml"]
# Not for a tool server, beside its network: a project's private packages (the virtualenv activated),
# the private hook repositories pre-commit cloned
_NOT_FOR_TOOLS = [*_ACTIVE_ENVS, "{PRE_COMMIT_HOME}", "{XDG_CACHE_HOME}/pre-commit"]

# The built-in grants left out, rather than refused, when a link code could plant leads there
_OPTIONAL = [*_HOME_TOOLCHAINS, *_HOME_DOWNLOADS, *_TOLD_CACHES, *_ACTIVE_ENVS, "{REPO}"]

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
            *_TOLD_CACHES,
            *_ACTIVE_ENVS,
            # The git work tree a cwd below its root lies in (`repository_root`): git finds its
            # repository, a monorepo's hoisted node_modules/.bin and .venv run.
            "{REPO}",
        ],
        # /proc: ps, /dev/fd and Python need it; Landlock's ptrace rule already hides the environ,
        # memory and fds of every process outside the sandbox.
        "ro": [f"/etc/{p}" for p in _ETC]
        + ["/var/cache/fontconfig", "/proc", "/sys/devices/system/cpu", "/dev/random", "/dev/urandom"]
        + _HOME_DOWNLOADS,
        # /dev/ptmx and /dev/pts: expect's spawn needs a pseudo-terminal.
        "rw": ["/dev/null", "/dev/zero", "/dev/full", "/dev/ptmx", "/dev/pts"],
        # The project and $TMPDIR run what they hold (./configure, make check's ./t, .venv/bin/pytest,
        # node_modules/.bin): refusing it bought nothing, since code runs anything through an
        # interpreter or ld.so. In a jail, /tmp and $TMPDIR are its private tmpfs (granted by the jail).
        # {CACHE}: the cwd's own cache directory, its $XDG_CACHE_HOME (`cache_dir`).
        "rwx": ["{CWD}", "{TMPDIR}", "{CACHE}"],
        "tmpfile": [],
    },
    # dns: with connect_tcp, name resolution too (over TCP port 53: UDP stays refused).
    "network": {"unrestricted": False, "bind_tcp": [], "connect_tcp": [], "unix": False, "dns": True},
    "env": [
        *["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ"],
        # where toolchains are
        *["RUSTUP_HOME", "CARGO_HOME", "NVM_DIR", "GOPATH", "GOROOT", "GOMODCACHE", "JAVA_HOME"],
        *["PLAYWRIGHT_BROWSERS_PATH", "PUPPETEER_CACHE_DIR", "PRE_COMMIT_HOME", "COREPACK_HOME"],
        *["WORKON_HOME", "POETRY_VIRTUALENVS_PATH"],  # where pipenv and poetry keep their virtualenvs
    ],
    "limits": {
        "processes": 512,  # processes and threads alive at once in a session's jail (at least 300)
        "memory": "4G",  # data (heap) of one process, or "unlimited"
        "cpu": 600,  # CPU seconds of one process
        "file_size": "1G",  # the largest file a process may write
        "timeout": 600,  # the most seconds a call may ask for
        "output": "10M",  # output kept of one call, all its stages and branches together
        "parallel": 64,  # branches of one parallel stage
        "tmpdir": "1G",  # size of the private /tmp (which holds $TMPDIR), and of the private /dev/shm
    },
    "general": {"best_effort": False, "repository": True, "cache": True},
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
        # found and run, with the server's network and its secrets; nor what `_NOT_FOR_TOOLS` names
        # (the server's own installation is added)
        "rox": [p for p in DEFAULT_POLICY["filesystem"]["rox"] if p != "{REPO}" and p not in _NOT_FOR_TOOLS],
        # nor the toolchains' downloads: the private modules and crates of every project of yours,
        # which a server's network would carry off
        "ro": [*(p for p in DEFAULT_POLICY["filesystem"]["ro"] if p not in _HOME_DOWNLOADS), "{CWD}"],
        "rwx": ["{TMPDIR}"],
    },
    "network": {**DEFAULT_POLICY["network"], "unrestricted": True},
    "env": [v for v in DEFAULT_POLICY["env"] if v not in ("HOME", "GOMODCACHE")],
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
    "general": ("best_effort", "repository", "cache"),
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
    environments: tuple[str, ...]  # the virtualenv activated (`active_venv`), as the templates expand
    cache: str  # the cwd's cache directory, its code's $XDG_CACHE_HOME (`cache_dir`; "" for none)
    git_config: str  # its git's global config, the user's identity alone (`gitidentity`; "" for the real one)
    copies: tuple[userconfig.Copy, ...]  # tools' configurations given as copies of what was judged
    # the paths looked at for the configurations in the trees it grants (`userconfig.IN_TREES`),
    # each as it was before it was judged (`tree_state`), the real paths a jail masks, and the
    # patterns whose matches it masks (of a directory ollie could not list: its real path, the
    # glob of its entries, the file's path in each)
    in_trees: tuple[tuple[str, Decided], ...]
    masked: tuple[str, ...]
    unlisted: tuple[tuple[str, str, str], ...]
    # the directories of versions hidden whole: more configurations with secrets than a jail masks
    masked_dirs: tuple[str, ...]
    linked: tuple[str, ...]  # the cwd's installs hard-linked from a shared store (`linked_installs`): read-only
    overlays: tuple[Overlay, ...]  # your caches seen copy-on-write in the cwd's cache (`overlays.py`)
    shared: tuple[str, ...]  # granted writable to every session (the memory, the plans): no symlinks there
    own: frozenset[str]  # ollie's own grants (tools, scratch, memory, plans): shown from under its hidden directories
    optional: frozenset[str]  # built-in grants left out, rather than refused, when a planted symlink leads there
    paths: dict[str, tuple[str, ...]]  # a FS_KEYS name → absolute existing paths
    missing: tuple[str, ...]  # the paths it names that did not exist (granted once they do)
    unrestricted_net: bool
    unix_sockets: bool  # may connect AF_UNIX sockets to any path, unsupervised (false: only the jail's own)
    bind_tcp: tuple[int, ...]
    connect_tcp: tuple[int, ...]  # with `dns`, port 53 among them
    dns: bool  # names resolve over TCP (RES_OPTIONS=use-vc): connect_tcp's obvious use needs it
    env: tuple[str, ...]  # variable names or fnmatch patterns
    limits: Limits
    best_effort: bool

    def writes(self, path: str) -> bool:
        """Whether sandboxed code may write `path` (a real path) under this policy."""
        return _writes(self.paths, path)

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
    copied: bool = True,
) -> Policy:
    """Read, validate and expand the policy `name` for a call running in `cwd` ("" for `tmpdir`
    drops the policy's `{TMPDIR}` entries: a jail grants its private /tmp itself). The extra paths
    are ollie's own grants on top (tool script directories; the memory and the plans, `extra_rw`,
    shared by every session; a tool server's cache, `extra_rwx`). `program_rox` are what a tool
    server's program needs to read and run: granted as the policy's own entries are, and judged
    as they are (never one of ollie's hidden directories). `copied`: the tools' configurations
    given as copies (`userconfig.COPIED`); a tool server, whose $HOME is its own, reads none."""
    if why := missing_policy(name):
        raise SandboxError(why)
    global_file, named_file = policy_files(name)
    raw: dict[str, Any] = BUILTIN.get(name, DEFAULT_POLICY)
    for path in (global_file, named_file):
        raw = _overlay(raw, _read_policy_file(path))
    general = {key: raw["general"].get(key, True) for key in ("repository", "cache")}
    for key, value in general.items():
        if not isinstance(value, bool):
            raise SandboxError(f"sandbox general.{key} must be true or false, got {value!r}")
    entries = [entry for key in FS_KEYS for entry in raw["filesystem"][key]]
    values = _template_values(
        cwd,
        tmpdir,
        repository=general["repository"] and any("{REPO}" in entry for entry in entries),
        cache=general["cache"] and any("{CACHE}" in entry for entry in entries),
    )
    named = {key: _expand_paths(raw["filesystem"][key], values, f"filesystem.{key}") for key in FS_KEYS}
    # the tools' configurations judged free of secrets, before ollie's own grants (as a shared
    # decision orders them: a session's own come last)
    configs = _expand_paths(list(userconfig.CONFIGS), values, "filesystem.ro")
    judged = [p for p in configs if os.path.exists(p) and userconfig.secret_free(p)]
    named_files = [f for p in judged for f in userconfig.files_named(p)]
    configs += tuple(named_files)  # optional as the configurations are: reached through a planted link, left out
    named["ro"] += tuple(dict.fromkeys([*judged, *named_files]))
    venvs: tuple[str, ...] = ()  # (not for a tool server, which only reads the cwd: private packages)
    if cwd and any("{CWD}" in e for e in raw["filesystem"]["rwx"] + raw["filesystem"]["rox"]):
        venvs = tuple(project_venvs(os.environ, values["HOME"], cwd))
    named["rox"] += venvs
    named["rox"] += extra_rox + program_rox
    named["ro"] += extra_ro
    named["rw"] += extra_rw
    named["rwx"] += extra_rwx
    own_paths = [tmpdir, values["CACHE"]]
    paths = {key: tuple(dict.fromkeys(p for p in named[key] if os.path.exists(p))) for key in FS_KEYS}
    # (not the cwd's grant: a session gone to $HOME keeps the identity its jail's masks need, below)
    git_config = gitidentity.global_config(tuple(p for key in FS_KEYS for p in paths[key] if p != cwd))
    if git_config and git_config != os.devnull:  # its directory: the identities its includeIfs name
        paths["ro"] += (os.path.dirname(git_config),)
        own_paths.append(os.path.dirname(git_config))
    # missing ones too (/dev/null, seen as none): the look that finds one made gives it, as changed
    sources = [
        (source, variable)
        for template, variable in (userconfig.COPIED if copied else ())
        for source in _expand_paths([template], values, "filesystem.ro")
    ]
    # where code may write, and so plant a symlink: its writable grants, its cwd, $HOME (as `grants`)
    writable = [*paths["rw"], *paths["rwx"], *paths["tmpfile"], *filter(None, (cwd, os.path.expanduser("~")))]
    planted = identities(writable) if sources else {}
    copies = tuple(userconfig.judged_copy(source, variable, planted) for source, variable in sources)
    for copy in copies:  # each in a directory of its own
        if copy.path != os.devnull:
            paths["ro"] += (os.path.dirname(copy.path),)
            own_paths.append(os.path.dirname(copy.path))
    in_venvs = tuple(f"{v}/{f}" for v in venvs if not any(c in v for c in "*?[") for f in userconfig.VENV_FILES)
    in_trees, masked, unlisted, masked_dirs = _in_trees(values, in_venvs)
    if git_config:  # libgit2 (`cargo new`, cargo's git dependencies) reads the user's global config,
        # whatever GIT_CONFIG_GLOBAL says, and dies on one it may not read: masked, it reads as empty;
        # not one code may write (a dotfiles project's), which would read empty and write nowhere
        masked = (*masked, *(c for c in gitidentity.user_configs() if not _writes(paths, c)))
    # poetry reads its auth.toml (its repositories' passwords, where no keyring holds them) at
    # every start, and dies on one it may not read: masked, it reads as none
    auth = [a for a in _expand_paths(_AUTH_FILES, values, "") if os.path.isfile(a) and not _writes(paths, a)]
    masked = (*masked, *auth)
    net = raw["network"]
    unrestricted = bool(net.get("unrestricted") or net.get("enabled"))  # `enabled`: the Go name
    connect = _ports(net.get("connect_tcp"), "network.connect_tcp")
    dns = bool(connect) and not unrestricted and bool(net.get("dns", True))
    return Policy(
        name=name,
        cwd=cwd,
        repo=values["REPO"],
        cache=values["CACHE"],
        git_config=git_config,
        copies=copies,
        in_trees=in_trees,
        masked=masked,
        unlisted=unlisted,
        masked_dirs=masked_dirs,
        linked=_linked(cwd),
        overlays=_overlays(values, paths, [*masked, *masked_dirs, *(where for where, _, _ in unlisted)]),
        shared=tuple(p for p in extra_rw if os.path.exists(p)),
        own=frozenset([*extra_rox, *extra_ro, *extra_rw, *extra_rwx, *(os.path.normpath(p) for p in own_paths if p)]),
        optional=frozenset([*_expand_paths(_OPTIONAL, values, ""), *configs, *venvs]),
        environments=_expand_paths(_ACTIVE_ENVS, values, ""),
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


def _linked(cwd: str) -> tuple[str, ...]:
    try:
        return linked_installs(cwd) if cwd else ()
    except LinkedLayout as e:
        raise SandboxError(f"the sandbox cannot keep a shared store's links read-only here: {e}") from None


def _writes(paths: dict[str, tuple[str, ...]], path: str) -> bool:
    return any(
        path == p or path.startswith(p.rstrip("/") + "/")
        for key in ("rw", "rwx", "tmpfile")
        for p in map(os.path.realpath, paths[key])
    )


def _limits(raw: dict[str, Any]) -> Limits:
    values = {}
    for key in _LIMIT_KEYS:
        value = raw[key]
        if key == "memory" and str(value).strip().lower() == "unlimited":
            value = resource.RLIM_INFINITY  # sanitizers reserve terabytes of shadow, which the limit counts
        elif key in _SIZE_LIMITS:
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
        also = " (or unlimited)" if where == "limits.memory" else ""
        raise SandboxError(f"sandbox {where} must be a size such as 512M or 2G{also}, got {value!r}")
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


def _template_values(cwd: str, tmpdir: str, repository: bool = True, cache: bool = True) -> dict[str, str]:
    home = os.path.expanduser("~")
    env = os.environ
    return {
        **env,
        "CWD": cwd,
        "REPO": repository_root(cwd, home) if repository and cwd else "",
        "CACHE": cache_dir(cwd) if cache and cwd else "",
        "HOME": home,
        "VENV": active_venv(env, home, cwd),
        # (Playwright's 0 says its browsers lie in the project's node_modules)
        **{v: _given_dir(env, v) for v in told_caches()},
        "TMPDIR": tmpdir,
        **_xdg(env, home),
        "OLLIE_CFG_PATH": str(config.cfg_path()),
        "OLLIE_DATA_PATH": str(config.data_path()),
        "OLLIE": str(config.mount_path()),
    }


def _overlays(values: Mapping[str, str], paths: dict[str, tuple[str, ...]], masked: list[str]) -> tuple[Overlay, ...]:
    """Your caches that code sees at their places in the cwd's cache, copy-on-write; none holding
    one of ollie's hidden directories or the files masked (an overlay shows what lies beneath)."""
    if not values["CACHE"]:
        return ()
    kept_out = [*config.hidden_dirs(), str(config.mount_point()), *masked]
    # ("" for a link swapped meanwhile: every path counts as written, and no overlay is given)
    writable = [real for key in ("rw", "rwx", "tmpfile") for p in paths[key] for real in (p, resolved(p))]
    return overlays.decide(values["CACHE"], os.environ, values["HOME"], values, writable, kept_out)


def _given_dir(env: Mapping[str, str], variable: str, default: str = "") -> str:
    """The directory `variable` names when it is an absolute path (as the XDG spec ignores a
    relative one: a grant relative to ollie's own directory would be no one's), else `default`."""
    value = env.get(variable, "")
    return value if os.path.isabs(value) else default


def _xdg(env: Mapping[str, str], home: str) -> dict[str, str]:
    """The XDG base directories, as the user's tools find them."""
    defaults = {"CONFIG": ".config", "DATA": ".local/share", "CACHE": ".cache", "STATE": ".local/state"}
    return {f"XDG_{k}_HOME": _given_dir(env, f"XDG_{k}_HOME", f"{home}/{d}") for k, d in defaults.items()}


def told_caches() -> dict[str, str]:
    """Where tools keep what a project's tests run (`_TOLD_CACHES`) by the variable that tells each
    where to look: in a sandbox Playwright, pre-commit and corepack would look under
    `$XDG_CACHE_HOME` (the cwd's own cache), Puppeteer under a tool server's `$HOME`."""
    home = os.path.expanduser("~")
    cache = _xdg(os.environ, home)["XDG_CACHE_HOME"]
    return {
        "PLAYWRIGHT_BROWSERS_PATH": f"{cache}/ms-playwright",
        "PUPPETEER_CACHE_DIR": f"{home}/.cache/puppeteer",
        "PRE_COMMIT_HOME": f"{cache}/pre-commit",
        "COREPACK_HOME": f"{cache}/node/corepack",
    }


def active_venv(env: Mapping[str, str], home: str, cwd: str) -> str:
    """`$VIRTUAL_ENV` when it is a virtualenv (a pyvenv.cfg there) that lies in a store of them
    (virtualenvwrapper's `$WORKON_HOME` or `~/.virtualenvs`, pipenv's, poetry's, pdm's, hatch's:
    none at `$HOME` or above it) and outside the cwd (`cwd`, a real path: the cwd grants it). Not
    one in a project, whose sessions' code writes it: every other session would run what that
    code planted there (a `git` first on the PATH). Nor a conda env: a base one holds every env
    and the variables each keeps. "" otherwise: the grants naming it drop."""
    path = env.get("VIRTUAL_ENV", "")
    if not os.path.isabs(path) or not os.path.isfile(os.path.join(path, "pyvenv.cfg")):
        return ""
    real = os.path.realpath(path).rstrip("/") + "/"
    homes = [os.path.realpath(home).rstrip("/") + "/", home.rstrip("/") + "/"]
    data = _xdg(env, home)["XDG_DATA_HOME"]
    stores = [*venv_stores(env, home), f"{home}/.virtualenvs", f"{data}/pdm/venvs"]
    for store in (os.path.realpath(s).rstrip("/") + "/" for s in stores):
        if real.startswith(store) and not any(h.startswith(store) for h in homes):
            return "" if cwd and real.startswith(cwd.rstrip("/") + "/") else path
    return ""


def venv_stores(env: Mapping[str, str], home: str) -> tuple[str, str, str]:
    """Where poetry, pipenv and hatch keep the virtualenvs they make for projects."""
    xdg = _xdg(env, home)
    return (
        _given_dir(env, "POETRY_VIRTUALENVS_PATH", f"{xdg['XDG_CACHE_HOME']}/pypoetry/virtualenvs"),
        _given_dir(env, "WORKON_HOME", f"{xdg['XDG_DATA_HOME']}/virtualenvs"),
        f"{xdg['XDG_DATA_HOME']}/hatch/env",
    )


def project_venvs(env: Mapping[str, str], home: str, cwd: str) -> list[str]:
    """The virtualenvs poetry, hatch and pipenv made in their stores for the project at `cwd` (a
    real path), found by the name each gives one (a hash of the project's path: `poetry install`
    on the host, then `poetry run pytest` in the sandbox), each a pyvenv.cfg's; and what each
    tool reads beside them (poetry's record of each project's Python, hatch's of the project's
    environments). Never another project's."""
    poetry, pipenv, hatch = venv_stores(env, home)
    venvs, beside = [], []
    if os.path.isfile(f"{cwd}/pyproject.toml"):  # poetry's <name>-<hash>-py3.X, hatch's <name>/<hash>/<env>
        digest = base64.urlsafe_b64encode(hashlib.sha256(cwd.encode()).digest()).decode()[:8]
        named = re.compile(rf".+-{re.escape(digest)}-py\d+\.\d+").fullmatch
        venvs += [f"{poetry}/{n}" for n in _store(poetry) if named(n)]
        hatched = [f"{hatch}/virtual/{p}/{digest}" for p in _store(f"{hatch}/virtual")]
        venvs += [f"{h}/{e}" for h in hatched for e in _store(h)]
        beside += [f"{poetry}/envs.toml", f"{hatch}/.metadata/{digest}"]
    if os.path.isfile(f"{cwd}/Pipfile"):  # pipenv's <name>-<hash>
        end = "-" + base64.urlsafe_b64encode(hashlib.sha256(f"{cwd}/Pipfile".encode()).digest()[:6]).decode()
        venvs += [f"{pipenv}/{n}" for n in _store(pipenv) if n.endswith(end)]
    venvs = sorted(v for v in venvs if os.path.isfile(f"{v}/pyvenv.cfg"))
    return venvs + [b for b in beside if os.path.exists(b)] if venvs else []  # (each dies on one unread)


STORE_LISTED = 4096  # entries of a store of virtualenvs looked at, at most


def _store(path: str) -> list[str]:
    """The names in the directory `path` ([] if none), the first STORE_LISTED of them: a store that
    code working in $HOME filled with a million entries would hold every session's build (one
    thread builds them all) at each start of a session of the project."""
    try:
        with os.scandir(path) as entries:
            return [e.name for e in itertools.islice(entries, STORE_LISTED)]
    except OSError:
        return []


# Entries that name no variable nor ~, as they expand (most of a policy: read at every session's start)
_PLAIN: dict[str, str] = {}


def _expand_paths(entries: list[str], values: dict[str, str], where: str) -> tuple[str, ...]:
    out = []
    for entry in entries:
        if (plain := _PLAIN.get(entry)) is not None:
            out.append(plain)
            continue
        names = _TEMPLATE.findall(entry)
        if any(not values.get(n) for n in names):
            continue  # an unset variable would silently widen the path (e.g. "{X}/" → "/")
        path = os.path.expanduser(_TEMPLATE.sub(lambda m: values[m.group(1)], entry))
        if not os.path.isabs(path):
            raise SandboxError(f"sandbox {where}: {entry!r} is not an absolute path")
        out.append(os.path.normpath(path))
        if not names and not entry.startswith("~") and len(_PLAIN) < 4096:
            _PLAIN[entry] = out[-1]
    return tuple(dict.fromkeys(out))


# The configurations in the trees as the last listing found them, by the templates as expanded:
# when, each path as it was (`tree_state`; missing ones too, and each glob's directory), the real
# paths to mask, and the patterns whose matches to mask (of a directory ollie could not list).
# Listed and judged again after so many seconds, or once the look at the running sandboxes' paths
# has run (`forget_trees`): every session's start reads the policy, 500 at once. Every sandbox
# built meanwhile holds the same tuple, which the look looks at once.
_Listing = tuple[tuple[tuple[str, Decided], ...], tuple[str, ...], tuple[tuple[str, str, str], ...], tuple[str, ...]]
_IN_TREES: dict[tuple[str, ...], tuple[float, _Listing]] = {}
_IN_TREES_KEPT = 5.0
_forgotten = 0  # how many times `forget_trees` ran: a listing begun before one is not kept


def _in_trees(values: dict[str, str], extra: tuple[str, ...] = ()) -> _Listing:
    """The paths `userconfig.IN_TREES` lead to (and the `extra` paths), each as it was before it
    was judged; the real paths a jail masks; and the patterns whose matches it masks (`_judged_in`)."""
    patterns = _expand_paths(list(userconfig.IN_TREES), values, "the configurations in the trees") + extra
    now, forgotten = time.monotonic(), _forgotten
    known = _IN_TREES.get(patterns)
    if known is None or now - known[0] >= _IN_TREES_KEPT:
        watched: dict[str, Decided] = {}
        masked: dict[str, None] = {}
        unlisted: dict[tuple[str, str, str], None] = {}
        masked_dirs: dict[str, None] = {}
        for pattern in patterns:
            _judged_in(pattern, watched, masked, unlisted, masked_dirs)
        masked = {path: None for path in masked if not any(path.startswith(d + "/") for d in masked_dirs)}
        known = (now, (tuple(watched.items()), tuple(masked), tuple(unlisted), tuple(masked_dirs)))
        if forgotten == _forgotten:
            if len(_IN_TREES) >= 64:  # ($HOMEs of a test suite's, one each)
                _IN_TREES.clear()
            _IN_TREES[patterns] = known
    return known[1]


def _judged_in(
    pattern: str,
    watched: dict[str, Decided],
    masked: dict[str, None],
    unlisted: dict[tuple[str, str, str], None],
    masked_dirs: dict[str, None],
) -> None:
    """`pattern`'s files (a glob in one of its directories: its file in each directory the glob
    matches, there or not, so that one made later, `npm config set -g`, is seen by the next look),
    each noted in `watched` as it was before it was judged, with the glob's directory (a version
    installed later); the real paths of those holding a secret, and of those ollie may not look at
    (a directory of mode 000: the jail, whose root overrides modes in its namespace, can), added
    to `masked`; a glob's directory ollie cannot list, by its real path, with the glob and the
    file's path in each entry, to `unlisted`, for the jail to mask what it matches (a string would
    be split again at the first star, which the real path may hold). A file is judged by the
    descriptor its path was looked at through, and only if it is `_kept_in` its tree. Past
    MASKS_PER_DIR of a glob's files to mask, its directory goes to `masked_dirs`, for the jail to
    hide whole: code working in $HOME could plant thousands, each a mount or more in every jail."""
    where, glob_part, rest = _GLOB.match(pattern).groups()  # type: ignore[union-attr]
    if glob_part:
        watched[where] = tree_state(where)
        try:
            with os.scandir(where) as entries:
                names = [e.name for e in entries if fnmatch.fnmatchcase(e.name, glob_part)]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError:
            top = os.path.realpath(where)
            if _within_caps(f"{top}/{glob_part}/{rest}"):  # (else as many pins in every jail)
                unlisted[(top, glob_part, rest)] = None
            return
        # each in its own entry of the glob's directory (a version linked elsewhere is not one)
        top = os.path.realpath(where)
        found = [(f"{where}/{name}/{rest}", f"{top}/{name}/", rest.count("/") + 2) for name in names]
    else:
        top = os.path.realpath(os.path.dirname(pattern))
        found = [(pattern, top + "/", 2)]
    here: dict[str, None] = {}
    for path, inside, depth in found:
        _judge_one(path, inside, depth, watched, here)
    if len(here) > MASKS_PER_DIR and _within_caps(top + "/"):
        _warn_once(top, f"holds {len(here)} configurations with secrets: hidden whole in every jail; remove them")
        masked_dirs[top] = None
    else:
        masked.update(here)


def _judge_one(path: str, inside: str, depth: int, watched: dict[str, Decided], masked: dict[str, None]) -> None:
    """One file of `_judged_in`, judged by the descriptor its path was looked at through."""
    try:
        at = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        watched[path] = None
        if e.errno == errno.EACCES and (real := _kept_in(os.path.realpath(path), inside, depth)):
            masked[real] = None  # not ours to look at
        return  # missing, or a loop of links: nothing reads it there
    try:  # what was looked at is what is judged: a link swapped in meanwhile leads nowhere new
        st = os.fstat(at)
        watched[path] = _state(st)  # before judging
        # (a regular file here: one that is none when read is not secret-free either)
        if not stat.S_ISREG(st.st_mode):
            return
        try:
            real = _kept_in(os.readlink(f"/proc/self/fd/{at}"), inside, depth)
            masks = _within_caps(real)
        except OSError:  # a real path past PATH_MAX
            real, masks = path, False
        if not real or userconfig.secret_free(real, at):
            return
        if not masks:  # (fails open, but says so: was the tree moved there by code?)
            _warn_once(real, "holds a secret but lies too deep to mask: sandboxed code reads it")
            return
        _warn_of_other_names(at, real)
        masked[real] = None
    except OSError:
        return
    finally:
        os.close(at)


MASKS_PER_DIR = 32  # configurations with secrets a glob's directory has masked one by one (as jaild's)
_MASK_DEPTH = 48  # directories above a file judged at most: as many pins in every jail that masks it
_PATH_MAX = 4096


def _kept_in(real: str, inside: str, depth: int) -> str:
    """`real` (a file's real path) if it lies `inside` its tree (the real path of its version's
    directory, for a glob: its entry of the glob's directory, not where a link of it leads), at
    most `depth` levels below, and not on ollie's own mount; else "". Code that may write the tree
    (or a project's under /opt) could link the file, or a version, to any file ollie reads, for
    ollie to mask it (the shell, a JDK's java), or to learn from the mask what it holds; down a
    chain of thousands of directories, for as many pins in every jail; or into the server's mount,
    which a jail hides."""
    if not real.startswith(inside) or real.count("/") - inside.count("/") >= depth:
        return ""
    mount = config.mount_point()
    return "" if real == mount or real.startswith(mount + "/") else real


def _within_caps(real: str) -> bool:
    """Whether a file at `real` can be masked: no deeper than _MASK_DEPTH (as many pins in every
    jail) and shorter than PATH_MAX (a jail masks by path)."""
    return real.count("/") <= _MASK_DEPTH and len(os.fsencode(real)) < _PATH_MAX


_WARNED: set[tuple[str, int]] = set()  # (path, inode) told of once (0: `_warn_once`'s, not a second name's)


def _warn_once(path: str, what: str) -> None:
    if (path, 0) not in _WARNED:
        _WARNED.add((path, 0))
        log.warning("%s %s", path, what)


def _warn_of_other_names(at: int, path: str) -> None:
    """A file holding a secret with other names (a hard link made while it held none, which edits
    in place keep): masked here, it is read there, where code may read. (`at`: the file.)"""
    st = os.fstat(at)
    if st.st_nlink > 1 and (path, st.st_ino) not in _WARNED:
        _WARNED.add((path, st.st_ino))
        log.warning(
            "%s holds a secret and has %d names (hard links): masked there, it is read at the others; "
            "find them (`find / -xdev -samefile %s`) and remove them",
            path,
            st.st_nlink,
            path,
        )


def tree_state(path: str) -> Decided:
    """What a path of the trees was (`as_decided`), a directory with its change time: a version
    installed or removed since."""
    try:
        return _state(os.stat(path))
    except OSError:
        return None


def _state(st: os.stat_result) -> Decided:
    return (st.st_dev, st.st_ino, st.st_mtime_ns) if stat.S_ISDIR(st.st_mode) else decided(st)


def forget_trees() -> None:
    """Have the next policy read list and judge the configurations in the trees anew."""
    global _forgotten
    _forgotten += 1
    _IN_TREES.clear()


_GLOB = re.compile(r"(/.*?)/([^/]*\*[^/]*)/(.*)|.*")  # a directory, a glob in the next, what follows


def _ports(value: Any, where: str) -> tuple[int, ...]:
    value = value or []
    if not isinstance(value, list) or not all(type(p) is int and 0 <= p <= 65535 for p in value):
        raise SandboxError(f"sandbox {where} must be a list of port numbers (0-65535), got {value!r}")
    return tuple(value)
