"""The git identity sandboxed code commits with.

git dies ("unknown error occurred while reading the configuration files") on a global config it may
not read, and ~/.gitconfig lies outside the grants. In its place the sandbox's git reads, as its
global config (`GIT_CONFIG_GLOBAL`), a file holding only the user's name and email (and each
`includeIf` that chooses another, with a file of that identity alone), and the name `git init`
gives a first branch (`init.defaultBranch`): no alias, credential helper
or URL rewrite (which may hold a token) crosses over, and a repository's own `user.name` or
`user.email` still wins, as global settings lose to local ones. The identity is read from the
files here, never by running a git found on a PATH the project may lead."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Sequence

from .. import config
from ..paths import Identity, identities, open_regular, resolved, write_new
from ..types import ConfigError

log = logging.getLogger(__name__)

# Seconds an identity read stays what new sandboxes get while the global config is the same file,
# unchanged (every session's first call builds a sandbox: 500 at once read the files once), as long
# as the sandboxes' look at their paths (RECHECK): an include changed is seen that much later.
REREAD = 5.0
_READ: dict[tuple, tuple[float, str]] = {}  # a global config (path, file, change) -> when it was read, what it gave


def global_config(granted: tuple[str, ...]) -> str:
    """What the sandbox's git reads as its global config: "" when the user has none or a grant
    (`granted`, real paths) lets it read the real one; /dev/null when it holds no identity; else
    a file in ollie's data (`identity_file`). A change reaches new sandboxes within REREAD seconds."""
    real = _user_global_config()
    if not real or any(real == p or real.startswith(p.rstrip("/") + "/") for p in granted):
        return ""
    try:
        st = os.stat(real)
    except OSError:
        return ""
    now, key = time.monotonic(), (real, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    when, given = _READ.get(key, (-REREAD, ""))
    if now - when >= REREAD or not os.path.exists(given):
        user, conditional, branch = _identity(real)
        try:
            given = identity_file(user, conditional, branch) if user or conditional or branch else os.devnull
        except (OSError, ConfigError) as e:  # a full disk, a file where its directory goes: no identity, and
            # the next build tries again
            log.warning("your git identity is not given to sandboxed code: its file could not be written: %s", e)
            return os.devnull
        _READ.clear()  # one config at a time: the one before is not asked for again
        _READ[key] = (now, given)
    return given


def identity_file(
    user: dict[str, str], conditional: Sequence[tuple[str, dict[str, str]]] = (), branch: str = ""
) -> str:
    """A git config file holding `user` (name, email) and nothing else but, for each `conditional`
    (an `includeIf` condition and the identity its file sets), that condition including a file of
    that identity alone; in a directory of ollie's data of those identities only (the sandbox is
    granted the directory: no other identity of yours, a work email in a personal project's), shared
    by every sandbox of theirs; each file written whole under a temporary name, then renamed."""
    texts = [_user_text(identity) for _, identity in conditional]
    conditions = [condition for condition, _ in conditional]
    first = f'[init]\n\tdefaultBranch = "{_quoted(branch)}"\n' if branch else ""
    key = hashlib.sha256("\0".join([_user_text(user) + first, *conditions, *texts]).encode()).hexdigest()[:16]
    directory = config.data_dir("sandbox-git", key)
    names = [f"{n}.gitconfig" for n in range(len(texts))]
    files = dict(zip(names, texts, strict=True))
    files["config"] = (
        _user_text(user)
        + first
        + "".join(
            f'[includeIf "{condition}"]\n\tpath = "{_quoted(str(directory / name))}"\n'
            for condition, name in zip(conditions, names, strict=True)
        )
    )
    for name, text in files.items():
        write_new(directory / name, text.encode())
    return str(directory / "config")


def _user_text(user: dict[str, str]) -> str:
    return "[user]\n" + "".join(f'\t{key} = "{_quoted(value)}"\n' for key, value in sorted(user.items()))


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _user_global_config() -> str:
    """The global git config that exists, if any (git reads both; either unreadable is fatal)."""
    found = [p for p in _global_paths(os.path.expanduser("~")) if os.path.exists(p)]
    return os.path.realpath(found[0]) if found else ""


def user_configs() -> tuple[str, ...]:
    """The global git configs that exist, for a jail to mask, `$HOME` as a real path. Where one is
    a link (stow's, a dotfiles manager's), the file it leads to, if that is a git config by its
    name (`.gitconfig`, `gitconfig`, a `git` directory's `config`): code working in `$HOME` could
    have planted the link, and a mask makes what code writes to the file vanish. A link on the
    way to them has the jail pass over it."""
    found = []
    for path in _global_paths(os.path.realpath(os.path.expanduser("~"))):
        if not os.path.isabs(path) or not os.path.lexists(path):
            continue
        if os.path.islink(path):
            path = resolved(path)
            name, parent = os.path.basename(path), os.path.basename(os.path.dirname(path))
            if not (name in (".gitconfig", "gitconfig") or (name, parent) == ("config", "git")):
                continue
        found.append(path)
    return tuple(found)


def _global_paths(home: str) -> tuple[str, str]:
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")


class _Budget:
    """What reading one global config and its includes may cost: a file of the user's that code
    working in $HOME can write, parsed in the thread that builds every session's sandbox."""

    files = 16  # the config and its includes
    size = 1 << 20  # bytes read of them all


def _identity(path: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]], str]:
    """The identity a global config sets, its `[include]`s' read in place (the last set wins, as
    git has it), and each `[includeIf]` whose file sets one: its condition (a `gitdir:` pattern
    relative to the config's directory made absolute), for git in the sandbox to judge; and its
    `init.defaultBranch`."""
    budget, hidden = _Budget(), identities(config.hidden_dirs())
    user: dict[str, str] = {}
    conditional: list[tuple[str, dict[str, str]]] = []
    branch = ""
    for section, condition, key, value in _entries(path, budget, hidden):
        if section == "user" and condition is None and key in ("name", "email"):
            user[key] = value
        elif section == "init" and condition is None and key == "defaultbranch":
            branch = value
        elif key == "path" and (section, condition is None) in (("include", True), ("includeif", False)):
            included = os.path.join(os.path.dirname(path), os.path.expanduser(value))
            found = {
                k: v
                for s, c, k, v in _entries(included, budget, hidden)
                if s == "user" and c is None and k in ("name", "email")
            }
            if section == "include":
                user.update(found)
            elif found and condition is not None:
                condition = re.sub(r"^(gitdir(?:/i)?:)\./", lambda m: f"{m[1]}{os.path.dirname(path)}/", condition)
                conditional.append((condition, found))
    return user, conditional, branch


# Possessive: a header of a million blanks is not tried at each split of them between two \s*.
_SECTION = re.compile(r'\s*+\[\s*+([A-Za-z0-9.-]++)\s*+(?:"([^"\\]*+)")?\s*+\]')
_VALUE = re.compile(r"\s*+([A-Za-z][A-Za-z0-9-]*+)\s*+=\s*+(.*)")


def _entries(path: str, budget: _Budget, hidden: dict[Identity, str]) -> list[tuple[str, str | None, str, str]]:
    """(section, subsection, key, value) of each setting of a git config file, the names in lower
    case; a quoted value unquoted, a comment (# or ;) after it dropped. Read within `budget`, only
    as a regular file outside ollie's `hidden` directories (an include could name its keys), looked
    at before it is opened (opening a device may do something) and opened without blocking."""
    if budget.files <= 0 or budget.size <= 0:
        return []
    budget.files -= 1
    if (opened := open_regular(path, hidden)) is None:
        return []
    with open(opened[0], "rb") as f:
        data = f.read(budget.size)
    budget.size -= len(data)
    entries: list[tuple[str, str | None, str, str]] = []
    section, subsection = "", None
    for line in data.decode("utf-8", "replace").splitlines():
        if line.lstrip().startswith("["):  # a header, perhaps a setting after it on its line
            header = _SECTION.match(line)
            section, subsection = (header[1].lower(), header[2]) if header else ("", None)
            line = line[header.end() :] if header else ""
        if section and (item := _VALUE.match(line)):
            value = item[2].strip()
            if value.startswith('"') and '"' in value[1:]:
                value = value[1 : value.index('"', 1)]
            else:
                value = re.split(r"\s[#;]", value, maxsplit=1)[0].strip()
            if value and "\0" not in value:
                entries.append((section, subsection, item[1].lower(), value))
    return entries
