"""Plans that persist where the user keeps tasks.

`task_plan` runs sandboxed and writes a plan into the plans directory (pl/ on the mount), which
every session of the user shares. After each tool round the session looks there (`Plans.sync`):
its own plans become its `plan`, and their steps are committed to a task backend as tasks, one
per step, with their dependencies; a step checked (`task_complete`), or the whole plan renamed
`__done`, marks its task done. While a plan is `__wip`, its next step (the first unchecked one)
is claimed: its task is set in progress. A plan revised (the file_* tool scripts sign the
session's own plan anew, see below) has its tasks revised with it: a step added is a new task, a
step whose title or description changed has its task edited, a step removed has its task deleted;
a step is followed across a revision by its title, or, where titles changed, by the place and
likeness of its title. A plan removed from pl/ has its tasks deleted. Tasks done are never
deleted: they are what was done.

The backend is, in this order:
- an MCP server (any tool server of the agent) whose tools include `task_create`, which must
  answer a plain-text id; `task_dep` (dependencies), `task_update` (status in progress, done),
  `task_edit` (title, description) and `task_delete` are used when present (each one missing is
  told once, and what it would do is left undone), and a step's dependencies are in its task's
  description either way;
- the `PlanBackend` a program passed to `open_session(plan_backend=...)`;
- none: the plan lives in pl/ and in the session's `plan` only.
It is chosen again whenever the agent's tool servers change (an agent switch).

Which plans are the session's own. pl/ is writable by the code of every session, so a plan file
proves nothing by being there. Each session has a secret key (`plan.key` in its store, which the
sandbox hides), handed to its own stages as $OLLIE_PLAN_KEY. `task_plan` signs what it wrote: an
HMAC over the plan's file stem, the session id, the goal, the steps and their dependencies (not
the check marks), on the plan's second line. A session commits only plans its own key signed: a
plan another session's code wrote, copied or edited is never committed (one that claims this
session is reported). Check marks are not signed, so another session's code can mark steps done;
it cannot create tasks.

Revisions. The agent revises its plan with file_edit and file_write, as the seed has it. Those
scripts, run by the session's own code (which holds the key), sign a plan anew after writing it,
but only when the plan was this session's and its signature verified before the edit: the key
proves that the edit is the session's own code, the old signature that the plan is the session's
and that no other code changed it since. So a revision of the session's own plan stays its plan,
while a plan another session's code wrote or changed stays refused, even once this session's code
edits it too: the key never signs what others wrote. (The session's code could always sign any
plan, with task_plan's code or its own; signing revisions gives it nothing it did not have.) An
edit made another way (sed, an editor) breaks the signature, and the plan stays as it was signed.

What was committed is kept in the session's store (`plan-tasks.json`: per backend and plan, each
step's task id, dependencies linked, done, claimed, the title and description the task was given;
the tasks of removed steps still to delete), written after every call, so a restart or a failure
half-way creates no task twice. A backend that fails leaves the plan as it is: the user sees why
(an info event), and the rest is committed at a later sync. Plan text is the sandbox's: its size
is bounded, and it only ever travels as data (tool arguments, the session's plan).
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .. import config
from ..tools import CallContext, Server, Tool, ToolResult
from ..types import Event, OllieError

if TYPE_CHECKING:
    from ..tools import Dispatcher
    from .state import SessionState

log = logging.getLogger("ollie.plans")

KEY_VAR = "OLLIE_PLAN_KEY"  # the session's key, in its stages' environment
KEY_FILE = "plan.key"  # in the session's store
MAP_FILE = "plan-tasks.json"  # in the session's store: plan step → task id
SIGNATURE_TAG = "ollie-plan v1"

# Bounds on what a plan may hold (task_plan refuses more; a plan beyond them is not committed).
MAX_PLAN_BYTES = 128 * 1024
MAX_STEPS = 64
MAX_TITLE = 200
MAX_DESCRIPTION = 1000
MAX_GOAL = 200
MAX_TASK_ID = 200

CALL_TIMEOUT = 20.0  # seconds for one call to the backend
SYNC_BUDGET = 30.0  # seconds one sync may spend with the backend; the rest waits for a later one
REST = 120.0  # seconds without commits after the backend was that slow (else every tool round would wait)
MAX_REASON = 300  # characters of a backend's error shown

_NAME = re.compile(r"(?P<stem>\d{8}T\d{6}Z_[0-9a-f]{6}--[^_/]*)__(?P<status>todo|wip|done)\.md")
_SIGNATURE = re.compile(
    r"<!-- ollie-plan v1 session=(?P<sid>[A-Za-z0-9._-]{1,128}) deps=(?P<deps>[0-9,;]*) "
    r"mac=(?P<mac>[0-9a-f]{64}) -->"
)
_STEP = re.compile(r"- \[([ xX])\] ")
_STATUS_ORDER = {"todo": 0, "wip": 1, "done": 2}


# ---- the backend protocol -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    """A plan's step, as it is committed: a task."""

    title: str
    description: str  # the step's description, then its dependencies and the plan it is part of
    goal: str  # the plan's goal
    plan: str  # the plan's file stem (its name without __todo.md), the same in every state


class PlanBackendError(OllieError):
    """A backend could not do what was asked; the message says why."""


class _Slow(PlanBackendError):
    """A call gave no answer in time."""


@runtime_checkable
class PlanBackend(Protocol):
    """Where a session's plans are committed. Pass one to `open_session(plan_backend=...)`: it is
    used when no tool server of the agent offers `task_create`. Raise to say a call failed (it is
    tried again at a later sync); return False to say the backend does not do that at all (it is
    not asked again). An optional `name` attribute names it in what the user sees.

    Optional methods, used when the backend has them (as `MCPTaskBackend` has):
    `async start(task_id) -> bool` (the step is being worked on: in progress),
    `async edit(task_id, task: Task) -> bool` (the step's title or description changed),
    `async delete(task_id) -> bool` (the step, or its plan, was removed before it was done)."""

    async def create(self, task: Task) -> str:
        """Create the task; return its id (a line of text)."""
        ...

    async def link(self, task_id: str, depends_on: str) -> bool:
        """Record that task `task_id` waits on task `depends_on` (both made by `create`)."""
        ...

    async def complete(self, task_id: str) -> bool:
        """Mark the task done."""
        ...


# ---- an MCP task server as a backend ------------------------------------------------------------

# The names a task server's tool may give each argument (its input schema decides which).
_ROLES: dict[str, tuple[str, ...]] = {
    "title": ("title", "name", "summary", "subject"),
    "body": ("description", "body", "details", "content", "notes", "text"),
    "id": ("id", "task_id", "taskId", "task", "issue", "child", "blocked"),
    "dep": ("depends_on", "dependsOn", "blocker", "blocker_id", "blocked_by", "blockedBy", "dependency", "dep", "on"),
    "status": ("status", "state"),
    "action": ("action", "op", "operation", "mode"),
}
_DONE_WORDS = ("done", "closed", "completed", "complete", "finished", "resolved")
_STARTED_WORDS = ("in_progress", "in-progress", "inprogress", "in progress", "started", "doing", "active", "wip")


class MCPTaskBackend:
    """A tool server with `task_create` (and maybe `task_dep`, `task_update`, `task_edit`,
    `task_delete`), called directly: these calls are the session's own, not the model's, so no
    hooks run for them. The arguments follow each tool's input schema; a tool whose schema asks
    for what we cannot fill counts as absent."""

    def __init__(self, server_name: str, server: Server, tools: dict[str, Tool]):
        self.name = f"task server {server_name}"
        self.key = f"mcp:{server_name}"
        self._server = server
        self._tools = tools

    async def create(self, task: Task) -> str:
        tool = self._tools["task_create"]
        args = _arguments(tool, {"title": task.title, "body": task.description}, required=("title",))
        if args is None:
            raise PlanBackendError(f"its task_create takes no title we can give (schema: {_props(tool)})")
        return _task_id(await self._call("task_create", args))

    async def link(self, task_id: str, depends_on: str) -> bool:
        tool = self._tools.get("task_dep")
        args = tool and _arguments(tool, {"id": task_id, "dep": depends_on, "action": "add"}, required=("id", "dep"))
        if not args:
            return False
        await self._call("task_dep", args)
        return True

    async def complete(self, task_id: str) -> bool:
        tool = self._tools.get("task_update")
        if tool is None:
            return False
        args = _arguments(tool, {"id": task_id, "status": _done_word(tool)}, required=("id", "status"))
        if args is None:
            return False
        await self._call("task_update", args)
        return True

    async def start(self, task_id: str) -> bool:
        """Claim the task: its status in progress (when task_update has a word for that)."""
        tool = self._tools.get("task_update")
        word = _status_word(tool, _STARTED_WORDS) if tool else None
        args = _arguments(tool, {"id": task_id, "status": word}, required=("id", "status")) if tool and word else None
        if not args:
            return False
        await self._call("task_update", args)
        return True

    async def edit(self, task_id: str, task: Task) -> bool:
        """Give the task the step's title and description as they are now."""
        tool = self._tools.get("task_edit")
        args = tool and _arguments(tool, {"id": task_id, "title": task.title, "body": task.description}, ("id",))
        if not args or len(args) < 2:  # an id alone changes nothing
            return False
        await self._call("task_edit", args)
        return True

    async def delete(self, task_id: str) -> bool:
        tool = self._tools.get("task_delete")
        args = tool and _arguments(tool, {"id": task_id}, required=("id",))
        if not args:
            return False
        await self._call("task_delete", args)
        return True

    async def _call(self, name: str, args: dict[str, Any]) -> ToolResult:
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                result = await self._server.call_tool(name, args, CallContext())
        except TimeoutError:
            raise _Slow(f"{name} gave no answer within {CALL_TIMEOUT:g} s") from None
        except OllieError as e:
            raise PlanBackendError(f"{name} failed: {e}") from None
        if result.is_error:
            raise PlanBackendError(f"{name} answered an error: {_short(result.text())}")
        return result


def _props(tool: Tool) -> dict[str, Any]:
    props = tool.input_schema.get("properties") if isinstance(tool.input_schema, dict) else None
    return props if isinstance(props, dict) else {}


def _arguments(tool: Tool, values: dict[str, str], required: tuple[str, ...]) -> dict[str, Any] | None:
    """`values` by role, under the names the tool's schema uses; None when a role in `required`
    has no property, or the schema requires a property we have nothing for. A tool that declares
    no properties at all gets the first name of each role."""
    props = _props(tool)
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    if not props:
        return {_ROLES[role][0]: value for role, value in values.items() if role != "action"}
    args: dict[str, Any] = {}
    for role, value in values.items():
        name = next((n for n in _ROLES[role] if n in props), None)
        if name is None:
            if role in required:
                return None
            continue
        if role == "action":
            enum = props[name].get("enum") if isinstance(props[name], dict) else None
            if enum is not None and value not in enum:
                continue
        args[name] = value
    needed = schema.get("required")
    if isinstance(needed, list) and any(n not in args for n in needed):
        return None
    return args


def _done_word(tool: Tool) -> str:
    return _status_word(tool, _DONE_WORDS) or "done"


def _status_word(tool: Tool, words: tuple[str, ...]) -> str | None:
    """The first of `words` the tool's status takes (its enum's spelling); the first word when the
    schema lists no values; None when it lists values and none of these."""
    status = next((p for n, p in _props(tool).items() if n in _ROLES["status"]), None)
    enum = status.get("enum") if isinstance(status, dict) else None
    if not isinstance(enum, list):
        return words[0]
    by_word = {str(v).casefold(): v for v in enum if isinstance(v, str)}
    return next((str(by_word[w]) for w in words if w in by_word), None)


def _task_id(result: ToolResult) -> str:
    """The id task_create answered: its text (or the "id" of a JSON object), one short line."""
    text = result.text().strip()
    if text.startswith("{"):
        try:
            found = json.loads(text).get("id")
            text = str(found).strip() if found is not None else text
        except (ValueError, AttributeError):
            pass
    if not text or len(text) > MAX_TASK_ID or not text.isprintable():
        raise PlanBackendError(f"task_create answered {_short(text)!r}, not a task id (one short line of text)")
    return text


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


# ---- plan files ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    title: str
    description: str
    after: tuple[int, ...]  # the steps it depends on, by index (always earlier ones)
    checked: bool


@dataclass(slots=True)
class PlanFile:
    """A plan this session's key signed, as read from pl/."""

    name: str
    stem: str
    status: str  # todo, wip or done
    goal: str
    steps: list[Step]
    text: str  # the file without its signature line: the session's plan
    mtime: float


def signature(key: bytes, stem: str, sid: str, deps: str, goal_line: str, step_lines: list[str]) -> str:
    """What task_plan writes as mac=: the same computation in both (the steps with their boxes
    unchecked, so checking one keeps the signature)."""
    message = "\n".join([SIGNATURE_TAG, stem, sid, deps, goal_line, *step_lines])
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


@dataclass(slots=True)
class _Signed:
    """What a file in pl/ says of itself, before its signature is checked."""

    sid: str
    deps: str
    mac: str
    goal_line: str
    step_lines: list[str]  # unchecked form
    checked: list[bool]
    text: str


def _read_signed(text: str) -> _Signed | None:
    lines = text.split("\n")
    if len(lines) < 3 or not lines[0].startswith("# "):
        return None
    found = _SIGNATURE.fullmatch(lines[1])
    if found is None:
        return None
    step_lines, checked = [], []
    for line in lines[2:]:
        if m := _STEP.match(line):
            step_lines.append("- [ ] " + line[m.end() :])
            checked.append(m.group(1) != " ")
    rest = "\n".join([lines[0], *lines[2:]])
    return _Signed(found["sid"], found["deps"], found["mac"], lines[0], step_lines, checked, rest)


def _steps_of(signed: _Signed) -> tuple[str, list[Step]]:
    """The goal and the steps of a signed plan (raises ValueError when it breaks the bounds or
    its own structure): each line is "- [ ] title — description (after: titles)"."""
    goal = signed.goal_line[2:].strip()
    if not goal or len(goal) > MAX_GOAL:
        raise ValueError(f"its goal is {'empty' if not goal else f'longer than {MAX_GOAL} characters'}")
    deps = signed.deps.split(";")
    if not signed.step_lines or len(signed.step_lines) > MAX_STEPS or len(deps) != len(signed.step_lines):
        raise ValueError(f"it has {len(signed.step_lines)} steps for {len(deps)} dependency lists (1 to {MAX_STEPS})")
    steps: list[Step] = []
    for i, (line, dep) in enumerate(zip(signed.step_lines, deps, strict=True)):
        after = tuple(int(j) for j in dep.split(",")) if dep else ()
        if any(j >= i for j in after):
            raise ValueError(f"step {i + 1} depends on a step after it")
        body = line[len("- [ ] ") :]
        if after:
            suffix = " (after: " + ", ".join(steps[j].title for j in after) + ")"
            if not body.endswith(suffix):
                raise ValueError(f"step {i + 1} does not end with its dependencies")
            body = body[: -len(suffix)]
        title, _, description = body.partition(" — ")
        title, description = title.strip(), description.strip()
        if not title or len(title) > MAX_TITLE or len(description) > MAX_DESCRIPTION:
            raise ValueError(f"step {i + 1}'s title or description is empty or too long")
        steps.append(Step(title, description, after, signed.checked[i]))
    return goal, steps


_TICK_NS = 2_000_000_000  # a file or directory changed less than this ago may change again unseen
# Every session's code writes pl/, so what a sync does there is bounded, and done in a thread: a
# listing reads at most PLANS_READ_MAX entries, and a sync looks at PLANS_MAX plans at most (the
# newest by name, a name beginning with its UTC time), and at the plans it knows as its own.
PLANS_READ_MAX = 10_000
PLANS_MAX = 256
# The plans directory (pl/), found once per data path: config.shared_dirs() resolves the path and
# makes the directories (a realpath, two mkdirs and their checks), too much for every tool round of
# every session; it is found again if the directory goes missing.
_PLANS_DIR: tuple[str, str] | None = None  # (the settings it was found for, the directory)
# Its plan files, listed once per change of the directory (shared by every session of the process):
# (the directory's (inode, mtime), when listed, the newest plans' names, whether there were more).
_LISTING: tuple[tuple[int, int], int, list[str], bool] | None = None


def _plan_entries() -> tuple[str, list[str], bool]:
    """pl/, the names of its PLANS_MAX newest plan files, and whether it held more (or more than
    PLANS_READ_MAX entries, past which nothing is read); ("", [], False) when it cannot be listed.
    A listing is reused while the directory's inode and mtime stay what they were, and was taken
    more than a clock tick (2 s) after that mtime (a file added in the same tick would leave it
    unchanged)."""
    global _PLANS_DIR, _LISTING
    data = f"{os.environ.get('OLLIE_DATA_PATH')}\0{os.environ.get('HOME')}"  # what config.data_path() reads
    if _PLANS_DIR is None or _PLANS_DIR[0] != data:
        _PLANS_DIR, _LISTING = (data, str(config.shared_dirs()[1])), None  # its errors are sync's to tell
    directory = _PLANS_DIR[1]
    try:
        st = os.stat(directory)
        key, listing = (st.st_ino, st.st_mtime_ns), _LISTING  # read once: syncs of other sessions list too
        if listing is not None and listing[0] == key and listing[1] - st.st_mtime_ns > _TICK_NS:
            return directory, listing[2], listing[3]
        now = time.time_ns()
        with os.scandir(directory) as it:
            read = list(itertools.islice((e.name for e in it), PLANS_READ_MAX + 1))
    except OSError:
        _PLANS_DIR = _LISTING = None  # found (and made) again next time
        return "", [], False
    names = [name for name in read[:PLANS_READ_MAX] if _NAME.fullmatch(name)]
    newest, cut = heapq.nlargest(PLANS_MAX, names), len(read) > PLANS_READ_MAX or len(names) > PLANS_MAX
    _LISTING = (key, now, newest, cut)
    return directory, newest, cut


def _read_file(path: str) -> str | None:
    """A regular file's text, never through a link nor blocking on a FIFO, within the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > MAX_PLAN_BYTES:
            return None
        data = os.read(fd, MAX_PLAN_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[:MAX_PLAN_BYTES].decode("utf-8", "surrogateescape")


# ---- the session's side -------------------------------------------------------------------------


@dataclass(slots=True)
class _Seen:
    """The last reading of one file in pl/: (inode, mtime, size) and what it was to us."""

    stat: tuple[int, int, int]
    plan: PlanFile | None
    problem: str = ""  # why a file that claims this session is not taken


class Plans:
    """One session's plans: it finds them in pl/, shows the newest as the session's plan and
    commits them to the task backend. `sync` never raises but for cancellation: what goes wrong
    is told to the user with `emit`."""

    def __init__(self, state: SessionState, emit: Callable[[Event], None], fallback: PlanBackend | None = None):
        self.state = state
        self.emit = emit
        self.fallback = fallback
        self._key = b""
        self._key_lock = threading.Lock()  # made by a stage's start (the loop) or a sync (its thread)
        self._wired_for: object = None  # the dispatcher the backend was chosen from
        self._backend: PlanBackend | None = None
        self._backend_key = ""  # its part of plan-tasks.json
        self._cannot: set[str] = set()  # "link", "complete": what the backend said it does not do
        self._seen: dict[str, _Seen] = {}  # the files of pl/ as last read
        self._shown = ("", "")  # the plan file last made the session's plan, and its text
        self._told: set[str] = set()
        self._map: dict[str, Any] | None = None
        self._rest_until = 0.0  # time.monotonic() before which the backend, found slow, is left alone

    # ---- the key ----
    def stage_env(self) -> dict[str, str]:
        """What the session's stages get: the key task_plan signs with."""
        try:
            return {KEY_VAR: self.key().hex()}
        except OSError as e:  # the store is unwritable: plans go unsigned, and uncommitted
            self._tell(f"plans cannot be signed: {KEY_FILE} in the session's store: {e.strerror or e}")
            return {}

    def key(self) -> bytes:
        with self._key_lock:
            if not self._key:
                path = self.state.store.dir / KEY_FILE
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                except FileExistsError:
                    self._key = bytes.fromhex(path.read_text().strip())
                else:
                    key = secrets.token_bytes(32)
                    with os.fdopen(fd, "w") as f:
                        f.write(key.hex() + "\n")
                    self._key = key
            return self._key

    # ---- one sync ----
    async def sync(self, dispatcher: Dispatcher) -> None:
        """After a tool round: read the session's plans, show the newest, commit what is new."""
        try:
            mine, gone = await self._scan()
            self._show(mine)
            backend = await self._choose(dispatcher)
            if backend is None or not (mine or gone) or time.monotonic() < self._rest_until:
                return
            try:
                async with asyncio.timeout(SYNC_BUDGET):
                    for plan in sorted(mine, key=lambda p: p.stem):
                        if not await self._commit(plan, backend):
                            return
                    for stem in sorted(gone):
                        if not await self._drop(stem, backend):
                            return
            except TimeoutError:
                self._rest_until = time.monotonic() + REST
                self._tell(
                    f"{_name(backend)}: plans not committed within {SYNC_BUDGET:g} s; what was done is "
                    f"kept, the rest follows at a tool round {REST:g} s from now or later"
                )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never the turn's failure
            log.error("plan sync failed", exc_info=e)
            self._tell(f"plans: sync failed: {type(e).__name__}: {e}")

    def _tell(self, text: str) -> None:
        """An info line for the user, once per session run (a dead server fails every round)."""
        if text in self._told:
            return
        if len(self._told) > 1000:
            self._told.clear()
        self._told.add(text)
        self.emit(Event("info", text))

    # ---- finding the session's plans ----
    async def _scan(self) -> tuple[list[PlanFile], set[str]]:
        """The session's plans in pl/, found in a thread: pl/ is every session's code's to fill,
        and a scan of it on the loop held up every session's tool round for seconds. And the
        stems of the plans with tasks to delete that are gone from pl/ (removed)."""
        seen, cut, gone = await asyncio.to_thread(self._look, self._watched())
        self._seen = seen
        if cut:
            self._tell(
                f"pl/ holds more than {PLANS_MAX} plans (or {PLANS_READ_MAX} files): this session looks "
                f"at the {PLANS_MAX} newest by name, and at its own it found before"
            )
        for name, s in seen.items():
            if s.problem:
                self._tell(f"plan {name} is not committed: {s.problem}")
        return self._latest_per_stem([s.plan for s in seen.values() if s.plan is not None]), gone

    def _watched(self) -> set[str]:
        """The plans whose removal from pl/ would leave tasks to delete: committed, with a task
        not done (or with tasks of removed steps still to delete)."""
        watched: set[str] = set()
        for plans in self._load().get("backends", {}).values():
            for stem, record in plans.items() if isinstance(plans, dict) else ():
                if not isinstance(record, dict):
                    continue
                tasks = record.get("tasks") or []
                if record.get("retired") or (not record.get("dropped") and not all(t.get("done") for t in tasks)):
                    watched.add(stem)
        return watched

    def _look(self, watched: set[str]) -> tuple[dict[str, _Seen], bool, set[str]]:
        """What the plans a sync looks at are (read anew only when changed), and whether pl/ held
        more: the newest ones, and the session's own it found before or committed, in each of their
        states. And which of the `watched` plans is in no state at all: gone."""
        directory, names, cut = _plan_entries()
        if not directory:
            return {}, cut, set()
        own = heapq.nlargest(PLANS_MAX, {s.plan.stem for s in self._seen.values() if s.plan is not None})
        stems = dict.fromkeys([*own, *heapq.nlargest(PLANS_MAX, watched)])
        seen: dict[str, _Seen] = {}
        missing: set[str] = set()
        for name in dict.fromkeys([*names, *(f"{stem}__{status}.md" for stem in stems for status in _STATUS_ORDER)]):
            path = os.path.join(directory, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                missing.add(name)
                continue
            except OSError:
                continue
            stat = (st.st_ino, st.st_mtime_ns, st.st_size)
            old = self._seen.get(name)
            # A reading within 2 s of the file's change may have missed a second change of the same
            # size in the same clock tick: such a file is read again next time.
            if old is not None and old.stat == stat and time.time_ns() - st.st_mtime_ns > _TICK_NS:
                seen[name] = old
                continue
            seen[name] = self._read(name, path, stat, st.st_mtime)
        gone = {stem for stem in stems if stem in watched and _names_of(stem) <= missing}
        # Looked at again: a plan renamed between two of those looks (say __wip back to __todo)
        # was in no state for a moment.
        return seen, cut, {stem for stem in gone if not any(_lexists(directory, n) for n in _names_of(stem))}

    def _read(self, name: str, path: str, stat: tuple[int, int, int], mtime: float) -> _Seen:
        found = _NAME.fullmatch(name)
        text = _read_file(path)
        signed = _read_signed(text) if text is not None and found else None
        if signed is None or found is None:
            return _Seen(stat, None)
        mac = signature(self.key(), found["stem"], signed.sid, signed.deps, signed.goal_line, signed.step_lines)
        if not hmac.compare_digest(mac, signed.mac):
            if signed.sid != self.state.id:
                return _Seen(stat, None)  # another session's plan
            why = "it claims this session, but its signature does not verify (written, copied or changed by other code)"
            return _Seen(stat, None, why)
        try:
            goal, steps = _steps_of(signed)
        except ValueError as e:
            return _Seen(stat, None, f"signed by this session, but {e}")
        return _Seen(stat, PlanFile(name, found["stem"], found["status"], goal, steps, signed.text, mtime))

    @staticmethod
    def _latest_per_stem(plans: list[PlanFile]) -> list[PlanFile]:
        """One file per plan: a copy under another state (cp …__todo.md …__done.md) adds nothing
        but the furthest state, whose checks count."""
        best: dict[str, PlanFile] = {}
        for p in plans:
            old = best.get(p.stem)
            if old is None or _STATUS_ORDER[p.status] > _STATUS_ORDER[old.status]:
                best[p.stem] = p
        return list(best.values())

    def _show(self, mine: list[PlanFile]) -> None:
        """The newest of the session's plans is its `plan` (set when that file changes)."""
        if not mine:
            return
        newest = max(mine, key=lambda p: (p.mtime, p.stem))
        if (newest.name, newest.text) != self._shown:
            self._shown = (newest.name, newest.text)
            if self.state.plan != newest.text:
                self.state.set_plan(newest.text)

    # ---- the backend ----
    async def _choose(self, dispatcher: Dispatcher) -> PlanBackend | None:
        """The backend, chosen again when the agent's servers change: a tool server offering
        task_create, else the fallback."""
        if dispatcher is self._wired_for:
            return self._backend
        self._wired_for, self._cannot = dispatcher, set()
        self._backend, self._backend_key = self.fallback, _fallback_key(self.fallback)
        for server_name, server in dispatcher.servers().items():
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    tools = {t.name: t for t in await server.list_tools()}
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a server that is down offers nothing
                continue
            if "task_create" in tools:
                mcp = MCPTaskBackend(server_name, server, tools)
                self._backend, self._backend_key = mcp, mcp.key
                break
        return self._backend

    async def _commit(self, plan: PlanFile, backend: PlanBackend) -> bool:
        """Commit what of `plan` is not yet: the tasks of removed steps deleted, its tasks, their
        titles and descriptions, their dependencies, the steps done, the step being worked on.
        False when the backend failed (told to the user; the rest waits for the next sync)."""
        record = self._record(plan)
        tasks = record["tasks"]
        done = _Progress()
        try:
            await self._retire(backend, record, done)
            await self._create(plan, backend, tasks, done)
            await self._edit(plan, backend, tasks, done)
            await self._link(plan, backend, tasks, done)
            await self._complete(plan, backend, tasks, done)
            await self._claim(plan, backend, tasks, done)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any backend's failure is told, and tried again later
            if isinstance(e, _Slow):
                self._rest_until = time.monotonic() + REST
            n, have = len(plan.steps), sum(1 for t in tasks if t["id"] is not None)
            what = done.item or f"step {done.step + 1} of {n} ({plan.steps[done.step].title!r})"
            self._tell(
                f"plan {plan.name}: {_name(backend)} failed {done.doing} {what}: "
                f"{_short(str(e) or type(e).__name__)}; {have} of {n} tasks exist and are kept (the session's "
                "plan-tasks.json); the rest is committed at a later tool round"
            )
            return False
        if news := done.news():
            self.emit(Event("info", f"plan {plan.name} → {_name(backend)}: {news}"))
        return True

    async def _drop(self, stem: str, backend: PlanBackend) -> bool:
        """A plan of the session's removed from pl/: the tasks of its steps not done are deleted
        (what was done stays). False when the backend failed (told; tried again later)."""
        record = self._load().get("backends", {}).get(self._backend_key, {}).get(stem)
        if not isinstance(record, dict):
            return True  # committed to another backend only
        if not record.get("dropped"):
            retired = record.setdefault("retired", [])
            for task in record.get("tasks", []):
                if task.get("id") is not None and not task.get("done"):
                    retired.append(task["id"])
                    task.update(id=None, linked=[])
                    task.pop("sent", None)
                    task.pop("started", None)
            record["dropped"] = True  # should the plan come back, its steps get tasks anew
            self._save()
        done = _Progress()
        try:
            await self._retire(backend, record, done)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any backend's failure is told, and tried again later
            if isinstance(e, _Slow):
                self._rest_until = time.monotonic() + REST
            self._tell(
                f"plan {stem}: removed from pl/; {_name(backend)} failed {done.doing} {done.item}: "
                f"{_short(str(e) or type(e).__name__)}; the rest is deleted at a later tool round"
            )
            return False
        if news := done.news():
            self.emit(Event("info", f"plan {stem}: removed from pl/ → {_name(backend)}: {news}"))
        return True

    async def _retire(self, backend: PlanBackend, record: dict[str, Any], done: _Progress) -> None:
        """Delete the tasks of the steps a revision removed (or of a plan removed), which were not
        done; none when the backend cannot (told once)."""
        retired = record.get("retired")
        if not retired:
            return
        done.doing = "deleting"
        while retired:
            done.item = f"task {retired[0]} (of a step removed)"
            if "delete" in self._cannot or not await _optional(backend, "delete", retired[0]):
                self._cannot_do("delete", backend)
                retired.clear()
                self._save()
                break
            done.deleted.append(retired.pop(0))
            self._save()
        done.item = ""

    async def _create(self, plan: PlanFile, backend: PlanBackend, tasks: list[dict[str, Any]], done: _Progress) -> None:
        done.doing = "creating"
        for i, step in enumerate(plan.steps):
            if tasks[i]["id"] is None:
                done.step = i
                task = _task(plan, step)
                tasks[i]["id"] = await backend.create(task)
                tasks[i]["sent"] = [task.title, task.description]
                self._save()
                done.made.append(tasks[i]["id"])

    async def _edit(self, plan: PlanFile, backend: PlanBackend, tasks: list[dict[str, Any]], done: _Progress) -> None:
        """The tasks of steps whose title or description changed (a revision) get them."""
        done.doing = "revising"
        for i, step in enumerate(plan.steps):
            task, entry = _task(plan, step), tasks[i]
            now = [task.title, task.description]
            if entry.get("sent") == now:
                continue
            if "sent" not in entry:  # committed before what was sent was kept: taken as sent
                entry["sent"] = now
                continue
            if "edit" in self._cannot:
                return
            done.step = i
            if not await _optional(backend, "edit", entry["id"], task):
                self._cannot_do("edit", backend)
                return
            entry["sent"] = now
            self._save()
            done.revised.append(entry["id"])

    async def _link(self, plan: PlanFile, backend: PlanBackend, tasks: list[dict[str, Any]], done: _Progress) -> None:
        done.doing = "linking"
        for i, step in enumerate(plan.steps):
            for j in step.after:
                if "link" in self._cannot or j in tasks[i]["linked"]:
                    continue
                done.step = i
                if not await backend.link(tasks[i]["id"], tasks[j]["id"]):
                    self._cannot.add("link")
                    self._tell(
                        f"{_name(backend)} records no dependencies (no usable task_dep): "
                        "a step's dependencies are written into its task's description only"
                    )
                    return
                tasks[i]["linked"].append(j)
                self._save()
                done.linked += 1

    async def _complete(
        self, plan: PlanFile, backend: PlanBackend, tasks: list[dict[str, Any]], done: _Progress
    ) -> None:
        done.doing = "marking done"
        for i, step in enumerate(plan.steps):
            if tasks[i]["done"] or "complete" in self._cannot or not (step.checked or plan.status == "done"):
                continue
            done.step = i
            if not await backend.complete(tasks[i]["id"]):
                self._cannot.add("complete")
                self._tell(
                    f"{_name(backend)} cannot mark tasks done (no usable task_update): "
                    "steps checked in the plan stay open there"
                )
                return
            tasks[i]["done"] = True
            self._save()
            done.completed.append(tasks[i]["id"])

    async def _claim(self, plan: PlanFile, backend: PlanBackend, tasks: list[dict[str, Any]], done: _Progress) -> None:
        """While the plan is __wip, its next step (the first unchecked one: every step before it,
        its dependencies among them, is done) is claimed: its task set in progress, once."""
        if plan.status != "wip" or "start" in self._cannot:
            return
        i = next((i for i, step in enumerate(plan.steps) if not step.checked and not tasks[i]["done"]), None)
        if i is None or tasks[i].get("started"):
            return
        done.doing, done.step = "claiming", i
        if not await _optional(backend, "start", tasks[i]["id"]):
            self._cannot_do("start", backend)
            return
        tasks[i]["started"] = True
        self._save()
        done.claimed.append(tasks[i]["id"])

    def _cannot_do(self, what: str, backend: PlanBackend) -> None:
        """The backend has no way to do `what` (start, edit, delete): said once, not asked again."""
        if what in self._cannot:
            return
        self._cannot.add(what)
        self._tell(f"{_name(backend)} cannot {_CANNOT[what]}")

    # ---- what was committed, on disk ----
    def _record(self, plan: PlanFile) -> dict[str, Any]:
        """What was committed of `plan`; its steps followed to their places in a revision."""
        plans = self._load().setdefault("backends", {}).setdefault(self._backend_key, {})
        record = plans.get(plan.stem)
        titles = [s.title for s in plan.steps]
        if not isinstance(record, dict) or not isinstance(record.get("tasks"), list):
            record = {"goal": plan.goal, "tasks": [_entry(t) for t in titles]}
            plans[plan.stem] = record
        elif [t.get("title") for t in record["tasks"]] != titles:
            _revise(record, titles)
            self._save()
        record["goal"] = plan.goal
        record.pop("dropped", None)  # a removed plan back in pl/
        return record

    def _load(self) -> dict[str, Any]:
        if self._map is None:
            path = self.state.store.dir / MAP_FILE
            try:
                loaded = json.loads(path.read_text())
                self._map = loaded if isinstance(loaded, dict) else {}
            except FileNotFoundError:
                self._map = {}
            except (OSError, ValueError) as e:
                aside = path.with_name(f"{MAP_FILE}.unreadable-{int(time.time())}")
                os.replace(path, aside)
                self._tell(f"plans: {path} was unreadable ({e}); kept as {aside.name}, tasks may be made again")
                self._map = {}
        return self._map

    def _save(self) -> None:
        path = self.state.store.dir / MAP_FILE
        tmp = path.with_name(f".{MAP_FILE}.{secrets.token_hex(4)}.tmp")
        with open(tmp, "w") as f:
            json.dump(self._load(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


@dataclass(slots=True)
class _Progress:
    """What one sync did with one plan, and where it is."""

    doing: str = "creating"
    step: int = 0
    item: str = ""  # what is being done when it is no step of the plan (a task of a step removed)
    made: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    revised: list[str] = field(default_factory=list)
    linked: int = 0
    completed: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)

    def news(self) -> str:
        parts = [f"{len(self.made)} task{'s' if len(self.made) != 1 else ''} created ({', '.join(self.made)})"]
        parts = parts if self.made else []
        parts += [f"deleted: {', '.join(self.deleted)}"] if self.deleted else []
        parts += [f"revised: {', '.join(self.revised)}"] if self.revised else []
        parts += [f"{self.linked} dependenc{'ies' if self.linked != 1 else 'y'} linked"] if self.linked else []
        parts += [f"done: {', '.join(self.completed)}"] if self.completed else []
        parts += [f"claimed: {', '.join(self.claimed)}"] if self.claimed else []
        return "; ".join(parts)


_CANNOT = {  # what the user is told when the backend has no way to do it
    "start": ("claim tasks (no usable task_update with an in-progress status): steps worked on stay open there"),
    "edit": "revise tasks (no usable task_edit): a step's new title or description is not carried to its task",
    "delete": "delete tasks (no usable task_delete): the tasks of steps or plans removed stay there",
}
LIKENESS = 0.5  # how alike (difflib's ratio) a step's new title must be to its old one to keep its task


def _entry(title: str) -> dict[str, Any]:
    return {"title": title, "id": None, "linked": [], "done": False}


def _revise(record: dict[str, Any], titles: list[str]) -> None:
    """Follow the steps of a revised plan: each step of the revision keeps the task of the step it
    was, matched by title (difflib's alignment of the two lists of titles), or, among the steps
    that changed in one place, by the likeness of their titles; the tasks of old steps left over
    are to be deleted (unless done), the new steps left over get tasks anew."""
    old = record["tasks"]
    old_titles = [str(t.get("title")) for t in old]
    moved: dict[int, int] = {}  # old step → its place in the revision
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old_titles, titles, autojunk=False).get_opcodes():
        if op == "equal":
            moved.update(zip(range(i1, i2), range(j1, j2), strict=True))
        elif op == "replace":
            scored = sorted(
                (
                    (
                        difflib.SequenceMatcher(None, old_titles[i].casefold(), titles[j].casefold()).ratio(),
                        -abs(i - i1 - (j - j1)),
                        i,
                        j,
                    )
                    for i in range(i1, i2)
                    for j in range(j1, j2)
                ),
                reverse=True,
            )
            taken: set[int] = set()
            for ratio, _, i, j in scored:
                if ratio >= LIKENESS and i not in moved and j not in taken:
                    moved[i] = j
                    taken.add(j)
    retired = record.setdefault("retired", [])
    revised: list[dict[str, Any] | None] = [None] * len(titles)
    for i, task in enumerate(old):
        if i not in moved:
            if task.get("id") is not None and not task.get("done"):
                retired.append(task["id"])
            continue
        task = dict(task, title=titles[moved[i]])
        task["linked"] = [moved[k] for k in task.get("linked", []) if k in moved]
        if task.get("id") is not None and "sent" not in task:  # committed before what was sent was kept
            task["sent"] = [old_titles[i], None]
        revised[moved[i]] = task
    record["tasks"] = [task or _entry(titles[j]) for j, task in enumerate(revised)]


async def _optional(backend: PlanBackend, name: str, *args: Any) -> bool:
    """Call the backend's optional method `name`; False when it has none, or says it cannot."""
    method = getattr(backend, name, None)
    return callable(method) and bool(await method(*args))


def _names_of(stem: str) -> set[str]:
    return {f"{stem}__{status}.md" for status in _STATUS_ORDER}


def _lexists(directory: str, name: str) -> bool:
    try:
        os.stat(os.path.join(directory, name), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but unreadable: not gone
    return True


def _task(plan: PlanFile, step: Step) -> Task:
    parts = [step.description] if step.description else []
    if step.after:
        parts.append("After: " + "; ".join(plan.steps[j].title for j in step.after))
    parts.append(f"Plan: {plan.goal} (pl/{plan.stem})")
    return Task(step.title, "\n\n".join(parts), plan.goal, plan.stem)


def _name(backend: PlanBackend) -> str:
    name = getattr(backend, "name", "")
    return name if isinstance(name, str) and name else f"plan backend {type(backend).__name__}"


def _fallback_key(backend: PlanBackend | None) -> str:
    if backend is None:
        return ""
    name = getattr(backend, "name", "")
    return f"backend:{name if isinstance(name, str) and name else type(backend).__name__}"
