"""Checkpoints: what each turn changed in the session's cwd, kept so that `/undo` and `/rewind` can
take it back.

Before a turn's first tool call (the first thing that may change a file) the cwd is snapshot, and
again when the turn ends; the pair is the turn's checkpoint. A snapshot is a tree in a shadow git
repository per working directory, `$OLLIE_DATA_PATH/checkpoints/<hash>/`, whose work tree is the
cwd: in ollie's data, hidden from the sandbox, so the code a checkpoint guards against can neither
reach nor forge one. The project's own `.git` is never read or written, and git reads no
configuration but the shadow repository's (no global or system file: nobody's hook, filter or
fsmonitor runs; attributes cannot convert what is stored). The repository's index is a stat cache,
so a snapshot reads only the files whose stat changed since the last one.

Not covered: what the project's `.gitignore` leaves out, a file over MAX_FILE bytes when first
seen, nested repositories, and anything outside the cwd (a policy's other `rw` grants).

Going back writes by descriptor: each directory on the way is opened without following a symlink
(one the turn left there is removed, never followed), and each file is written beside its name and
renamed over it. A file changed since the turn ended (by hand, or by another program) is named and
left alone unless the user says to go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import config, paths
from ..threads import in_own_thread
from ..types import InvalidValue, OllieError

MAX_FILE = 8 * 1024 * 1024  # bytes: a larger file, when first seen, is left out of checkpoints
WAIT_MAX = 10.0  # seconds a turn's first tool call waits for the snapshot before it
_ATTRIBUTES = "* -text !eol -ident -filter !working-tree-encoding\n"  # stored as the bytes on disk


class CheckpointError(OllieError):
    """A checkpoint could not be taken or used."""


@dataclass
class Checkpoint:
    turn: int  # the turn's number in this session (1 for the first checkpointed turn)
    prompt: str
    time: float
    cwd: str
    before: str  # the tree before the turn's first tool call
    after: str = ""  # the tree when it ended ("" while it runs, or if that snapshot failed)
    history: int = 0  # messages in the history when the turn started
    undone: bool = False
    changes: str = ""  # what the turn changed (git's --shortstat), found once, when it ended


_SKIPPED = Checkpoint(0, "", 0.0, "", "")  # a turn whose first snapshot was not waited for


@dataclass
class Plan:
    """What going back to `target` would do: paths to write back (with their git mode and blob),
    paths to delete, and paths changed since the checkpoint that it would overwrite."""

    target: Checkpoint
    restore: list[tuple[str, str, str]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    changed_since: list[str] = field(default_factory=list)
    keep_dirs: set[str] = field(default_factory=set)  # directories the target tree has

    def describe(self) -> str:
        lines = [f"restore {p}" for p, _, _ in self.restore] + [f"delete {p}" for p in self.delete]
        return "\n".join(lines) or "(no file to change)"


def enabled() -> str:
    """Why checkpoints are off ("" when they are on)."""
    if os.environ.get("OLLIE_CHECKPOINTS", "on").lower() in ("0", "off", "no", "false"):
        return "OLLIE_CHECKPOINTS is off"
    if not os.path.isabs(config.system_program("git")):  # the one snapshots run
        return f"no git in {config.SYSTEM_BIN} (checkpoints run the system's, never one found on PATH)"
    return ""


class Checkpoints:
    """The checkpoints of one session: its records in `record_file`, its snapshots in the shadow
    repository of each cwd it worked in."""

    def __init__(self, record_file: Callable[[], Path], emit_info: Callable[[str], None]) -> None:
        self._record_file = record_file  # in the session's store, which a rename moves
        self._emit = emit_info
        self._off = enabled()
        self._told = False
        self._records: list[Checkpoint] | None = None
        self._turn: Checkpoint | None = None  # the running turn's, once a tool call is about to run
        self._before: asyncio.Future[str] | None = None  # the running turn's first snapshot, being taken
        self._snapshots: set[asyncio.Future[str]] = set()  # first snapshots not ended yet: close waits for them
        self._started: tuple[str, int, str, float] = ("", 0, "", 0.0)  # its prompt, history length, cwd, time

    # ---- the turn's side -------------------------------------------------------------------------
    def turn_started(self, prompt: str, history: int, cwd: str) -> None:
        """Start the turn's first snapshot; it runs while the model answers the first request, so
        that the turn waits for it only if that answer comes sooner (a tool call must not change
        the cwd before it is taken)."""
        self._turn = None
        if why := self._off or _refused_cwd(cwd):
            if not self._told:
                self._told = True
                self._emit(f"checkpoints: off ({why}); /undo cannot take back what this session changes")
            self._before = None
            return
        title = prompt.strip().splitlines()[0][:200] if prompt.strip() else ""
        self._started = (title, history, cwd, time.time())
        self._before = asyncio.ensure_future(Shadow(cwd).snapshot())
        self._snapshots.add(self._before)
        self._before.add_done_callback(self._snapshots.discard)

    async def before_change(self) -> None:
        """Before each tool call: the turn's first snapshot must be taken (once a turn). One that
        takes longer than WAIT_MAX (the first of a large tree reads every file) is not waited for:
        the turn goes on without a checkpoint, and the snapshot ends in the background."""
        if self._before is None or self._turn is not None:
            return
        done, _ = await asyncio.wait({self._before}, timeout=WAIT_MAX)
        if not done:
            self._emit(
                f"checkpoints: this turn has none: the snapshot of {self._started[2]} is still being taken "
                "(the first of a large tree reads every file); the next turns will have one"
            )
            self._turn = _SKIPPED
            return
        before = await self._taken()
        if before:
            prompt, history, cwd, started = self._started
            self._turn = Checkpoint(len(self.records()) + 1, prompt, started, cwd, before, history=history)

    async def _taken(self) -> str:
        """The turn's first snapshot ("" if it failed, said in the chat); never cancelled half-way,
        as git would leave its lock behind."""
        task, self._before = self._before, None
        if task is None:
            return ""
        try:
            return await asyncio.shield(task)
        except (CheckpointError, OSError) as e:
            self._emit(f"checkpoints: no checkpoint of this turn: {e}")
            return ""

    async def close(self) -> None:
        """Let a first snapshot still being taken end: one whose turn was stopped twice (an
        interrupt, then the close) is no longer awaited by the turn. It is never cancelled
        half-way, and a session that closes leaves no git of its own running."""
        self._before = None
        if self._snapshots:
            await asyncio.gather(*self._snapshots, return_exceptions=True)

    async def turn_ended(self) -> None:
        """Snapshot the cwd again and keep the turn's checkpoint (a turn that called no tool keeps
        none: its first snapshot is only waited for)."""
        turn, self._turn = self._turn, None
        if turn is None or turn is _SKIPPED:
            await self._taken()
            return
        try:
            shadow = Shadow(turn.cwd)
            turn.after = await shadow.snapshot()
            turn.changes = await shadow.shortstat(turn.before, turn.after)
        except (CheckpointError, OSError) as e:
            self._emit(f"checkpoints: the end of this turn was not recorded: {e}")
        self._append(asdict(turn))
        self.records().append(turn)

    # ---- the user's side -------------------------------------------------------------------------
    def records(self) -> list[Checkpoint]:
        if self._records is None:
            self._records = _load(self._record_file())
        return self._records

    def live(self) -> list[Checkpoint]:
        """The checkpoints not undone, oldest first."""
        return [c for c in self.records() if not c.undone and c.after]

    def listing(self) -> str:
        """One line per checkpoint, newest first: its number for /rewind, its turn, time, what the
        turn changed and its prompt (from the records alone: reading it runs nothing)."""
        lines = []
        for back, c in enumerate(reversed(self.live()), 1):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.time))
            lines.append(f"{back}\tturn {c.turn}\t{when}\t{c.changes or 'no file changed'}\t{c.prompt!r}")
        return "\n".join(lines) + "\n" if lines else ""

    async def plan(self, back: int) -> Plan:
        """What going back `back` checkpoints would change (nothing is changed)."""
        live = self.live()
        if back < 1:
            raise InvalidValue("rewind: give how many checkpoints to go back, 1 or more (/checkpoints lists them)")
        if not live:
            raise InvalidValue(
                "no checkpoint to go back to: this session's turns changed no file yet (or checkpoints are off)"
            )
        if back > len(live):
            raise InvalidValue(f"only {len(live)} checkpoint(s) to go back to (/checkpoints lists them)")
        chosen = live[-back:]
        if len({c.cwd for c in chosen}) > 1:
            raise InvalidValue("rewind: those turns worked in different directories; go back through each with /undo")
        cwd = chosen[0].cwd  # (real when the turns ran: code around it may have swapped a directory for a link)
        if problem := await asyncio.to_thread(paths.real_dir_problem, cwd):
            raise InvalidValue(f"rewind: {cwd} {problem}; nothing was changed")
        return await Shadow(cwd).plan(chosen[0], chosen[-1].after)

    async def rewind(self, back: int, force: bool = False) -> tuple[Plan, list[Checkpoint]]:
        """Go back `back` checkpoints; returns the plan carried out and the checkpoints undone."""
        plan = await self.plan(back)
        if plan.changed_since and not force:
            names = ", ".join(plan.changed_since[:10]) + (" …" if len(plan.changed_since) > 10 else "")
            raise InvalidValue(
                f"not going back: changed since the checkpoint (by hand?), and would be overwritten: {names}; "
                "add --force to overwrite them"
            )
        await Shadow(plan.target.cwd).apply(plan)
        undone = self.live()[-back:]
        for c in undone:
            c.undone = True
        self._append({"undone": [c.turn for c in undone]})
        return plan, undone

    def _append(self, record: dict[str, object]) -> None:
        path = self._record_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


class _Queue:
    """A shadow repository's sessions in this process (on one loop): their turns at its lock, and
    the snapshot that waits for its turn, which whoever asks for one joins."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.next: asyncio.Future[str] | None = None


# Snapshots under way at once on one loop, of any directories: hundreds of sessions' turns that
# start together (each in a project of its own) ran as many `git`s at once.
_SNAPSHOTS = 2 * max(2, os.cpu_count() or 1)


class _Snapshots:
    """This process's snapshots on one loop: each shadow repository's queue, the slots of those
    under way at once, and the shared ones running (held until they end)."""

    def __init__(self) -> None:
        self.queues: dict[Path, _Queue] = {}
        self.slots = asyncio.Semaphore(_SNAPSHOTS)
        self.running: set[asyncio.Future[str]] = set()


_ON_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Snapshots] = weakref.WeakKeyDictionary()


def _snapshots() -> _Snapshots:
    loop = asyncio.get_running_loop()
    if (found := _ON_LOOP.get(loop)) is None:
        found = _ON_LOOP[loop] = _Snapshots()
    return found


def _queue(repo: Path) -> _Queue:
    """The running loop's queue of `repo`."""
    queues = _snapshots().queues
    if (queue := queues.get(repo)) is None:
        queue = queues[repo] = _Queue()
    return queue


async def _lock_file(fd: int) -> None:
    """An exclusive flock on `fd`: at once if it is free, else waited for in a thread of its own
    (for as long as another process's snapshot takes: none of the loop's pool). The thread locks
    a copy of `fd` (the same open file, the same lock), which it closes once it has the lock: a
    wait abandoned (the turn stopped, `fd` closed) then lets the lock go as soon as it is had."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    copy = os.dup(fd)

    def wait() -> None:
        try:
            fcntl.flock(copy, fcntl.LOCK_EX)
        finally:
            os.close(copy)

    await in_own_thread(wait, "ollie-checkpoint-lock")


def _load(path: Path) -> list[Checkpoint]:
    found: dict[int, Checkpoint] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
            if "turn" not in record:  # an undo's record: the turns it undid
                for turn in record["undone"]:
                    if turn in found:
                        found[turn].undone = True
            else:
                c = Checkpoint(**record)
                found[c.turn] = c
        except (ValueError, TypeError, KeyError):
            continue  # a line torn by a crash: the others stand
    return sorted(found.values(), key=lambda c: c.turn)


def _refused_cwd(cwd: str) -> str:
    """Why a cwd is not checkpointed: the root or the home directory (a whole tree of someone's
    files, not a project), or a mount of ollie's file server, whose files act when read (a
    snapshot reads every file: `fifo.out` would pop prompts, `statewait` would block)."""
    if mount := config.ollie_mount_of(cwd):  # by name: a lookup there may be this very process's
        return f"the cwd is on ollie's file server's mount {mount}"
    # (kept real: one a symlink replaced since, by the code of a session around it, is not followed,
    # on this loop, into wherever it leads, this process's mount included)
    if problem := paths.real_dir_problem(cwd):
        return f"the cwd {cwd} {problem}"
    if cwd in ("/", os.path.realpath(os.path.expanduser("~"))):
        return f"the cwd is {cwd}, not a project directory"
    return ""


# ---- the shadow repository ------------------------------------------------------------------------


class Shadow:
    """The shadow repository of one working directory."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd  # a real path, as sessions keep theirs
        key = hashlib.sha256(self.cwd.encode()).hexdigest()[:20]
        self.repo = config.data_path() / "checkpoints" / key

    def _env(self) -> dict[str, str]:
        return {
            "PATH": config.SYSTEM_BIN,  # git's own helpers: never a project's .venv/bin, code's to fill
            "HOME": str(self.repo),  # no ~/.config/git of anyone's
            "LC_ALL": "C",
            "GIT_DIR": str(self.repo),
            "GIT_WORK_TREE": ".",  # its cwd, the work tree's descriptor (`_git`)
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_NO_REPLACE_OBJECTS": "1",
            # A cwd another user owns is no risk here: nothing of the work tree's configures git.
            "GIT_CONFIG_COUNT": "2",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "GIT_CONFIG_KEY_1": "core.excludesFile",  # the files too large to keep (info/exclude: mounts)
            "GIT_CONFIG_VALUE_1": str(self.repo / "large-files"),
            "GIT_AUTHOR_NAME": "ollie",
            "GIT_AUTHOR_EMAIL": "ollie@localhost",
            "GIT_COMMITTER_NAME": "ollie",
            "GIT_COMMITTER_EMAIL": "ollie@localhost",
        }

    async def _git(self, *args: str, stdin: bytes | None = None, fatal_only: bool = False) -> bytes:
        """Run git on the shadow repository; CheckpointError if it fails (with `fatal_only`, only
        if it gave up: `add --ignore-errors` exits 1 for a file that vanished while it ran).
        It starts in the work tree by its descriptor, opened through no symlink: by its path, a link
        put in place of a directory on the way would lead git, and the fork that starts it (which
        this loop waits on), wherever it points, this process's own mount included."""
        try:
            tree = paths.open_real(self.cwd)
        except OSError as e:
            raise CheckpointError(f"the cwd {self.cwd} {paths.real_dir_problem(self.cwd) or e}") from None
        try:
            proc = await asyncio.create_subprocess_exec(
                config.system_program("git"),  # it runs as the user, unsandboxed: the system's alone
                *args,
                cwd=f"/proc/self/fd/{tree}",
                pass_fds=(tree,),
                env=self._env(),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        finally:
            os.close(tree)
        out, err = await proc.communicate(stdin)
        if proc.returncode and not (fatal_only and proc.returncode == 1):
            raise CheckpointError(f"git {args[0]} failed: {err.decode(errors='replace').strip()[:300]}")
        return out

    def _make(self) -> None:
        if (self.repo / "HEAD").is_file():
            return
        self.repo.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A directory of this call's own: sessions of one process making it at once (a job's
        # parallel runs) each build theirs, and the first rename wins whole.
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.repo.name}.", dir=self.repo.parent))
        (tmp / "objects").mkdir()
        (tmp / "refs" / "heads").mkdir(parents=True)
        (tmp / "info").mkdir()
        (tmp / "HEAD").write_text("ref: refs/heads/checkpoints\n")
        (tmp / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tautocrlf = false\n\tsymlinks = true\n"
            "\tfsmonitor = false\n\tuntrackedCache = true\n\tquotePath = false\n"
            "[gc]\n\tauto = 0\n[advice]\n\taddEmbeddedRepo = false\n\taddIgnoredFile = false\n"
        )
        (tmp / "info" / "attributes").write_text(_ATTRIBUTES)
        (tmp / "info" / "exclude").write_text("")
        (tmp / "cwd").write_text(self.cwd + "\n")  # which directory this is, for whoever looks
        try:
            os.rename(tmp, self.repo)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):  # another session made it first
                raise

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        """One snapshot or restore of this directory at a time, whichever session takes it: the
        sessions of this process queue on the loop, and only the first of them waits for the
        file's lock (another process's session), in a thread of its own. (Each waited in a thread
        of the loop's pool: as many sessions of one cwd as it has threads took them all, and the
        one holding the lock needed one to go on.)"""
        await asyncio.to_thread(self._make)
        async with _queue(self.repo).lock:
            fd = os.open(self.repo / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                await _lock_file(fd)
                # Every git that writes this repository runs under this lock: an index lock found
                # now is one a git killed half-way left (its server killed), and would fail every
                # snapshot to come.
                (self.repo / "index.lock").unlink(missing_ok=True)
                yield
            finally:
                os.close(fd)  # releases the lock

    async def snapshot(self) -> str:
        """The tree of the cwd as it is now (its files, the links in it, their modes). The
        sessions of this process that ask for one while another's still waits its turn share
        that one: it starts after they asked, so it holds what theirs would have (sub-agents or a
        job's runs in one project took one `git status` each, one after another). Never
        cancelled half-way by one who asked (git would leave its lock behind)."""
        queue, running = _queue(self.repo), _snapshots().running
        if queue.next is None or queue.next.done():  # (done: it failed before its turn)
            queue.next = asyncio.ensure_future(self._snapshot_in_turn(queue))
            running.add(queue.next)
            queue.next.add_done_callback(running.discard)
        return await asyncio.shield(queue.next)

    async def _snapshot_in_turn(self, queue: _Queue) -> str:
        async with self._locked(), _snapshots().slots:
            queue.next = None  # under way: whoever asks from now on waits for the next
            return await self._snapshot()

    async def _snapshot(self) -> str:
        """`git status` names what changed since the last snapshot (its index and untracked cache
        make an unchanged file cost a stat, an unchanged directory too); only that is added, and a
        new tree is committed only when it differs."""
        await asyncio.to_thread(self._exclude_not_the_projects)
        out = await self._git(
            "status", "--porcelain=v2", "-z", "--untracked-files=normal", "--no-renames", "--ignore-submodules=all"
        )
        changed: list[bytes] = []
        gone: list[bytes] = []
        new: list[bytes] = []
        for entry in out.split(b"\0"):
            if entry[:1] in (b"1", b"u") and entry[3:4] != b".":  # the file differs from the index
                (gone if entry[3:4] == b"D" else changed).append(entry.split(b" ", 8)[8])
            elif entry[:1] == b"?":
                new.append(entry[2:])
        big = await asyncio.to_thread(self._exclude_large, new)
        new = [n for n in new if os.fsdecode(n) not in big]
        last_tree = _read(self.repo / "last-tree")
        if not changed and not gone and not new and last_tree:
            return last_tree
        if gone:  # by name: one behind a symlink the turn put on its way counts as gone, not followed
            await self._git("update-index", "-z", "--force-remove", "--stdin", stdin=b"\0".join(gone) + b"\0")
        if changed:
            await self._git("update-index", "-z", "--add", "--remove", "--stdin", stdin=b"\0".join(changed) + b"\0")
        if new:  # new files, and new directories whole (as .gitignore leaves them)
            add = ("add", "-A", "--ignore-errors", "--pathspec-from-file=-", "--pathspec-file-nul")
            await self._git(*add, stdin=b"\0".join(new) + b"\0", fatal_only=True)
        tree = (await self._git("write-tree")).decode().strip()
        if tree != last_tree:
            parent = _read(self.repo / "refs" / "heads" / "checkpoints")
            commit = await self._git("commit-tree", tree, "-m", "checkpoint", *(["-p", parent] if parent else []))
            _write(
                self.repo / "refs" / "heads" / "checkpoints", commit.decode().strip()
            )  # HEAD: status compares with it
            _write(self.repo / "last-tree", tree)
        return tree

    def _exclude_not_the_projects(self) -> None:
        """Keep what is mounted below the cwd out (another file system; ollie's own mount, whose
        files act when read), and ollie's own directories there (its data, the shadow
        repositories among it, its scratch): info/exclude names them, rewritten only when they
        change, since git's untracked cache starts again when it does."""
        below = sorted({*_mounts_below(self.cwd), *_ollies_own_below(self.cwd)})
        text = "".join("/" + _escape(m) + "/\n" for m in below)
        if _read(self.repo / "info" / "exclude") != text.strip():
            _write(self.repo / "info" / "exclude", text.rstrip("\n"))

    def _exclude_large(self, new: list[bytes]) -> list[str]:
        """The new files over MAX_FILE (in new directories too), added to the excluded ones."""
        big = [p for n in new for p in _large_files(self.cwd, os.fsdecode(n))]
        if big:
            with open(self.repo / "large-files", "a") as f:
                f.write("".join("/" + _escape(p) + "\n" for p in big))
        return big

    async def shortstat(self, a: str, b: str) -> str:
        if a == b:
            return ""
        return (await self._git("diff-tree", "--shortstat", "--no-renames", a, b)).decode().strip()

    async def plan(self, target: Checkpoint, last: str) -> Plan:
        """Going back to `target.before` from `last` (the tree the last turn left), with the cwd as
        it is now."""
        async with self._locked():
            now = await self._snapshot()
            changed = _names(
                await self._git("diff-tree", "-r", "-z", "--no-renames", "--name-only", target.before, last)
            )
            since = set(_names(await self._git("diff-tree", "-r", "-z", "--no-renames", "--name-only", last, now)))
            entries = await self._entries(target.before)
        plan = Plan(target, changed_since=sorted(p for p in changed if p in since))
        plan.keep_dirs = {os.path.dirname(p) for p in entries}
        plan.keep_dirs |= {d for p in list(plan.keep_dirs) for d in _parents(p)}
        for path in changed:
            if path in entries:
                mode, blob = entries[path]
                plan.restore.append((path, mode, blob))
            else:
                plan.delete.append(path)
        return plan

    async def _entries(self, tree: str) -> dict[str, tuple[str, str]]:
        out = await self._git("ls-tree", "-r", "-z", "--full-tree", tree)
        entries = {}
        for line in out.split(b"\0"):
            if line:
                meta, _, path = line.partition(b"\t")
                mode, _, blob = meta.decode().split(" ")
                entries[os.fsdecode(path)] = (mode, blob)
        return entries

    async def apply(self, plan: Plan) -> None:
        """Carry out `plan` in the cwd: deletions first, the deepest first, then what it restores."""
        blobs = await self._blobs([blob for _, mode, blob in plan.restore if mode != "160000"])
        async with self._locked():
            await asyncio.to_thread(_write_back, self.cwd, plan, blobs)
            await self._snapshot()  # the index as the disk now is: the next snapshot starts from it

    async def _blobs(self, ids: list[str]) -> dict[str, bytes]:
        if not ids:
            return {}
        out = await self._git("cat-file", "--batch", stdin="".join(f"{i}\n" for i in ids).encode())
        blobs, at = {}, 0
        for _ in ids:
            header_end = out.index(b"\n", at)
            oid, _, size = out[at:header_end].decode().split(" ")
            start = header_end + 1
            blobs[oid] = out[start : start + int(size)]
            at = start + int(size) + 1
        return blobs


def _names(out: bytes) -> list[str]:
    return [os.fsdecode(n) for n in out.split(b"\0") if n]


def _parents(path: str) -> list[str]:
    found = []
    while path:
        path = os.path.dirname(path)
        found.append(path)
    return found


def _large_files(cwd: str, rel: str) -> list[str]:
    """The files over MAX_FILE at `rel` (a new file, or a new directory: `git status` names one
    whole), relative to `cwd`; symlinks are not followed."""
    top = os.path.join(cwd, rel.rstrip("/"))
    if not rel.endswith("/"):
        return [rel] if _size(top) > MAX_FILE else []
    found = []
    for here, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(here, d))]
        found += [os.path.relpath(os.path.join(here, n), cwd) for n in names if _size(os.path.join(here, n)) > MAX_FILE]
    return found


def _mounts_below(cwd: str) -> list[str]:
    """The mount points below `cwd`, relative to it."""
    prefix = cwd.rstrip("/") + "/"
    return sorted({point[len(prefix) :] for point, _ in config.mounts() if point.startswith(prefix)})


def _ollies_own_below(cwd: str) -> list[str]:
    """ollie's data, scratch and namespace directories where they lie below `cwd`, relative to
    it (a session working in the directory that holds them snapshot its own shadow repository,
    growing at every turn)."""
    prefix = cwd.rstrip("/") + "/"
    own = (os.path.realpath(d) for d in (config.data_path(), config.tmp_path(), config.namespace_path()))
    return [d[len(prefix) :] for d in own if d.startswith(prefix)]


def _size(path: str) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _write(path: Path, text: str) -> None:
    """Replace `path` whole (a crash leaves the old text or the new, never half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _escape(path: str) -> str:
    """A path as a gitignore pattern matching only itself."""
    return "".join("\\" + ch if ch in "\\*?[!# " else ch for ch in path)


# ---- writing back, by descriptor ------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_back(cwd: str, plan: Plan, blobs: dict[str, bytes]) -> None:
    try:  # (a real path: one a symlink replaced since, by the code of a session around it, leads elsewhere)
        root = paths.open_real_dir(cwd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InvalidValue(f"rewind: {cwd} is reached through a symlink now; nothing was restored") from None
        raise
    try:
        for path in sorted(plan.delete, key=lambda p: p.count("/"), reverse=True):
            parent = _walk(root, path, create=False)
            if parent is None:
                continue
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.basename(path), dir_fd=parent)
            finally:
                os.close(parent)
            _prune(root, os.path.dirname(path), plan.keep_dirs)
        for path, mode, blob in plan.restore:
            if mode == "160000":
                continue  # a nested repository: not ours to write
            parent = _walk(root, path, create=True)
            assert parent is not None
            try:
                _put(parent, os.path.basename(path), mode, blobs[blob])
            finally:
                os.close(parent)
    finally:
        os.close(root)


def _walk(root: int, path: str, create: bool) -> int | None:
    """The directory that holds `path`, opened from `root` without following a symlink. With
    `create`, what is in the way (a file, a symlink) is removed and the directory made; without,
    None when it is not there as a directory."""
    fd = os.dup(root)
    try:
        for part in path.split("/")[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                in_the_way = e.errno in (errno.ENOTDIR, errno.ELOOP)  # a file, or a symlink
                if not create or not (in_the_way or e.errno == errno.ENOENT):
                    if create:
                        raise
                    os.close(fd)
                    return None
                if in_the_way:
                    os.unlink(part, dir_fd=fd)
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _put(parent: int, name: str, mode: str, data: bytes) -> None:
    """Write `name` in `parent` as the checkpoint had it, replacing what is there (a symlink is
    replaced, not followed; a directory in its place is removed first if empty)."""
    tmp = f".{name}.ollie-{os.getpid()}-{time.monotonic_ns()}"
    if mode == "120000":
        os.symlink(os.fsdecode(data), tmp, dir_fd=parent)
    else:
        perm = _permissions(parent, name, executable=mode == "100755")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, perm, dir_fd=parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, perm)
        finally:
            os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except IsADirectoryError:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent)
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise


def _permissions(parent: int, name: str, executable: bool) -> int:
    """The mode to write `name` with: git keeps only whether a file is executable, so a file still
    there keeps its other bits (a private file stays private), and one that is back gets git's
    (0644 or 0755) less the umask."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        base = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        base = None
    if base is None:
        return (0o755 if executable else 0o644) & ~_umask()
    readable = (base & 0o444) >> 2  # x where r is, as git sets it
    return (base | readable) if executable else (base & ~0o111)


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread
    meanwhile)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _prune(root: int, directory: str, keep: set[str]) -> None:
    """Remove `directory` and its parents while they are empty and the checkpoint had none there."""
    while directory and directory not in keep:
        parent = _walk(root, directory, create=False)
        if parent is None:
            return
        try:
            os.rmdir(os.path.basename(directory), dir_fd=parent)
        except OSError:
            return
        finally:
            os.close(parent)
        directory = os.path.dirname(directory)
