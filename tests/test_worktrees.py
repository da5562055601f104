"""Sub-agents in a git worktree of their own (worktree=1), on a real server's mount with a real
repository and the real sandbox: three parallel jobs edit the same file on three branches and the
parent merges one; `rm -r b/<id>` drops a worktree and its branch; a cwd in no repository, or in
one whose root lies above the parent's cwd, is refused saying why; a sub-session made with
`new worktree=1` works in its own; and git run on the project's repository runs only sandboxed
(a planted hook, fsmonitor and filter meet the sandbox)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fs_helpers import FsServer
from test_jobs import Jobs

SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=", "-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str, check: bool = True) -> str:
    """git as the test itself runs it: planted hooks and fsmonitor switched off."""
    out = subprocess.run(["git", *SAFE, "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if check and out.returncode:
        raise AssertionError(f"git {args}: {out.stderr}")
    return out.stdout


def make_repo(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "shared.txt").write_text("base\n")
    git(repo, "add", "shared.txt")
    git(repo, "commit", "-q", "-m", "base")


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/ollie/").split()


def execute(code: str, timeout: float = 120) -> dict:
    return {"name": "execute_code", "arguments": {"steps": [{"code": code}], "timeout": timeout}}


def spawn(*args: str) -> dict:
    steps = [{"tool": "subagent_spawn", "args": list(args)}]
    return {"name": "execute_code", "arguments": {"steps": steps, "timeout": 120}}


# Each job's scripted agent edits shared.txt in its own way: it writes its cwd's name, its job's id.
EDITOR = [
    {"tool_calls": [execute('printf "edit by %s\\n" "$(basename "$PWD")" > shared.txt; echo new > added.txt')]},
    {"text": "edited"},
]
MERGE_ONE = (
    "b=$(git for-each-ref --format='%(refname:short)' 'refs/heads/ollie/' | head -1); "
    'git merge -q --no-edit "$b" && echo "merged $b"'
)


@pytest.fixture
def srv(tmp_path):
    srv = FsServer(tmp_path)
    srv.env["OLLIE"] = str(srv.mnt)
    srv.agent("editor", turns=EDITOR)
    srv.ollie("init")
    make_repo(srv.work)
    yield srv
    srv.stop()


def test_three_parallel_jobs_edit_one_file_on_three_branches_and_the_parent_merges_one(srv):
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [spawn("--worktree", "--agent", "editor", "one", "two", "three")]},
            {"text": "delegated", "expect": "## worktree\nbranch: ollie/"},
            {"tool_calls": [execute(MERGE_ONE)]},
            {"text": "merged", "expect": "merged ollie/"},
        ],
        subagents=["editor"],
    )
    srv.start()
    sid = srv.new_session(agent="lead")
    s = srv.mnt / "s" / sid
    (s / "prompt").write_text("delegate\n")
    srv.wait_idle(sid, timeout=120)
    assert (s / "reply").read_text() == "delegated", (s / "chat").read_text()
    jobs = Jobs(srv)
    ids = sorted(os.listdir(jobs.b))
    assert len(ids) == 3
    for jid in ids:
        assert jobs.wait(jid) == "done"
        result = (jobs.b / jid / "result").read_text()
        assert result.startswith("edited\n\n## worktree\n"), result
        assert f"branch: ollie/{jid}\n" in result
        assert "shared.txt | 2 +-" in result and "added.txt  | 1 +" in result
        assert "2 files changed, 2 insertions(+), 1 deletion(-)" in result
        assert (jobs.b / jid / "worktree").read_text().startswith(f"branch: ollie/{jid}\npath: {srv.work}/.ollie/")
        assert git(srv.work, "show", f"ollie/{jid}:shared.txt") == f"edit by {jid}\n"  # each its own
        assert git(srv.work, "log", "-1", "--format=%s", f"ollie/{jid}") == f"ollie: the work of {jid}\n"
    assert sorted(branches(srv.work)) == sorted(f"ollie/{j}" for j in ids)
    # The parent's own checkout is untouched, and its status shows none of the worktrees.
    assert (srv.work / "shared.txt").read_text() == "base\n"
    assert git(srv.work, "status", "--porcelain") == ""
    assert "/.ollie/worktrees/" in (srv.work / ".git" / "info" / "exclude").read_text().splitlines()

    (s / "prompt").write_text("merge one\n")
    srv.wait_idle(sid, timeout=60)
    assert (s / "reply").read_text() == "merged", (s / "chat").read_text()
    merged = sorted(branches(srv.work))[0]
    assert (srv.work / "shared.txt").read_text() == f"edit by {merged.removeprefix('ollie/')}\n"
    assert (srv.work / "added.txt").read_text() == "new\n"

    dropped = ids[1]
    srv.sh(f"rm -r b/{dropped}")
    assert dropped not in os.listdir(jobs.b)
    assert not (srv.work / ".ollie" / "worktrees" / dropped).exists()
    assert f"ollie/{dropped}" not in branches(srv.work)
    assert dropped not in git(srv.work, "worktree", "list")
    assert len(branches(srv.work)) == 2  # the others are kept until their jobs are removed
    assert not (srv.data / "worktrees" / f"{dropped}.json").exists()


def test_a_cwd_in_no_repository_or_above_the_parents_is_refused_saying_why(srv):
    plain = srv.root / "plain"
    plain.mkdir()
    (srv.work / "sub").mkdir()
    srv.start()
    answer = _submit(srv, f"cwd={plain}\nworktree=1\n---\nhi\n")
    assert answer.startswith("error: worktree=1: ") and "is not in a git repository" in answer, answer
    assert "git init" in answer
    assert _submit(srv, "worktree=yes\n---\nhi\n").startswith("error: line 1: worktree is 1")
    empty = srv.root / "empty"  # a repository with no commit yet: the job fails, saying so, and leaves nothing
    empty.mkdir()
    git(empty, "init", "-q")
    [jid] = _submit(srv, f"agent=editor\ncwd={empty}\nworktree=1\n---\nedit\n").split()
    status = Jobs(srv).wait(jid)
    assert status.startswith("failed: worktree=1: cannot make a git worktree of ") and "no commit yet" in status
    assert not (empty / ".ollie" / "worktrees" / jid).exists() and not list((srv.data / "worktrees").glob("*.json"))

    refusal = "Invalid argument"
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [execute("printf 'worktree=1\\n---\\nhi\\n' > $OLLIE/b/new")]},
            {"text": "refused"},
            {"tool_calls": [execute("echo 'new worktree=1' > $OLLIE/ctl")]},
            {"text": "refused too", "expect": refusal},
        ],
    )
    sid = srv.new_session(agent="lead", cwd=str(srv.work / "sub"))  # the repository's root is above it
    s = srv.mnt / "s" / sid
    (s / "prompt").write_text("try\n")
    srv.wait_idle(sid, timeout=60)
    (s / "prompt").write_text("try again\n")
    srv.wait_idle(sid, timeout=60)
    chat = (s / "chat").read_text()
    assert (s / "reply").read_text() == "refused too", chat
    assert chat.count(f"the repository's root {srv.work} lies above {srv.work}/sub") == 2, chat
    assert os.listdir(srv.mnt / "b") == [jid] and branches(srv.work) == []  # the empty repository's job alone


def test_a_sub_session_made_with_worktree_1_works_in_its_own_and_its_parent_merges_it(srv):
    """`new worktree=1` through the view; the parent reads the sub-session's `worktree` (which
    commits its work on its branch) and merges the branch; killing it removes worktree and branch."""
    merge_child = (
        'c=$(ls "$OLLIE/s" | grep -vx -e "$OLLIE_SESSION_ID" -e new -e idx); cat "$OLLIE/s/$c/worktree" && '
        'git merge -q --no-edit "ollie/$c" && echo "merged $c"'
    )
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [execute("echo 'new worktree=1 agent=editor' > $OLLIE/ctl")]},
            {"text": "started"},
            {"tool_calls": [execute(merge_child)]},
            {"text": "merged", "expect": "merged "},
        ],
        subagents=["editor"],
    )
    srv.start()
    sid = srv.new_session(agent="lead")
    (srv.mnt / "s" / sid / "prompt").write_text("start one\n")
    srv.wait_idle(sid, timeout=60)
    assert (srv.mnt / "s" / sid / "reply").read_text() == "started", (srv.mnt / "s" / sid / "chat").read_text()
    [child] = [line.split("\t")[0] for line in (srv.mnt / "s" / "idx").read_text().splitlines()][1:]
    tree = srv.work / ".ollie" / "worktrees" / child
    assert (srv.mnt / "s" / child / "cfg").read_text().count(f"cwd={tree}\n") == 1
    assert "worktree" not in os.listdir(srv.mnt / "s" / child)  # reading it commits: found by name only
    (srv.mnt / "s" / child / "prompt").write_text("edit\n")
    srv.wait_idle(child, timeout=60)
    assert (tree / "shared.txt").read_text() == f"edit by {child}\n"
    assert (srv.work / "shared.txt").read_text() == "base\n"
    assert branches(srv.work) == [f"ollie/{child}"]

    (srv.mnt / "s" / sid / "prompt").write_text("merge it\n")
    srv.wait_idle(sid, timeout=60)
    chat = (srv.mnt / "s" / sid / "chat").read_text()
    assert (srv.mnt / "s" / sid / "reply").read_text() == "merged", chat
    assert f"## worktree\nbranch: ollie/{child}\n" in chat and f"kill {child} drops it" in chat
    assert (srv.work / "shared.txt").read_text() == f"edit by {child}\n"  # merged into the parent's
    with pytest.raises(OSError):  # a session made without worktree=1 has none
        (srv.mnt / "s" / sid / "worktree").read_text()

    srv.sh(f"mv s/{child} s/renamed-child")  # its worktree stays its own under its new name
    srv.sh("rm -r s/renamed-child")
    assert not tree.exists() and branches(srv.work) == []
    assert (srv.work / "shared.txt").read_text() == f"edit by {child}\n"


@pytest.mark.parametrize("whose", ["a sub-agent's", "the user's"])
def test_git_on_the_projects_repository_runs_only_sandboxed(srv, tmp_path, whose):
    """A hook, an fsmonitor and filters planted in the project's .git/config and .gitattributes
    (which sandboxed code may write) would write a marker outside the cwd: they run sandboxed, or
    not at all, when the worktree is made, its work committed and it is removed; in the parent's
    sandbox (a sub-agent's job), or in one of its own (the user's job, which has no parent)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    repo = srv.work
    evil = repo / ".git" / "evil.sh"
    evil.write_text(
        f'#!/bin/sh\ntouch "{outside}/marker-$1"\ntouch "{repo}/.git/ran-$1"\n'
        'if [ "$1" = smudge ] || [ "$1" = clean ]; then cat; fi\nexit 0\n'
    )
    evil.chmod(0o755)
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "attributes")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nexec {evil} post-checkout\n")
    hook.chmod(0o755)
    for key, value in (
        ("core.fsmonitor", f"{evil} fsmonitor"),
        ("filter.evil.smudge", f"{evil} smudge"),
        ("filter.evil.clean", f"{evil} clean"),
        ("diff.evil.textconv", f"{evil} textconv"),
    ):
        git(repo, "config", key, value)
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [spawn("--worktree", "--agent", "editor", "one")]},
            {"text": "delegated", "expect": "branch: ollie/"},
        ],
        subagents=["editor"],
    )
    srv.start()
    if whose == "the user's":
        [jid] = _submit(srv, f"agent=editor\ncwd={repo}\nworktree=1\n---\nedit\n").split()
        assert Jobs(srv).wait(jid) == "done"
    else:
        sid = srv.new_session(agent="lead")
        (srv.mnt / "s" / sid / "prompt").write_text("delegate\n")
        srv.wait_idle(sid, timeout=120)
        assert (srv.mnt / "s" / sid / "reply").read_text() == "delegated", (srv.mnt / "s" / sid / "chat").read_text()
        [jid] = os.listdir(srv.mnt / "b")
    assert f"ollie/{jid}" in branches(repo)
    assert "shared.txt | 2 +-" in (srv.mnt / "b" / jid / "result").read_text()
    srv.sh(f"rm -r b/{jid}")
    assert branches(repo) == [] and not (repo / ".ollie" / "worktrees" / jid).exists()
    # They ran (git did run them), in the sandbox: their marker outside the cwd was never made.
    assert (repo / ".git" / "ran-post-checkout").exists() and (repo / ".git" / "ran-smudge").exists()
    assert (repo / ".git" / "ran-clean").exists()
    assert os.listdir(outside) == []
    # The plant is real: git run outside a sandbox runs it, and the marker is made.
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", str(tmp_path / "control")], check=True)
    assert "marker-post-checkout" in os.listdir(outside)


def test_a_removed_jobs_worktree_left_behind_is_removed_at_the_next_start(srv):
    """A worktree whose job went while the server was down (its record outlived it) goes at start."""
    srv.start()
    answer = srv.sh(f"b/sched name=orphan agent=editor cwd={srv.work} worktree=1 edit").stdout  # the b/ scripts
    assert answer == "orphan-0\n", answer
    assert Jobs(srv).wait("orphan-0") == "done"
    assert branches(srv.work) == ["ollie/orphan-0"]
    srv.stop()
    record = json.loads((srv.data / "worktrees" / "orphan-0.json").read_text())
    assert record["root"] == str(srv.work)
    shutil.rmtree(srv.data / "jobs" / "orphan-0")  # gone without the server knowing
    srv.start()
    deadline = time.monotonic() + 30
    while branches(srv.work) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert branches(srv.work) == [] and not (srv.work / ".ollie" / "worktrees" / "orphan-0").exists()
    assert not (srv.data / "worktrees" / "orphan-0.json").exists()


def _submit(srv: FsServer, spec: str) -> str:
    """Write a spec to b/new; its answer (ids, or `error: …`) read back on the same open file."""
    fd = os.open(srv.mnt / "b" / "new", os.O_RDWR)
    try:
        try:
            os.write(fd, spec.encode())
            os.fsync(fd)  # the checks that need the whole spec run at the flush
            os.close(os.dup(fd))
        except OSError:
            pass
        return os.pread(fd, 4096, 0).decode()
    finally:
        os.close(fd)


def test_worktree_1_is_refused_on_the_ray_executor(ollie_dirs, tmp_path):
    from ollie.fs.job import parse_spec
    from ollie.fs.jobs import Jobs
    from ollie.fs.ray_jobs import RayExecutor
    from ollie.fs.sessions import Sessions
    from ollie.vfs.namespace import FsError

    make_repo(tmp_path / "repo")
    sessions = Sessions(default_cwd=str(tmp_path / "repo"))
    jobs = Jobs(sessions, slots=1, executor=RayExecutor(sessions))
    with pytest.raises(FsError) as e:
        jobs.check_spec(parse_spec("worktree=1\n---\nhi\n"), None)
    assert "worktree=1: not with OLLIE_BATCH_EXECUTOR=ray" in str(e.value)


def test_what_cannot_hold_a_worktree_is_refused_before_git_runs(tmp_path):
    from ollie.fs import worktrees
    from ollie.vfs.namespace import FsError

    make_repo(tmp_path / "repo")
    linked = tmp_path / "linked"
    git(tmp_path / "repo", "worktree", "add", "-q", str(linked))
    with pytest.raises(FsError, match="is not a directory .a linked worktree or a submodule"):
        worktrees.repository_root(str(linked), None)
    # a `.git` code planted as a link is refused without being followed (one into ollie's own mount
    # stopped the loop that serves it: red-team pass, stop 57)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / ".git").symlink_to(tmp_path / "repo" / ".git")
    with pytest.raises(FsError, match="is not a directory .a linked worktree or a submodule"):
        worktrees.repository_root(str(planted), None)
    for bad in (".hidden", "a..b", "x.lock", "trailing."):
        with pytest.raises(FsError, match="cannot name a git branch"):
            worktrees.check_id(bad)
    inner = tmp_path / "repo" / "deep" / "er"
    inner.mkdir(parents=True)
    plan = worktrees.plan("j-0", str(inner), str(tmp_path / "repo"), "job", "")
    assert plan.cwd == f"{tmp_path}/repo/.ollie/worktrees/j-0/deep/er"  # the same place in its worktree


# A sub-agent's code plants, in its own worktree, what would run its code in its parent's wider
# sandbox when ollie commits its work there: the worktree's .git file pointed at a repository of its
# own (with an fsmonitor, hooks and a filter), and a repository nested in its tree (with an fsmonitor).
# Each would touch a marker in the parent's cwd, which the sub-agent's own sandbox cannot write.
PLANT = r"""
root=$(cd ../../.. && pwd)
printf '#!/bin/sh\ntouch "%s/escalated-$1"\nif [ "$1" = clean ]; then cat; fi\nexit 0\n' "$root" > .evil.sh
chmod +x .evil.sh
touch "$root/escalated-direct" 2>/dev/null
git init -q --bare evil-git
git --git-dir=evil-git config core.bare false
git --git-dir=evil-git config core.fsmonitor "$PWD/.evil.sh fsmonitor"
git --git-dir=evil-git config filter.evil.clean "$PWD/.evil.sh clean"
for h in pre-commit post-commit post-index-change reference-transaction; do
  printf '#!/bin/sh\nexec %s %s\n' "$PWD/.evil.sh" "$h" > "evil-git/hooks/$h"; chmod +x "evil-git/hooks/$h"
done
echo '* filter=evil' > .gitattributes
printf 'gitdir: %s/evil-git\n' "$PWD" > .git
mkdir nested && git -C nested init -q && echo x > nested/f
git -C nested add f && git -C nested -c user.name=x -c user.email=x@x commit -q -m x
git -C nested config core.fsmonitor "$PWD/.evil.sh nested-fsmonitor"
echo changed > shared.txt
echo planted
"""


def test_a_sub_agent_cannot_run_its_code_in_its_parents_sandbox_through_its_worktree(srv):
    srv.agent("sneaky", turns=[{"tool_calls": [execute(PLANT)]}, {"text": "planted", "expect": "planted"}])
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [spawn("--worktree", "--agent", "sneaky", "one")]},
            {"text": "delegated", "expect": "branch: ollie/"},
        ],
        subagents=["sneaky"],
    )
    srv.start()
    sid = srv.new_session(agent="lead")
    (srv.mnt / "s" / sid / "prompt").write_text("delegate\n")
    srv.wait_idle(sid, timeout=120)
    assert (srv.mnt / "s" / sid / "reply").read_text() == "delegated", (srv.mnt / "s" / sid / "chat").read_text()
    [jid] = os.listdir(srv.mnt / "b")
    result = (srv.mnt / "b" / jid / "result").read_text()
    assert re.search(r"\n shared\.txt +\| +2 \+-\n", result) and "\n nested " in result, result  # committed
    assert git(srv.work, "show", f"ollie/{jid}:shared.txt") == "changed\n"
    assert "160000 commit" in git(srv.work, "ls-tree", f"ollie/{jid}", "nested")  # a gitlink, not entered
    assert [m for m in os.listdir(srv.work) if m.startswith("escalated")] == []
    tree = srv.work / ".ollie" / "worktrees" / jid
    # The plant is real: git led by the worktree's .git file runs it.
    subprocess.run(["git", "-C", str(tree), "status"], capture_output=True, check=False)
    assert "escalated-fsmonitor" in os.listdir(srv.work)
    for marker in srv.work.glob("escalated-*"):
        marker.unlink()
    srv.sh(f"rm -r b/{jid}")
    assert not tree.exists() and branches(srv.work) == []
    assert [m for m in os.listdir(srv.work) if m.startswith("escalated")] == []
