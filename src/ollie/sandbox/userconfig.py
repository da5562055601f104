"""The configuration files of the user's tools that sandboxed code may read: those that hold no
secret. Some tools die on a configuration they may not read (cargo on `~/.cargo/config.toml`,
yarn on `~/.npmrc`) or lose its settings (pip its index and certificates); the same files often
hold a registry's token. Each is read here first, in the builder's thread, and granted read-only
only when nothing in it looks like a secret (`_SECRET`). A file that a tool of the user's writes a
token into in place (`npm login`, ~/.npmrc) is granted as a copy of what was judged, in ollie's data
(`COPIED`, `judged_copy`): a token written there later never shows to code, running or not."""

from __future__ import annotations

import configparser
import hashlib
import logging
import os
import re
import sys
from typing import NamedTuple

from .. import config
from ..paths import Decided, Identity, as_decided, decided, identities, open_regular, write_new
from ..types import ConfigError

log = logging.getLogger(__name__)

LIMIT = 64 << 10  # a larger configuration is not read, nor granted
# What a secret looks like anywhere in a line (a key, an inline table's key, a value): a word that
# names one (a shell's MYSQL_PWD, SSHPASS, BORG_PASSPHRASE and STRIPE_KEY too, not its $PWD; an
# Authorization header; hatch's `auth =`, yarn's npmAuthIdent), a private key, a token's
# well-known prefix, cargo's env table (variables for builds) in any of TOML's spellings ([env],
# [env.KEY], env.KEY =, env = {…}, quoted), a password before an @ (user:password@host; a user
# alone is one only in a URL, below: an email or git@github.com is none), an escape that could
# spell one (TOML's and JSON's \u, TOML 1.1's \x). Leaving out a harmless file costs little. (Each
# run of a name is tried once, from its start, possessively, and a line's start skips blanks
# within the line only: linear in the file, blank lines included.)
_SECRET = re.compile(
    r"token|passw|pass\b|passphrase|(?<![${(`])(?<!old)pwd\b|pswd|_pw\b|secret|_auth|\bauth[ \t]*[=:]"
    r"|credential|creds\b|npmauth|api[-_]?key|[_-]key\b|private key|authori[sz]ation|bearer\b|extraheader|httpheaders"
    r"|\\u[0-9a-f]{4}|\\x[0-9a-f]{2}|^[ \t]*\[?[ \t]*[\"']?env[\"']?[ \t]*[.=\]]"
    r"|(?<![^\s/@:=\"'])[^\s/@:=\"']++:[^\s/@:\"']*+@[\w.-]",
    re.IGNORECASE | re.MULTILINE,
)
# Tokens by their well-known prefixes, looked for before anything is left out (`_NAMED_NOT_HELD`):
# GitHub's, GitLab's, PyPI's, Slack's, AWS's, Google's, Hugging Face's, Stripe's and OpenAI's, npm's.
_PREFIXES = re.compile(
    r"gh[posur]_|github_pat_|glpat-|pypi-[\w-]{32}|xox[abp]-|AKIA|AIza|\bhf_\w{20}|\bsk_(?:live|test)_|\bsk-[\w-]{16}"
    r"|\bnpm_\w{30}"
)
# A URL, to its first blank: its user (user:password@ before the host, whatever follows), a query
# (a SAS signature's sig=, a key=) and a long run of letters mixed with digits in its path or host
# are secrets (a registry's token in the path: Gemfury's, Cloudsmith's; a Slack webhook's), but
# for a digest's length of lower-case hex (a wheel's in PyPI's file URLs, a commit) and ssh's user
# alone (ssh://git@github.com/: ssh signs in with a key).
_URL = re.compile(r"([a-z][a-z0-9+.-]*+)://(\S*+)", re.IGNORECASE)
_TOKEN_LIKE = 16  # letters and digits in a row, both
_DIGEST = re.compile(r"[0-9a-f]{40,}").fullmatch


def _secret_url(scheme: str, rest: str) -> bool:
    """Whether a URL (its scheme, and what follows the scheme's //) carries a secret."""
    authority, _, path = rest.partition("/")
    user, at, _ = authority.rpartition("@")
    if at and not (scheme.lower().endswith("ssh") and ":" not in user):
        return True
    if "=" in rest.partition("?")[2] or "?" in authority:
        return True
    runs = re.split(r"[^A-Za-z0-9]+", f"{authority}/{path}")
    return any(len(run) >= _TOKEN_LIKE and not run.isalpha() and not run.isdigit() and not _DIGEST(run) for run in runs)


# What is left out before the search, being no secret though it names one: cargo's choice of its
# built-in credential providers (`global-credential-providers = ["cargo:token"]`, as cargo's docs
# recommend; a provider that is a command of the user's may carry arguments, and stays judged);
# the placeholders of Maven's own settings.xml (every distribution's /etc/maven/settings.xml),
# whose comments show a proxy and a server with these in place of their secrets, word for word;
# git's `[credential]` sections (their URL judged) and a helper named by a word (`helper = cache`).
_NAMED_NOT_HELD = re.compile(
    r"^[ \t]*(?:[\w.-]+\.)?(?:global-credential-providers|credential-provider)[ \t]*=[ \t]*"
    r'(?:\[\s*(?:"cargo:[a-z-]+"\s*,\s*)*(?:"cargo:[a-z-]+"\s*)?\]|"cargo:[a-z-]+")[ \t]*$'
    r"|^[ \t]*(?:<password>(?:proxypass|repopwd)</password>|<privateKey>/path/to/private/key</privateKey>"
    r"|<passphrase>optional; leave empty if not used.</passphrase>"
    r"|\| NOTE: You should either specify username/password OR privateKey/passphrase, since these pairings are)"
    r"[ \t]*$"
    # git's credential helpers, named: which helper holds no secret (an inline one is judged)
    r'|(?<=\[)credential(?=(?:[ \t]+"[^"\n]*")?\][ \t]*$)|^[ \t]*helper[ \t]*=[ \t]*[\w./-]+[ \t]*$',
    re.MULTILINE | re.IGNORECASE,
)

SYSTEM_GITCONFIG = "/etc/gitconfig"

# The files, by template, as a policy names paths.
CONFIGS = (
    "{CARGO_HOME}/config.toml",
    "{CARGO_HOME}/config",
    "{HOME}/.cargo/config.toml",
    "{HOME}/.cargo/config",
    "{XDG_CONFIG_HOME}/pip/pip.conf",
    "{HOME}/.pip/pip.conf",
    "/etc/pip.conf",
    "/etc/xdg/pip/pip.conf",  # the file alone (and what it names: `files_named`), not its directory
    # a login shell's (`bash -l`, `bash -lc` as some tools run commands): where an admin may export a
    # proxy with its password; /etc/profile.d stays out (its scripts are skipped, unreadable)
    "/etc/profile",
    "/etc/bash.bashrc",
    # git's system configuration (an image's `git config --system url."https://$TOKEN@…".insteadOf`;
    # refused, it is not read: GIT_CONFIG_NOSYSTEM)
    SYSTEM_GITCONFIG,
    # Maven stops on a settings.xml it may not read ("Non-readable settings"); they list its servers'
    # and proxies' passwords, when they hold any
    "/etc/maven/settings.xml",
    "{HOME}/.m2/settings.xml",
    # poetry's, pdm's and uv's, and yarn's (which yarn and poetry die on, unreadable; pdm and uv
    # lose their settings): index URLs and repositories, with their tokens when they hold any
    "{XDG_CONFIG_HOME}/pypoetry/config.toml",
    "{XDG_CONFIG_HOME}/pdm/config.toml",
    "{XDG_CONFIG_HOME}/uv/uv.toml",
    "{XDG_CONFIG_HOME}/hatch/config.toml",  # (hatch writes one at its first run, and dies on it unread)
    "{HOME}/.yarnrc",
    "{HOME}/.yarnrc.yml",
    # git's global ignore and attributes, read without a word of config: git stops on an ignore file
    # it may not read ("cannot use … as an exclude file"), so `git status` failed in every project
    "{XDG_CONFIG_HOME}/git/ignore",
    "{XDG_CONFIG_HOME}/git/attributes",
    "{HOME}/.config/git/ignore",
    "{HOME}/.config/git/attributes",
)


# What a virtualenv holds that its users put keys in: its pip.conf, the activate script a plain
# venv's users append exports to, virtualenvwrapper's hooks.
VENV_FILES = (
    "pip.conf",
    *(f"bin/{script}" for script in ("activate", "preactivate", "postactivate", "predeactivate", "postdeactivate")),
    "bin/get_env_details",
)
_INSTALLER_VENVS = ("{HOME}/.local/share/pypoetry/venv", "{HOME}/.local/share/pdm/venv")
_NPMRCS = ("etc/npmrc", "lib/node_modules/npm/npmrc")

# The configurations toolchains keep inside their own trees, which a policy grants whole (~/.nvm,
# ~/.pyenv, ~/.sdkman, /usr, /opt), by template and glob: npm's global and built-in npmrc, a
# Python's site pip.conf, a Maven's settings.xml, a Gradle's gradle.properties, conda's condarc.
# One not `secret_free` is masked in a jail (read as /dev/null reads) rather than its tree refused.
IN_TREES = (
    "{NVM_DIR}/versions/node/*/etc/npmrc",
    "{HOME}/.nvm/versions/node/*/etc/npmrc",
    "{NVM_DIR}/versions/node/*/lib/node_modules/npm/npmrc",
    "{HOME}/.nvm/versions/node/*/lib/node_modules/npm/npmrc",
    "/usr/etc/npmrc",
    "/usr/local/etc/npmrc",
    "/usr/lib/node_modules/npm/npmrc",
    "/usr/local/lib/node_modules/npm/npmrc",
    "/opt/*/etc/npmrc",
    "{PYENV_ROOT}/versions/*/pip.conf",
    "{HOME}/.pyenv/versions/*/pip.conf",
    "{HOME}/.local/share/uv/python/*/pip.conf",
    "{HOME}/.local/share/pipx/venvs/*/pip.conf",
    f"{sys.prefix}/pip.conf",
    f"{sys.base_prefix}/pip.conf",
    "/opt/*/pip.conf",
    # the virtualenvs granted whole: the one activated (`policy.active_venv`), poetry's and pdm's
    # installers' (and the cwd's project's in a store, `policy.project_venvs`)
    *(f"{venv}/{name}" for venv in ("{VENV}", *_INSTALLER_VENVS) for name in VENV_FILES),
    # npm's global npmrc and built-in one under the prefixes granted whole (`npm config set -g`)
    *(f"{{HOME}}/{prefix}/{npmrc}" for prefix in (".npm-global", ".local") for npmrc in _NPMRCS),
    "{SDKMAN_DIR}/candidates/maven/*/conf/settings.xml",
    "{HOME}/.sdkman/candidates/maven/*/conf/settings.xml",
    "/usr/share/maven/conf/settings.xml",
    "/opt/*/conf/settings.xml",
    "/usr/local/*/conf/settings.xml",
    "{SDKMAN_DIR}/candidates/gradle/*/gradle.properties",
    "{HOME}/.sdkman/candidates/gradle/*/gradle.properties",
    "/opt/*/gradle.properties",
    "/opt/gradle/*/gradle.properties",
    "/opt/*/.condarc",
    "/opt/*/condarc",
)


# The files granted as a copy, by template, with the variable that tells their tool where it lies.
COPIED = (("{HOME}/.npmrc", "npm_config_userconfig"),)  # npm's and yarn's

# What each file was judged, by which file it was and when it last changed: every session's start
# reads the policy (500 at once would read and search the same files 500 times).
_JUDGED: dict[str, tuple[tuple[int, ...], bool]] = {}


class Copy(NamedTuple):
    """A configuration given to code as a copy (`judged_copy`)."""

    variable: str  # what tells its tool where it lies
    path: str  # the copy, or /dev/null when the file holds a secret (or is no regular file)
    source: str  # the user's file
    seen: Decided  # which file the source was (`paths.as_decided`): judged again once it changes


_COPIES: dict[str, tuple[Decided, str]] = {}  # source -> what it was (as `seen`), its copy


def secret_free(path: str, at: int | None = None) -> bool:
    """Whether `path` is a regular file of at most LIMIT bytes holding no secret (`open_regular`:
    looked at before it is opened, opened without blocking); with `at`, a descriptor of it
    (O_PATH), the file `at` holds, whatever `path` leads to now."""
    if (opened := open_regular(path if at is None else f"/proc/self/fd/{at}")) is None:
        return False
    fd, st = opened
    with open(fd, "rb") as f:
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if (judged := _JUDGED.get(path)) is not None and judged[0] == seen:
            return judged[1]
        data = f.read(LIMIT + 1)
    free = _free(data)
    _JUDGED[path] = (seen, free)
    return free


# pip's options that name files of pip's own arguments, read as its configuration is (not `cert`
# nor `client-cert`, whose file may hold a private key), in the system's pip.conf alone: sandboxed
# code may write the user's, to name any file for every later session to read.
_PIP_FILES = ("constraint", "requirement")
_SYSTEM_PIP = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf")


def files_named(path: str) -> list[str]:
    """The files the system's pip.conf, judged free of secrets, names for pip to read (`constraint
    = …`, as an admin caps a machine's packages), each itself free of secrets: pip stops on one it
    may not read."""
    if path not in _SYSTEM_PIP or (opened := open_regular(path)) is None:
        return []
    fd, st = opened
    with open(fd, "rb") as f:
        seen = decided(st)
        if (known := _NAMED.get(path)) is None or known[0] != seen:
            known = _NAMED[path] = (seen, _pip_files(f.read(LIMIT + 1)))
    return [p for p in known[1] if os.path.exists(p) and secret_free(p)]


_NAMED: dict[str, tuple[Decided, list[str]]] = {}  # a system pip.conf, as it was, and what it names


def _pip_files(data: bytes) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(data.decode("utf-8"))
    except (UnicodeDecodeError, configparser.Error):
        return []
    named = (w for section in parser.values() for key in _PIP_FILES for w in section.get(key, "").split())
    return [p for p in dict.fromkeys(named) if os.path.isabs(p)]  # (pip expands no ~ there)


def _free(data: bytes) -> bool:
    """Whether a configuration's bytes (LIMIT + 1 of them read) are few enough and hold no secret:
    UTF-8 text alone (one in UTF-16, say, hides its words between NULs), byte-order marks left out
    (one before a line's `[env]` hid it)."""
    if len(data) > LIMIT or b"\0" in data:
        return False
    try:
        text = data.decode("utf-8").replace("\ufeff", "")
    except UnicodeDecodeError:
        return False
    if _PREFIXES.search(text):
        return False
    text = _NAMED_NOT_HELD.sub("", text)
    return not _SECRET.search(text) and not any(_secret_url(m[1], m[2]) for m in _URL.finditer(text))


def judged_copy(source: str, variable: str, writable: dict[Identity, str]) -> Copy:
    """`source` as code may read it: a copy of its bytes, judged free of secrets as `secret_free`
    judges, in a directory of ollie's data of that copy alone (named by its content; the sandbox
    is granted the directory), else /dev/null. The bytes judged are the bytes given: the file is
    read once, by descriptor. Not through a symlink in a `writable` directory (where code may write:
    one it planted there would have ollie copy it a file it may not read), nor from ollie's hidden
    directories."""
    if not os.path.lexists(source):  # (most users have none: no look at ollie's directories for it)
        return Copy(variable, os.devnull, source, None)
    hidden = identities(config.hidden_dirs())
    if (opened := open_regular(source, hidden, writable)) is None:  # no regular file, or one not to read
        return Copy(variable, os.devnull, source, as_decided(source))
    fd, st = opened
    seen = decided(st)
    with open(fd, "rb") as f:
        known = _COPIES.get(source)
        if known is not None and known[0] == seen and (known[1] == os.devnull or os.path.exists(known[1])):
            return Copy(variable, known[1], source, seen)
        data = f.read(LIMIT + 1)
    if not _free(data):
        _COPIES[source] = (seen, os.devnull)
        return Copy(variable, os.devnull, source, seen)
    key = hashlib.sha256(data).hexdigest()[:16]
    try:
        copy = config.data_dir("sandbox-config", key) / os.path.basename(source).lstrip(".")
        write_new(copy, data)
    except (OSError, ConfigError) as e:  # a full disk, a file where its directory goes: the tool reads no
        # configuration, and the next build tries again
        log.warning("%s is not given to sandboxed code: its copy could not be written: %s", source, e)
        return Copy(variable, os.devnull, source, seen)
    _COPIES[source] = (seen, str(copy))
    return Copy(variable, str(copy), source, seen)
