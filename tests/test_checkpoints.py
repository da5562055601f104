"""Checkpoints and undo (issue 26): each turn that runs a tool is snapshot before its first call and
when it ends, in a shadow repository hidden from the sandbox; /undo and /rewind put the cwd back,
in plain directories and in git repositories alike (whose .git is never touched), never over a
file changed by hand since, never through a link the turn planted."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from ollie import open_session
from ollie.agent import commands
from ollie.agent.checkpoints import CheckpointError, Shadow
from ollie.types import InvalidValue


def _files(root: Path, skip: tuple[str, ...] = (".git",)) -> dict[str, tuple]:
    """Everything under `root` as it is: each file's mode and bytes, each link's target, each
    directory's mode."""
    found: dict[str, tuple] = {}
    for here, dirs, names in os.walk(root):
        if here == str(root):  # the project's own repository is never a checkpoint's
            dirs[:] = [d for d in dirs if d not in skip]
            names = [n for n in names if n not in skip]
        for name in dirs + names:
            path = Path(here, name)
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def _stage(code: str) -> dict:
    return {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": code}]}}]}


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "a.txt").write_text("one\n")
    (root / "old.txt").write_text("old\n")
    (root / "private.txt").write_text("mine\n")
    (root / "private.txt").chmod(0o600)
    (root / "sub").mkdir()
    (root / "sub" / "keep.txt").write_text("keep\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "link").symlink_to("a.txt")
    return root


EDITS = (
    "echo two > a.txt; rm old.txt; echo new > new.txt; chmod +x run.sh; echo changed >> private.txt; "
    "mkdir -p made/deep && echo x > made/deep/f; rm link; ln -s old.txt link"
)


async def _session(cwd: Path, turns: list[dict]):
    return await open_session(backend="scripted", script=turns, cwd=str(cwd))


async def test_undo_restores_exactly_what_the_turn_changed_in_a_plain_directory(tmp_path):
    cwd = _project(tmp_path / "plain")
    before = _files(cwd)
    core = await _session(cwd, [_stage(EDITS), {"text": "done"}])
    await core.submit("change things")
    assert (cwd / "a.txt").read_text() == "two\n" and (cwd / "made" / "deep" / "f").exists()
    listing = await commands.run(core, "checkpoints")
    assert listing.startswith("1\tturn 1\t") and "'change things'" in listing
    said = await commands.run(core, "undo")
    assert "restore a.txt" in said and "delete new.txt" in said
    assert _files(cwd) == before  # contents, modes (the private file private again), links, no new dir
    assert await commands.run(core, "checkpoints") == "(no checkpoints)"
    assert sorted(os.listdir(cwd)) == sorted(before_names for before_names in before if "/" not in before_names)
    await core.close()


async def test_checkpoints_and_undos_outlive_the_process_that_made_them(tmp_path):
    """`ollie run --session ID "/undo"`, or a server restarted: the checkpoints are read back from
    the session's records (each was skipped as a torn line, and no undo was left)."""
    cwd = _project(tmp_path / "plain")
    before = _files(cwd)
    core = await _session(cwd, [_stage(EDITS), {"text": "done"}, _stage("echo three > a.txt"), {"text": "done"}])
    await core.submit("change things")
    await core.submit("change more")
    sid = core.session.id
    await core.close()
    again = await open_session(backend="scripted", script=[{"text": "-"}], session_id=sid)
    listing = await commands.run(again, "checkpoints")
    assert listing.startswith("1\tturn 2\t") and "\n2\tturn 1\t" in listing, listing
    assert "restore a.txt" in await commands.run(again, "undo")
    assert (cwd / "a.txt").read_text() == "two\n"
    await again.close()
    third = await open_session(backend="scripted", script=[{"text": "-"}], session_id=sid)
    assert (await commands.run(third, "checkpoints")).startswith("1\tturn 1\t")  # the undo stands
    await commands.run(third, "undo")
    assert _files(cwd) == before and await commands.run(third, "checkpoints") == "(no checkpoints)"
    await third.close()


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def _git_state(repo: Path) -> dict[str, str]:
    """What a checkpoint must never change in the project's own repository."""
    digest = hashlib.sha256()
    for here, _, names in sorted(os.walk(repo / ".git")):
        for name in sorted(names):
            path = Path(here, name)
            digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    return {
        "refs": _git(repo, "for-each-ref"),
        "stash": _git(repo, "stash", "list"),
        "index": hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest(),
        "everything": digest.hexdigest(),
    }


async def test_in_a_git_repository_the_projects_git_is_never_touched(tmp_path):
    cwd = _project(tmp_path / "repo")
    _git(cwd, "init", "-q")
    _git(cwd, "add", "-A")
    _git(cwd, "commit", "-qm", "first")
    (cwd / "a.txt").write_text("stashed\n")
    _git(cwd, "stash", "-q")
    (cwd / "staged.txt").write_text("staged\n")
    _git(cwd, "add", "staged.txt")
    before, repo_before = _files(cwd), _git_state(cwd)
    core = await _session(cwd, [_stage(EDITS), {"text": "done"}])
    await core.submit("change things")
    assert _git_state(cwd) == repo_before  # the snapshot touched nothing of the project's .git
    await commands.run(core, "undo")
    assert _files(cwd) == before
    assert _git_state(cwd) == repo_before
    await core.close()


async def test_a_file_changed_by_hand_since_is_named_and_not_overwritten(tmp_path):
    cwd = _project(tmp_path / "p")
    core = await _session(cwd, [_stage("echo two > a.txt; echo fixed > sub/keep.txt"), {"text": "done"}])
    await core.submit("edit")
    (cwd / "a.txt").write_text("by hand\n")
    with pytest.raises(InvalidValue, match=r"changed since the checkpoint .* overwritten: a\.txt; add --force"):
        await commands.run(core, "undo")
    assert (cwd / "a.txt").read_text() == "by hand\n" and (cwd / "sub" / "keep.txt").read_text() == "fixed\n"
    dry = await commands.run(core, "rewind", "1")
    assert "would be overwritten (needs --force): a.txt" in dry
    await commands.run(core, "undo", "--force")
    assert (cwd / "a.txt").read_text() == "one\n" and (cwd / "sub" / "keep.txt").read_text() == "keep\n"
    await core.close()


async def test_rewind_two_says_first_then_goes_back_and_takes_the_chat_along(tmp_path):
    cwd = _project(tmp_path / "p")
    turns = [_stage("echo 1 > a.txt"), {"text": "first"}, {"text": "just talk"}, _stage("echo 2 > a.txt; rm old.txt")]
    core = await _session(cwd, [*turns, {"text": "second"}])
    await core.submit("one")
    await core.submit("a chat turn changes nothing and keeps no checkpoint")
    await core.submit("two")
    listing = (await commands.run(core, "checkpoints")).splitlines()
    assert [line.split("\t")[:2] for line in listing] == [["1", "turn 2"], ["2", "turn 1"]]
    dry = await commands.run(core, "rewind", "2")
    assert dry.startswith("going back to before turn 1 would:\nrestore a.txt\nrestore old.txt")
    assert "rewind 2 --yes does it" in dry and (cwd / "a.txt").read_text() == "2\n"  # nothing done yet
    said = await commands.run(core, "rewind", "2 --yes --chat")
    assert said.startswith("went back to before turn 1 (undid turn 1, 2)")
    assert (cwd / "a.txt").read_text() == "one\n" and (cwd / "old.txt").exists()
    assert core.session.messages == []  # the conversation from before turn 1: none
    with pytest.raises(InvalidValue, match="no checkpoint to go back to"):
        await commands.run(core, "undo")
    await core.close()


async def test_rewinding_the_chat_after_a_clear_is_refused_and_changes_nothing(tmp_path):
    cwd = _project(tmp_path / "p")
    core = await _session(cwd, [_stage("echo 1 > a.txt"), {"text": "ok"}])
    await core.submit("one")
    core.clear()
    with pytest.raises(InvalidValue, match="compacted or cleared since"):
        await commands.run(core, "undo", "--chat")
    assert (cwd / "a.txt").read_text() == "1\n"
    await commands.run(core, "undo")  # the files alone still go back
    assert (cwd / "a.txt").read_text() == "one\n"
    await core.close()


async def test_checkpoints_are_off_in_home_with_a_notice(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    infos: list[str] = []
    core = await open_session(
        backend="scripted",
        script=[_stage("echo x > f"), {"text": "ok"}],
        cwd=str(home),
        on_event=lambda e: infos.append(e.text) if e.kind == "info" else None,
    )
    await core.submit("write")
    assert any(i.startswith(f"checkpoints: off (the cwd is {home}, not a project directory)") for i in infos)
    assert await commands.run(core, "checkpoints") == "(no checkpoints)"
    await core.close()


# ---- what sandboxed code that wants out would do ------------------------------------------------------


async def test_sandboxed_code_cannot_reach_or_forge_the_checkpoints(tmp_path, ollie_dirs):
    cwd = _project(tmp_path / "p")
    store = ollie_dirs / "data" / "checkpoints"
    core = await _session(cwd, [_stage("echo 1 > a.txt"), {"text": "ok"}])
    await core.submit("one")
    records = core.session.store.dir / "checkpoints.jsonl"
    assert store.is_dir() and records.is_file()
    forged = json.dumps({"turn": 9, "prompt": "x", "time": 0, "cwd": "/", "before": "0" * 40, "after": "1" * 40})
    server = core.dispatcher.get_server("execute")
    for code in (
        f"ls {store}",
        f"find {store} -name objects",
        f"echo {forged!r} >> {records}",
        f"test -e {store}",
    ):
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, core.call_context())
        assert result.is_error, (code, result.text())
    assert [c.turn for c in core.checkpoints.live()] == [1]
    assert len(records.read_text().splitlines()) == 1 and store.is_dir()
    await core.close()


async def test_a_git_the_turn_planted_on_the_path_is_never_what_snapshots_run(tmp_path, monkeypatch):
    """With a project's virtualenv activated, its bin directory leads the PATH, and the model's code
    writes the cwd: a `git` it planted there ran, as the user and unsandboxed, at the snapshot
    ending the very turn that wrote it. Snapshots run the system's git."""
    cwd = _project(tmp_path / "p")
    escaped = tmp_path / "escaped"
    monkeypatch.setenv("PATH", f"{cwd}/.venv/bin:{os.environ['PATH']}")
    plant = (
        f"mkdir -p .venv/bin && printf '#!/bin/sh\\necho ran >> {escaped}\\nexec /usr/bin/git \"$@\"\\n' "
        "> .venv/bin/git && chmod +x .venv/bin/git && echo 2 > a.txt"
    )
    core = await _session(cwd, [_stage(plant), {"text": "ok"}, _stage("echo 3 > a.txt"), {"text": "ok"}])
    await core.submit("one")
    await core.submit("two")
    assert os.access(cwd / ".venv" / "bin" / "git", os.X_OK)  # planted, and first on the PATH
    assert not escaped.exists()
    assert [c.turn for c in core.checkpoints.live()] == [1, 2]
    assert "restore a.txt" in await commands.run(core, "undo")
    assert (cwd / "a.txt").read_text() == "2\n"
    await core.close()


async def test_a_link_the_turn_planted_is_replaced_not_written_through(tmp_path):
    cwd = _project(tmp_path / "p")
    outside = tmp_path / "outside"
    outside.mkdir()
    # The turn swaps sub/ for a link to a directory outside the cwd, and plants what would make
    # git run code or convert the files it reads: a filter in .gitattributes, a .git file.
    plant = (
        f"rm -rf sub && ln -s {outside} sub; printf '* filter=evil\\n' > .gitattributes; "
        "printf 'gitdir: /nowhere\\n' > .git; echo 2 > a.txt"
    )
    before = _files(cwd)
    core = await _session(cwd, [_stage(plant), {"text": "ok"}])
    await core.submit("plant")
    assert (cwd / "sub").is_symlink()
    await commands.run(core, "undo")
    assert os.listdir(outside) == []  # nothing was written through the link
    assert _files(cwd) == before  # sub/ a directory again, keep.txt in it; .gitattributes gone
    await core.close()


async def test_undo_writes_nothing_where_a_directory_above_the_cwd_was_swapped_for_a_link(tmp_path):
    """A sub-session's cwd lies in its parent's, whose code can swap a directory above it for a
    link: /undo then restored through it, outside the cwd (red-team pass, stop 57)."""
    (tmp_path / "p" / "a").mkdir(parents=True)
    cwd = _project(tmp_path / "p" / "a" / "b")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    core = await _session(cwd, [_stage("echo two > a.txt; rm old.txt"), {"text": "ok"}])
    await core.submit("edit")
    (tmp_path / "p" / "a").rename(tmp_path / "p" / "moved")
    (tmp_path / "p" / "a").symlink_to(outside)
    refused = r"rewind: .*/p/a/b is reached through a symlink \(.*/p/a\).*nothing was changed"
    with pytest.raises(InvalidValue, match=refused):
        await commands.run(core, "undo")
    assert os.listdir(outside / "b") == []
    await core.close()


async def test_a_cwd_a_directory_above_was_swapped_for_a_link_is_not_snapshot_through_it(tmp_path):
    """A sub-session's cwd lies in its parent's, whose code can swap a directory above it for a
    link: each turn's snapshot followed it (and the fork that starts git, which the loop waits on,
    into ollie's own mount: the server hung for good; red-team pass, stop 57)."""
    (tmp_path / "p" / "a").mkdir(parents=True)
    cwd = _project(tmp_path / "p" / "a" / "b")
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "theirs.txt").write_text("not the project's\n")
    notices: list[str] = []
    core = await open_session(
        backend="scripted",
        script=[{"text": "ok"}],
        cwd=str(cwd),
        on_event=lambda e: notices.append(e.text) if e.kind == "info" else None,
    )
    (tmp_path / "p" / "a").rename(tmp_path / "p" / "moved")
    (tmp_path / "p" / "a").symlink_to(outside)
    await core.submit("hello")
    assert any(f"checkpoints: off (the cwd {cwd} is reached through a symlink" in n for n in notices), notices
    with pytest.raises(CheckpointError, match="is reached through a symlink"):
        await Shadow(str(cwd)).snapshot()
    await core.close()


# ---- the file interface ----------------------------------------------------------------------------


def test_ctl_undo_and_the_checkpoints_file_on_the_mount(fs_server):
    work = fs_server.work / "undo-project"
    work.mkdir()
    (work / "notes.txt").write_text("before\n")
    fs_server.agent("editor", turns=[_stage("echo after > notes.txt"), {"text": "edited"}])
    sid = fs_server.new_session(agent="editor", cwd=str(work))
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("edit the notes\n")
    fs_server.wait_idle(sid)
    assert (work / "notes.txt").read_text() == "after\n"
    line = (s / "checkpoints").read_text()
    assert line.startswith("1\tturn 1\t") and "1 file changed" in line and "'edit the notes'" in line
    (s / "ctl").write_text("rewind 1\n")  # a dry run changes nothing, and says nothing in the chat
    assert "going back" not in (s / "chat").read_text()
    (s / "ctl").write_text("undo --chat\n")
    assert (work / "notes.txt").read_text() == "before\n"
    assert (s / "checkpoints").read_text() == ""
    # Whoever follows the chat sees the turn above taken back, as when typed in a prompt.
    assert (s / "chat").read_text().endswith(":: went back to before turn 1 (undid turn 1):\nrestore notes.txt\n")
    with pytest.raises(OSError):
        (s / "ctl").write_text("rewind 1 --bogus\n")


async def test_a_slow_first_snapshot_is_not_waited_for_and_the_next_turn_has_one(tmp_path, monkeypatch):
    from ollie.agent import checkpoints

    cwd = _project(tmp_path / "p")
    infos: list[str] = []
    core = await open_session(
        backend="scripted",
        script=[_stage("echo 1 > a.txt"), {"text": "one"}, _stage("echo 2 > a.txt"), {"text": "two"}],
        cwd=str(cwd),
        on_event=lambda e: infos.append(e.text) if e.kind == "info" else None,
    )
    monkeypatch.setattr(checkpoints, "WAIT_MAX", 0)  # as if the tree were too large to read in time
    await core.submit("one")
    assert (cwd / "a.txt").read_text() == "1\n"  # the turn went on
    assert any("checkpoints: this turn has none: the snapshot of" in i for i in infos)
    assert await commands.run(core, "checkpoints") == "(no checkpoints)"
    monkeypatch.setattr(checkpoints, "WAIT_MAX", 10.0)
    await core.submit("two")
    await commands.run(core, "undo")
    assert (cwd / "a.txt").read_text() == "1\n"  # back to where the second turn started
    await core.close()


async def test_a_session_closed_while_its_first_snapshot_runs_waits_for_it_and_leaves_no_task(tmp_path):
    """A turn stopped twice (an interrupt, then the session's close) while its first snapshot ran
    left that snapshot with no owner: git at work in the cwd after the close, and a task that kept
    the event loop from closing (a server's, a test's). Here the snapshot waits for another
    session's (which holds the lock of the directory's shadow repository a moment), so it is still
    running when the turn is stopped."""
    cwd = _project(tmp_path / "p")
    shadow = Shadow(str(cwd))
    shadow._make()
    held = os.open(shadow.repo / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another session's snapshot of this directory
    asyncio.get_running_loop().call_later(0.5, os.close, held)  # ends in a moment
    core = await open_session(backend="scripted", script=[_stage("true"), {"text": "done"}], cwd=str(cwd))
    snapshots = lambda: [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Shadow.snapshot"]  # noqa: E731
    try:
        assert core.queue("go")
        while not snapshots():
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert core.interrupt()
        await asyncio.sleep(0.05)
        await core.close()
        assert snapshots() == []
    finally:
        await asyncio.sleep(0.6)  # the lock let go, whatever happened


async def test_a_mount_below_the_cwd_is_left_out_of_snapshots(fs_server):
    """ollie's own mount below a session's cwd: reading its files acts (fifo.out pops a prompt,
    statewait blocks), and a server whose snapshot walked its own mount waited on itself."""
    home = fs_server.home  # holds the server's mount at mnt/ollie
    (home / "notes.txt").write_text("mine\n")
    shadow = Shadow(str(home))
    tree = await shadow.snapshot()
    listed = await shadow._git("ls-tree", "-r", "--name-only", tree)
    assert b"notes.txt" in listed and b"mnt/" not in listed
    assert b"/mnt/ollie/" in (shadow.repo / "info" / "exclude").read_bytes()


async def test_ollies_own_directories_below_the_cwd_are_left_out_of_snapshots(tmp_path, monkeypatch):
    """A session working where ollie keeps its data (`ollie srv start` run in that directory, a
    job without a cwd): its snapshots took in ollie's sessions and the shadow repositories
    themselves, growing by the whole of them at every turn."""
    cwd = _project(tmp_path / "work")
    for var, name in (("OLLIE_DATA_PATH", "data"), ("OLLIE_TMP_PATH", "tmp"), ("NAMESPACE", "ns")):
        (cwd / name).mkdir()
        (cwd / name / "f").write_text(var)
        monkeypatch.setenv(var, str(cwd / name))
    core = await _session(cwd, [_stage("echo two > a.txt"), {"text": "done"}, _stage("echo 3 > a.txt"), {"text": "ok"}])
    await core.submit("one")
    await core.submit("two")
    [_, second] = core.checkpoints.live()
    assert second.changes == "1 file changed, 1 insertion(+), 1 deletion(-)"
    listed = (await Shadow(str(cwd))._git("ls-tree", "-r", "--name-only", second.after)).decode().split()
    assert "a.txt" in listed and "sub/keep.txt" in listed
    assert not [n for n in listed if n.split("/")[0] in ("data", "tmp", "ns")], listed
    await core.close()


async def test_a_git_killed_half_way_leaves_no_lock_that_fails_the_snapshots_after_it(tmp_path):
    """A server killed while a snapshot ran (`kill -9`, or a stop past its time) left git's
    index.lock in the shadow repository: every later snapshot of that cwd failed."""
    cwd = _project(tmp_path / "work")
    shadow = Shadow(str(cwd))
    first = await shadow.snapshot()
    (shadow.repo / "index.lock").write_text("")  # as a git killed mid-run leaves it
    (cwd / "new.txt").write_text("new\n")
    second = await shadow.snapshot()
    assert second != first and b"new.txt" in await shadow._git("ls-tree", "--name-only", second)


def test_sessions_of_one_cwd_making_its_shadow_repository_at_once_all_get_a_whole_one(tmp_path):
    """Sessions of one server (one process) whose first turns start together in one cwd (a batch
    job's parallel runs) each make the directory's shadow repository in a thread: they built it in
    one temporary directory named by the process alone, each emptying the others' work, and one
    could move a half-made repository in place ("not a git repository" at every snapshot)."""
    from concurrent.futures import ThreadPoolExecutor

    cwd = _project(tmp_path / "p")
    for round_ in range(5):
        shadows = [Shadow(str(cwd)) for _ in range(8)]
        shutil.rmtree(shadows[0].repo, ignore_errors=True)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s._make(), shadows))
        repo = shadows[0].repo
        assert (repo / "HEAD").is_file() and (repo / "config").is_file(), round_
        assert (repo / "info" / "attributes").is_file() and (repo / "objects").is_dir(), round_
        assert not [p for p in repo.parent.iterdir() if p.name.startswith(".")], "a temporary directory left"


async def test_many_sessions_of_one_cwd_snapshotting_at_once_never_starve_the_loops_threads(tmp_path):
    """Each session waited for the directory's lock in a thread of the loop's default pool: as
    many sessions of one cwd as the pool has threads (a server's sub-agents in one project) held
    them all waiting, and the session that had the lock needed one of them to go on: the whole
    process stalled for good. Here the pool has two threads and six sessions start at once; and
    while they run, the pool still serves others."""
    from concurrent.futures import ThreadPoolExecutor

    cwd = _project(tmp_path / "p")
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(2)
    loop.set_default_executor(pool)
    cores = [await _session(cwd, [_stage(f"echo {i} > f{i}.txt"), {"text": "done"}]) for i in range(6)]
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(core.submit("go") for core in cores))
            assert await asyncio.to_thread(lambda: "served") == "served"
        assert all(core.reply == "done" for core in cores)
        assert sorted(p.name for p in cwd.glob("f*.txt")) == [f"f{i}.txt" for i in range(6)]
        for core in cores:
            assert (await commands.run(core, "checkpoints")).startswith("1\tturn 1\t")
    finally:
        for core in cores:
            await core.close()


async def test_sessions_of_one_cwd_asking_at_once_share_a_snapshot_taken_after_they_asked(tmp_path, monkeypatch):
    """Sub-agents or a job's runs in one project each took a `git status` of it, one after
    another. A snapshot asked for while another waits its turn is that one: it starts after the
    asking, so each turn's first snapshot still comes before its own change, and its last after."""
    runs = 0
    take = Shadow._snapshot

    async def counted(self):
        nonlocal runs
        runs += 1
        return await take(self)

    monkeypatch.setattr(Shadow, "_snapshot", counted)
    cwd = _project(tmp_path / "p")
    cores = [await _session(cwd, [_stage(f"echo {i} > f{i}.txt"), {"text": "done"}]) for i in range(6)]
    try:
        await asyncio.gather(*(core.submit("go") for core in cores))
        assert runs <= 7 < 12  # the six first snapshots were one; twelve asked for
        shadow = Shadow(str(cwd))
        for i, core in enumerate(cores):
            [turn] = core._rt.checkpoints.records()
            before = await shadow._git("ls-tree", "--name-only", turn.before)
            after = await shadow._git("ls-tree", "--name-only", turn.after)
            assert f"f{i}.txt".encode() not in before.split() and f"f{i}.txt".encode() in after.split()
    finally:
        for core in cores:
            await core.close()


async def test_snapshots_of_many_directories_at_once_run_a_few_at_a_time(tmp_path, monkeypatch):
    """Hundreds of sessions' turns starting together, each in a project of its own, ran as many
    `git`s at once (a first snapshot reads every file of its tree)."""
    from ollie.agent import checkpoints

    monkeypatch.setattr(checkpoints, "_SNAPSHOTS", 2)
    running = most = 0
    take = Shadow._snapshot

    async def counted(self):
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            return await take(self)
        finally:
            running -= 1

    monkeypatch.setattr(Shadow, "_snapshot", counted)
    cwds = [_project(tmp_path / f"p{i}") for i in range(6)]
    cores = [await _session(cwd, [_stage("echo x > new.txt"), {"text": "done"}]) for cwd in cwds]
    try:
        await asyncio.gather(*(core.submit("go") for core in cores))
        assert most == 2
        for core, cwd in zip(cores, cwds, strict=True):
            assert (await commands.run(core, "checkpoints")).startswith("1\tturn 1\t")
            assert "delete new.txt" in await commands.run(core, "undo") and not (cwd / "new.txt").exists()
    finally:
        for core in cores:
            await core.close()


async def test_a_cwd_on_ollies_mount_is_never_snapshot(fs_server):
    """`ollie run` started in a directory of the mount, or a program's `open_session` given one:
    the first snapshot read every file there, and a file of the mount acts when read (a
    `fifo.out` pops a queued prompt, `statewait` blocks until the state changes)."""
    inside = fs_server.mnt / "s"
    infos: list[str] = []
    core = await open_session(
        backend="scripted",
        script=[{"text": "ok"}],  # a turn's first snapshot starts with it, tool call or not
        cwd=str(inside),
        on_event=lambda e: infos.append(e.text) if e.kind == "info" else None,
    )
    try:
        async with asyncio.timeout(60):
            await core.submit("go")
        assert any(
            i.startswith(f"checkpoints: off (the cwd is on ollie's file server's mount {fs_server.mnt})") for i in infos
        )
        assert not Shadow(str(inside)).repo.exists()
    finally:
        await core.close()
