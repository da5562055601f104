"""Sub-agents in a work tree of their own: `worktree=1` in a job's spec (b/new, `subagent_spawn
--worktree`) or in `new` (a sub-session). The sub-agent runs in a fresh git worktree of the
repository its cwd is in, at `<repository root>/.ollie/worktrees/<id>/`, on a branch `ollie/<id>`:
inside its parent's cwd, so its own cwd stays within its parent's (`cwd_within`) and within the
same sandbox bounds. ollie's data would not do: it is hidden from every sandbox, and no cwd may lie
in it.

ollie never runs git on the project's repository outside a sandbox: its `.git/config`, hooks and
`.gitattributes` are writable by sandboxed code, and git runs what they name (a `post-checkout`
hook on `git worktree add`, `core.fsmonitor`, `filter.*.smudge`, `diff.*.textconv`, merge drivers).
Every git command here (add the worktree, commit the sub-agent's work on its branch and take its
diffstat, remove the worktree and its branch) runs as an execute_code stage in the parent
session's sandbox, whose cwd (writable) holds the repository; without a parent (the user's own job
or `new`), or once it has ended or moved away, in a sandbox of its own whose cwd is the
repository's root, under the `default` policy.

Each worktree is recorded in `$OLLIE_DATA_PATH/worktrees/<id>.json` from before it is made until it
is removed, so that one whose job or sub-session went while the server was down is removed when
the server starts again.
"""

from __future__ import annotations

import asyncio
import errno as E
import json
import logging
import os
import re
import shlex
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config, paths
from ..sandbox.repository import WORKTREES
from ..tools import CallContext, execute
from ..vfs.namespace import FsError

if TYPE_CHECKING:
    from .sessions import Session

log = logging.getLogger("ollie.fs.worktrees")

PLACE = WORKTREES  # beneath the repository's root (where the sandbox looks for the repository)
EXCLUDE = "/.ollie/worktrees/"  # the line added to .git/info/exclude
BRANCH = "ollie/{}"
TIMEOUT = 300  # seconds a git stage may take (a large checkout), within the policy's limit


def wanted(value: str, where: str = "worktree") -> bool:
    """`worktree=` as given: 1 asks for one, 0 or nothing does not; anything else is refused."""
    value = value.strip()
    if value not in ("", "0", "1"):
        raise FsError(E.EINVAL, f"{where} is 1 (a git worktree of its own) or 0; got {value!r}")
    return value == "1"


def check_id(wid: str) -> str:
    """An id the branch `ollie/<id>` can be named after (ids are letters, digits, '.', '_', '-')."""
    if wid.startswith(".") or ".." in wid or wid.endswith((".", ".lock")) or "/" in wid:
        raise FsError(
            E.EINVAL,
            f"worktree=1: {wid!r} cannot name a git branch (no leading '.', no '..', no trailing '.' or "
            "'.lock'): choose another name",
        )
    return wid


def repository_root(cwd: str, bound: str | None) -> str:
    """The root of the git repository `cwd` (a real path) is in, found by looking for `.git` (git
    itself is not run here); refused (EINVAL, saying why and what to do) when there is none, when
    `.git` is not a directory (a linked worktree or a submodule: the repository lies elsewhere), or
    when the root lies above `bound` (the parent's cwd): its sandbox could not write `.git` there."""
    here = cwd
    while True:
        dot_git = os.path.join(here, ".git")
        if os.path.lexists(dot_git):
            break
        up = os.path.dirname(here)
        if up == here:
            raise FsError(
                E.EINVAL,
                f"worktree=1: {cwd} is not in a git repository, so there is nothing to make a worktree of; "
                "run it without worktree=1, or make the directory a repository first (git init, one commit)",
            )
        here = up
    try:  # (a link not followed: it could lead into the mount this loop serves)
        is_dir = stat.S_ISDIR(os.lstat(dot_git).st_mode)
    except OSError:
        is_dir = False
    if not is_dir:
        raise FsError(
            E.EINVAL,
            f"worktree=1: {dot_git} is not a directory (a linked worktree or a submodule, whose repository lies "
            "elsewhere): start the sub-agent from the repository's own checkout",
        )
    if bound is not None and here != bound and not here.startswith(bound.rstrip("/") + "/"):
        raise FsError(
            E.EINVAL,
            f"worktree=1: the repository's root {here} lies above {bound}, the working directory of the session "
            f"that starts it, whose sandbox cannot write {dot_git}; set that session's cwd to {here} "
            "(or to a repository inside its cwd), or run it without worktree=1",
        )
    return here


@dataclass
class Worktree:
    id: str
    root: str  # the repository's root, where git runs
    path: str  # root/.ollie/worktrees/<id>
    cwd: str  # the sub-agent's cwd: the worktree, or the directory in it that its cwd was in the repository
    kind: str = "job"  # "job" or "session"
    owner: str = ""  # the job's or the sub-session's id (a session may be renamed)
    parent: str = ""  # the session whose sandbox runs git ("" the user's)
    base: str = ""  # the commit it started from
    diffstat: str = ""  # once committed
    gitdir: str = ""  # its administrative directory in the repository's .git (read when it was made)

    @property
    def branch(self) -> str:
        return BRANCH.format(self.id)

    def section(self) -> str:
        """What a job's result ends with: its branch and diffstat, and how to take or drop it."""
        stat = self.diffstat.rstrip("\n") or "(no changes)"
        return (
            f"## worktree\nbranch: {self.branch}\npath: {self.path}\nbase: {self.base}\n{stat}\n"
            f"(git merge {self.branch}; git diff HEAD...{self.branch}; rm -r b/{self.owner} drops it)\n"
        )


def plan(wid: str, cwd: str, bound: str | None, kind: str, parent: str) -> Worktree:
    """What `create` will make for a sub-agent whose cwd would be `cwd` (a real path): checked,
    nothing made."""
    check_id(wid)
    root = repository_root(cwd, bound)
    path = os.path.join(root, PLACE, wid)
    rel = os.path.relpath(cwd, root)
    return Worktree(wid, root, path, os.path.normpath(os.path.join(path, rel)), kind, wid, parent)


# ---- the ledger ------------------------------------------------------------------------------------


def ledger_dir() -> Path:
    return config.data_path() / "worktrees"


def _save(wt: Worktree) -> None:
    d = ledger_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = d / f".{wt.id}.json.tmp"
    tmp.write_text(json.dumps(asdict(wt)))
    os.replace(tmp, d / f"{wt.id}.json")


def _forget(wid: str) -> None:
    (ledger_dir() / f"{wid}.json").unlink(missing_ok=True)


def recorded() -> list[Worktree]:
    d = ledger_dir()
    found = []
    for path in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            wt = Worktree(**json.loads(path.read_text()))
            check_id(wt.id)
            if path.stem != wt.id:
                raise ValueError("its id is not its file's name")
        except (OSError, ValueError, TypeError, FsError) as e:
            log.warning("%s: not a worktree record: %s", path, e)
            continue
        found.append(wt)
    return found


def find(wid: str) -> Worktree | None:
    return next((wt for wt in recorded() if wt.id == wid), None)


def of_owner(kind: str, owner: str) -> list[Worktree]:
    return [wt for wt in recorded() if wt.kind == kind and wt.owner == owner]


def renamed(old: str, new: str) -> None:
    """A session was renamed: its worktree stays its own (the branch keeps its first name)."""
    for wt in recorded():
        changed = False
        if wt.kind == "session" and wt.owner == old:
            wt.owner, changed = new, True
        if wt.parent == old:
            wt.parent, changed = new, True
        if changed:
            _save(wt)


# ---- git, sandboxed --------------------------------------------------------------------------------


async def _sandboxed(script: str, root: str, parent: Session | None) -> tuple[bool, str]:
    """Run `script` (sh) as an execute_code stage: in `parent`'s sandbox when it is alive and its
    cwd holds `root`, else in one of its own whose cwd is `root`. (succeeded, output)"""

    server, ctx, own = None, CallContext(cwd=root), None
    if parent is not None and parent.core is not None:  # the callers pass a parent still registered
        cwd = parent.settings()["cwd"]
        if root == cwd or root.startswith(cwd.rstrip("/") + "/"):
            server = parent.core.dispatcher.get_server("execute")
            ctx = parent.core.call_context()
    if server is None:
        server = own = execute.Server(root)
    policy = "default" if "default" in ctx.policies else ctx.policies[0]
    code = f"{_UNSET}\ncd -- {shlex.quote(root)} || exit 1\n{script}"
    try:
        result = await server.call_tool(
            "execute_code", {"steps": [{"code": code, "language": "sh"}], "timeout": TIMEOUT, "sandbox": policy}, ctx
        )
        if result.is_error and result.text().startswith("timeout: at most"):  # a policy of shorter calls
            result = await server.call_tool(
                "execute_code", {"steps": [{"code": code, "language": "sh"}], "sandbox": policy}, ctx
            )
    finally:
        if own is not None:
            await own.close()
    return not result.is_error, result.text()


# What a session's env could set to lead git to another repository than the one at the root.
_UNSET = (
    "unset GIT_DIR GIT_WORK_TREE GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY "
    "GIT_ALTERNATE_OBJECT_DIRECTORIES GIT_NAMESPACE GIT_CEILING_DIRECTORIES GIT_DISCOVERY_ACROSS_FILESYSTEM"
)
_MARK = re.compile(r"^ollie-base=([0-9a-f]{40,64})$", re.MULTILINE)
_GITDIR = re.compile(r"^ollie-gitdir=(/.+)$", re.MULTILINE)


async def create(wt: Worktree, parent: Session | None) -> Worktree:
    """Make the worktree `plan` described (git in the sandbox); FsError(EIO) with git's words."""
    _save(wt)  # first: however this ends, a restart finds it and cleans up
    q = shlex.quote
    script = f"""
git rev-parse -q --verify 'HEAD^{{commit}}' >/dev/null || {{
  echo "the repository has no commit yet: commit once, then ask again" >&2; exit 3; }}
exclude=$(git rev-parse --git-path info/exclude) || exit 1
mkdir -p "$(dirname "$exclude")" {q(PLACE)} || exit 1
grep -qxF {q(EXCLUDE)} "$exclude" 2>/dev/null || printf '%s\\n' {q(EXCLUDE)} >> "$exclude" || exit 1
git worktree add -q -b {q(wt.branch)} {q(os.path.join(PLACE, wt.id))} HEAD || exit 1
mkdir -p -- {q(wt.cwd)} || exit 1
echo "ollie-base=$(git -C {q(os.path.join(PLACE, wt.id))} rev-parse HEAD)"
echo "ollie-gitdir=$(git -C {q(os.path.join(PLACE, wt.id))} rev-parse --absolute-git-dir)"
"""
    ok, out = await _sandboxed(script, wt.root, parent)
    found, gitdir = _MARK.search(out), _GITDIR.search(out)
    admin = os.path.join(wt.root, ".git", "worktrees") + "/"
    if not ok or found is None or gitdir is None or not gitdir.group(1).startswith(admin):
        await remove(wt, parent)
        raise FsError(E.EIO, f"worktree=1: cannot make a git worktree of {wt.root}: {_last_words(out)}")
    wt.base, wt.gitdir = found.group(1), gitdir.group(1)
    _save(wt)
    return wt


async def finish(wt: Worktree, parent: Session | None) -> Worktree:
    """Commit what the sub-agent left in its worktree onto its branch, and take the diffstat of the
    branch against the commit it started from (git in the sandbox).

    The worktree is the sub-agent's to write, and this runs in its parent's wider sandbox: so git
    is told the worktree's administrative directory (in the parent's `.git`, out of the
    sub-agent's reach) rather than led by the worktree's `.git` file, which the sub-agent may have
    pointed at a repository of its own (with hooks and an fsmonitor); and a repository it nested
    in its tree is never entered (added as a gitlink, no submodule looked into; the diffstat compares
    two commits, which enters none either)."""
    q = shlex.quote
    gitdir = wt.gitdir or os.path.join(wt.root, ".git", "worktrees", wt.id)
    message = f"ollie: the work of {wt.owner}"
    script = f"""
export GIT_DIR={q(gitdir)} GIT_WORK_TREE={q(wt.path)}
unset GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
cd -- {q(wt.path)} || exit 1
g() {{ git -c diff.ignoreSubmodules=all -c status.submoduleSummary=false -c submodule.recurse=false "$@"; }}
g config user.email >/dev/null 2>&1 || export GIT_AUTHOR_NAME=ollie GIT_AUTHOR_EMAIL=ollie@localhost \
GIT_COMMITTER_NAME=ollie GIT_COMMITTER_EMAIL=ollie@localhost
g add -A || exit 1
g diff --cached --quiet || g commit -q --no-verify -m {q(message)} || exit 1
echo ollie-diffstat:
git diff --stat {q(wt.base)} {q(wt.branch)} --
"""
    ok, out = await _sandboxed(script, wt.root, parent)
    if not ok or "ollie-diffstat:\n" not in out:
        wt.diffstat = f"(its work could not be committed: {_last_words(out)})"
    else:
        wt.diffstat = out.split("ollie-diffstat:\n", 1)[1].strip("\n")
    _save(wt)
    return wt


async def remove(wt: Worktree, parent: Session | None) -> bool:
    """Remove the worktree and its branch (git in the sandbox), then its record. False (the record
    kept, for the next start to try again) when git could not."""
    q = shlex.quote
    place, ref = q(os.path.join(PLACE, wt.id)), q("refs/heads/" + wt.branch)
    script = f"""
if [ -e {place} ]; then git worktree remove --force --force {place} || rm -rf -- {place}; fi
git worktree prune
if git rev-parse -q --verify {ref} >/dev/null; then git branch -q -D {q(wt.branch)} || exit 1; fi
[ ! -e {place} ]
"""
    if paths.real_dir_problem(wt.root):  # the repository is gone (or a link now: never followed here)
        _forget(wt.id)
        return True
    try:
        ok, out = await _sandboxed(script, wt.root, parent)
    except Exception as e:  # noqa: BLE001 (a clean-up: logged, tried again at the next start)
        ok, out = False, str(e)
    if ok:
        _forget(wt.id)
    else:
        log.warning("worktree %s of %s: not removed (tried again at the next start): %s", wt.id, wt.root, out)
    return ok


async def sweep(live: set[tuple[str, str]]) -> int:
    """At a start: remove the worktrees whose job or sub-session is gone (`live` holds the
    (kind, id) of those that are not). Returns how many were removed."""
    removed = 0
    for wt in recorded():
        if (wt.kind, wt.owner) not in live:
            removed += await remove(wt, None)
    return removed


def sweep_soon(live: set[tuple[str, str]]) -> None:
    """`sweep`, as a task of the running loop (none: not now)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(sweep(live))
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


_TASKS: set[asyncio.Task[int]] = set()


def _last_words(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if line.strip() and not line.startswith("ollie-")]
    return " / ".join(lines[-3:]) or "git failed"
