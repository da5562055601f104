"""A policy's grants, decided once: each path opened into a descriptor and judged through it.

- The working directory is kept as a real path: a symlink on it now was planted since (by code
  that writes its parent), so none is followed. So is the work tree it lies in (`{REPO}`), found
  from it: that grant is left out instead.
- Any other grant follows symlinks as the user set them up (`/etc/localtime`, a symlinked
  cache), but not one in a directory sandboxed code can write under this very policy: that link
  could be pointed anywhere before the next call.
- No grant is, or lies inside, one of ollie's hidden directories (its configuration, data, scratch
  and socket directories, its agent configs, its file server's mount), but ollie's own grants
  (tool scripts, the session's scratch directory, the memory and the plans), which it shows again
  from under them.

The descriptors are what the Landlock rules are added on, and their identities are what the jail
checks before it mounts a grant: what was judged is what is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import config
from ..paths import (
    LINKED_CWD,
    Identity,
    LinkRefused,
    Opened,
    PlantedLink,
    first_link,
    identities,
    identity,
    open_following,
    open_real,
    real_path,
    within,
)
from .policy import Policy, SandboxError

WRITABLE = ("rw", "rwx", "tmpfile")


@dataclass(frozen=True, slots=True)
class Grant:
    path: str  # the real path when it was decided
    key: str  # ro, rox, rw, rwx or tmpfile
    fd: int  # O_PATH, until `close`
    own: bool  # ollie's own grant, which may lie in a hidden directory
    shared: bool  # writable by every session's code (the memory, the plans)
    given: str = ""  # the path as the policy gave it
    linked: bool = False  # reached through a symlink: judged against where code may write

    @property
    def writable(self) -> bool:
        return self.key in WRITABLE

    @property
    def identity(self) -> Identity:
        return identity(self.fd)


def decide(
    policy: Policy, hidden: dict[Identity, str], read_only: dict[Identity, str], writable: list[Grant] | None = None
) -> list[Grant]:
    """The policy's grants, opened and judged (SandboxError naming the grant and the fix); the
    caller closes them (`close`). Grants whose path is gone since the policy was read are left out,
    as are the built-in ones (`policy.optional`) that a symlink sandboxed code could plant leads to.
    `hidden` are ollie's hidden directories, `read_only` those every jail keeps read-only (no
    writable grant may be, or lie in, one: the jail would have to choose). `writable`: grants of
    the same sandbox decided before (a session's paths decided after the ones its policy and cwd
    share): their writable ones count as where this policy lets code write."""
    grants: list[Grant] = []
    followed: list[tuple[Grant, Opened, str]] = []  # grants reached through a symlink, and their path as given
    before = [g for g in writable or () if g.writable]
    # Where sandboxed code may have planted a symlink: the session's cwd, $HOME (another session's
    # may work there), and what this policy lets code write (opened first, to be known here).
    planted = identities([p for p in (policy.cwd, os.path.expanduser("~")) if p])
    planted.update((g.identity, g.path) for g in before)
    mount = config.mount_point()  # once for all the grants: it walks the mount's parent
    try:
        for key in sorted(policy.paths, key=lambda k: k not in WRITABLE):
            for path in policy.paths[key]:
                opened = _open(policy, path, planted, mount)
                if opened is None:
                    continue
                if (path == policy.repo or path in policy.environments) and _holds_hidden(opened.fd, hidden):
                    os.close(opened.fd)
                    continue
                own = path in policy.own and path != policy.cwd  # the cwd is never ollie's own
                grant = Grant(opened.path, key, opened.fd, own, path in policy.shared, path, bool(opened.links))
                grants.append(grant)
                if opened.links:
                    followed.append((grant, opened, path))
                _judge(policy, path, grant, hidden, read_only)
                if grant.writable:
                    planted[grant.identity] = grant.path
        for grant in _through_planted_links(policy, [*before, *grants], followed):
            grants.remove(grant)
            os.close(grant.fd)
    except BaseException:
        close(grants)
        raise
    finally:
        for _, opened, _ in followed:
            for fd, _ in opened.links:
                os.close(fd)
    return grants


def _judge(
    policy: Policy, path: str, grant: Grant, hidden: dict[Identity, str], read_only: dict[Identity, str]
) -> None:
    if not grant.own:
        _refuse_hidden(policy, path, grant, hidden)
    if grant.writable and (where := within(grant.fd, read_only)) is not None:
        raise SandboxError(
            f"sandbox policy {policy.name!r} lets code write {grant.path}, in {where}, which every "
            "sandbox keeps read-only (the Python that runs ollie, tool scripts, skills)"
            + ("; choose another working directory" if path == policy.cwd else "")
        )


def _through_planted_links(
    policy: Policy, grants: list[Grant], followed: list[tuple[Grant, Opened, str]]
) -> list[Grant]:
    """The optional grants reached through a symlink that sandboxed code could have planted (to
    leave out); SandboxError for any other. Code could plant one where this policy lets it write,
    and where a session's code writes under any policy: its cwd, and $HOME (a session of the
    user's works there, or in a directory above a sub-agent's)."""
    writable = {g.identity: g.path for g in grants if g.writable}
    writable.update(identities([p for p in (policy.cwd, os.path.expanduser("~")) if p]))
    planted = []
    for grant, opened, path in followed:
        for parent, link in opened.links:
            if (where := within(parent, writable)) is None:
                continue
            if path in policy.optional:
                planted.append(grant)
                break
            raise SandboxError(
                f"sandbox policy {policy.name!r} grants {grant.path} through the symlink {link}, which "
                f"sandboxed code could point anywhere (it can write {where}); grant the real path instead"
            )
    return planted


def close(grants: list[Grant]) -> None:
    for grant in grants:
        os.close(grant.fd)
    grants.clear()


def _open(policy: Policy, path: str, planted: dict[Identity, str], mount: str) -> Opened | None:
    """`path` opened, following no symlink in `planted` (never looked up beyond it: it could lead
    anywhere, the server's own mount included); None if it is gone, or is an optional grant reached
    through such a link. `mount` is ollie's mount point (`config.mount_point()`)."""
    if path == mount or path.startswith(mount.rstrip("/") + "/"):
        raise SandboxError(
            f"sandbox policy {policy.name!r} grants {path}, on ollie's file server's mount {mount}: "
            "sandboxed code reaches its own view of it at $OLLIE instead"
        )
    try:
        if path in (policy.cwd, policy.repo):
            fd = open_real(path)
            return Opened(fd, real_path(fd), [])
        return open_following(path, lambda parent: _written(parent, planted))
    except FileNotFoundError:
        return None
    except PlantedLink as e:
        if path in policy.optional:
            return None
        raise SandboxError(
            f"sandbox policy {policy.name!r} grants {path} through the symlink {e.filename}, which "
            f"sandboxed code could point anywhere ({e.strerror}); grant the real path instead"
        ) from None
    except LinkRefused:
        if path == policy.repo:
            return None
        if path == policy.cwd:
            raise SandboxError(f"the working directory {path} " + LINKED_CWD.format(first_link(path) or "?")) from None
        raise SandboxError(
            f"sandbox policy {policy.name!r} grants {path}, which leads through too many symlinks"
        ) from None
    except OSError as e:
        raise SandboxError(f"sandbox policy {policy.name!r} grants {path}: {e.strerror}") from None


def _holds_hidden(fd: int, hidden: dict[Identity, str]) -> bool:
    """Whether one of ollie's hidden directories lies in the directory `fd` (by descriptor). A jail
    hides them wherever they are, but code run without one (`best_effort`) would read them there:
    the work tree around a cwd, or the virtualenv activated, is left out rather than
    granted with ollie's configuration inside."""
    tree = {identity(fd): "tree"}
    for path in hidden.values():
        try:
            inner = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if within(inner, tree) is not None:
                return True
        finally:
            os.close(inner)
    return False


def _written(parent: int, planted: dict[Identity, str]) -> str | None:
    where = within(parent, planted)
    return None if where is None else f"it can write {where}"


def _refuse_hidden(policy: Policy, path: str, grant: Grant, hidden: dict[Identity, str]) -> None:
    where = within(grant.fd, hidden)
    if where is None:
        return
    how = "is" if grant.identity in hidden else "lies inside"
    if path == policy.cwd:
        raise SandboxError(
            f"the working directory {grant.path} {how} ollie's own directory {where}, which sandboxed code "
            "never sees (API keys, agent configs, sessions): choose another working directory"
        )
    raise SandboxError(
        f"sandbox policy {policy.name!r} grants {grant.path}, which {how} ollie's own directory {where}: "
        "sandboxed code never sees it (API keys, agent configs, sessions); remove the grant"
    )
