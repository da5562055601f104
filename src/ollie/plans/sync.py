"""A session's side of its plans (`Plans`): after each tool round it reads its plans in pl/,
shows the newest as the session's plan, and commits their steps to the task backend, keeping what
was committed in the session's store. See the package's docstring for what it does and why.
"""

from __future__ import annotations

import asyncio
import difflib
import heapq
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..tools import Dispatcher
from ..types import Event
from . import backends, files
from .backends import PlanBackend, Task
from .files import PlanFile, Step

log = logging.getLogger("ollie.plans")

KEY_VAR = "OLLIE_PLAN_KEY"  # the session's key, in its stages' environment
KEY_FILE = "plan.key"  # in the session's store
MAP_FILE = "plan-tasks.json"  # in the session's store: plan step → task id
SYNC_BUDGET = 30.0  # seconds one sync may spend with the backend; the rest waits for a later one
REST = 120.0  # seconds without commits after the backend was that slow (else every tool round would wait)


@dataclass(slots=True)
class _Seen:
    """The last reading of one file in pl/: (inode, mtime, size) and what it was to us."""

    stat: tuple[int, int, int]
    plan: PlanFile | None
    problem: str = ""  # why a file that claims this session is not taken


class PlanSession(Protocol):
    """What plans need of their session (the agent's `extensions.SessionHandle` is one): its id and
    store directory, as they are now (a rename changes both), its plan, and a way to tell the user."""

    @property
    def id(self) -> str: ...

    @property
    def store_dir(self) -> Path: ...

    @property
    def plan(self) -> str: ...

    def set_plan(self, text: str) -> None: ...

    def emit(self, event: Event) -> None: ...


class Plans:
    """One session's plans, an extension of the agent's (`ollie.agent.extensions.Extension`): after
    each tool round it finds them in pl/, shows the newest as the session's plan and commits them to
    the task backend; each tool call gets the key its plans are signed with. `after_tools` never
    raises but for cancellation: what goes wrong is told to the user as an info event."""

    def __init__(self, session: PlanSession, fallback: PlanBackend | None = None):
        self.session = session
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
                path = self.session.store_dir / KEY_FILE
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
    async def after_tools(self, dispatcher: Dispatcher) -> None:
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
                    f"{backends.name_of(backend)}: plans not committed within {SYNC_BUDGET:g} s; what was done is "
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
        self.session.emit(Event("info", text))

    # ---- finding the session's plans ----
    async def _scan(self) -> tuple[list[PlanFile], set[str]]:
        """The session's plans in pl/, found in a thread: pl/ is every session's code's to fill,
        and a scan of it on the loop held up every session's tool round for seconds. And the
        stems of the plans with tasks to delete that are gone from pl/ (removed)."""
        watched = self._watched()
        listed = files.listed_plans()
        if listed is not None and not listed[0] and not watched and not self._seen:
            # nothing to read, so no thread: in a round of hundreds of sessions, each queued there
            seen: dict[str, _Seen] = {}
            cut, gone = listed[1], set[str]()
        else:
            seen, cut, gone = await asyncio.to_thread(self._look, watched)
        self._seen = seen
        if cut:
            self._tell(
                f"pl/ holds more than {files.PLANS_MAX} plans (or {files.PLANS_READ_MAX} files): this session looks "
                f"at the {files.PLANS_MAX} newest by name, and at its own it found before"
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
        directory, names, cut = files.plan_entries()
        if not directory:
            return {}, cut, set()
        own = heapq.nlargest(files.PLANS_MAX, {s.plan.stem for s in self._seen.values() if s.plan is not None})
        stems = dict.fromkeys([*own, *heapq.nlargest(files.PLANS_MAX, watched)])
        seen: dict[str, _Seen] = {}
        missing: set[str] = set()
        for name in dict.fromkeys([*names, *(name for stem in stems for name in files.names_of(stem))]):
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
            if old is not None and old.stat == stat and time.time_ns() - st.st_mtime_ns > files.TICK_NS:
                seen[name] = old
                continue
            seen[name] = self._read(name, path, stat, st.st_mtime)
        gone = {stem for stem in stems if stem in watched and files.names_of(stem) <= missing}
        # Looked at again: a plan renamed between two of those looks (say __wip back to __todo)
        # was in no state for a moment.
        return seen, cut, {stem for stem in gone if not any(files.lexists(directory, n) for n in files.names_of(stem))}

    def _read(self, name: str, path: str, stat: tuple[int, int, int], mtime: float) -> _Seen:
        found = files.NAME.fullmatch(name)
        text = files.read_file(path)
        signed = files.read_signed(text) if text is not None and found else None
        if signed is None or found is None:
            return _Seen(stat, None)
        mac = files.signature(self.key(), found["stem"], signed.sid, signed.deps, signed.goal_line, signed.step_lines)
        if not hmac.compare_digest(mac, signed.mac):
            if signed.sid != self.session.id:
                return _Seen(stat, None)  # another session's plan
            why = "it claims this session, but its signature does not verify (written, copied or changed by other code)"
            return _Seen(stat, None, why)
        try:
            goal, steps = files.steps_of(signed)
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
            if old is None or files.STATUS_ORDER[p.status] > files.STATUS_ORDER[old.status]:
                best[p.stem] = p
        return list(best.values())

    def _show(self, mine: list[PlanFile]) -> None:
        """The newest of the session's plans is its `plan` (set when that file changes)."""
        if not mine:
            return
        newest = max(mine, key=lambda p: (p.mtime, p.stem))
        if (newest.name, newest.text) != self._shown:
            self._shown = (newest.name, newest.text)
            if self.session.plan != newest.text:
                self.session.set_plan(newest.text)

    # ---- the backend ----
    async def _choose(self, dispatcher: Dispatcher) -> PlanBackend | None:
        """The backend, chosen again when the agent's servers change: a tool server offering
        task_create, else the fallback."""
        if dispatcher is self._wired_for:
            return self._backend
        self._wired_for, self._cannot = dispatcher, set()
        self._backend, self._backend_key = self.fallback, _fallback_key(self.fallback)
        if mcp := await backends.task_server(dispatcher):
            self._backend, self._backend_key = mcp, mcp.key
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
            if isinstance(e, backends.Slow):
                self._rest_until = time.monotonic() + REST
            n, have = len(plan.steps), sum(1 for t in tasks if t["id"] is not None)
            what = done.item or f"step {done.step + 1} of {n} ({plan.steps[done.step].title!r})"
            self._tell(
                f"plan {plan.name}: {backends.name_of(backend)} failed {done.doing} {what}: "
                f"{backends.short(str(e) or type(e).__name__)}; {have} of {n} tasks exist and are kept (the session's "
                "plan-tasks.json); the rest is committed at a later tool round"
            )
            return False
        if news := done.news():
            self.session.emit(Event("info", f"plan {plan.name} → {backends.name_of(backend)}: {news}"))
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
            if isinstance(e, backends.Slow):
                self._rest_until = time.monotonic() + REST
            self._tell(
                f"plan {stem}: removed from pl/; {backends.name_of(backend)} failed {done.doing} {done.item}: "
                f"{backends.short(str(e) or type(e).__name__)}; the rest is deleted at a later tool round"
            )
            return False
        if news := done.news():
            self.session.emit(Event("info", f"plan {stem}: removed from pl/ → {backends.name_of(backend)}: {news}"))
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
                        f"{backends.name_of(backend)} records no dependencies (no usable task_dep): "
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
                    f"{backends.name_of(backend)} cannot mark tasks done (no usable task_update): "
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
        self._tell(f"{backends.name_of(backend)} cannot {_CANNOT[what]}")

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
            path = self.session.store_dir / MAP_FILE
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
        path = self.session.store_dir / MAP_FILE
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


def _task(plan: PlanFile, step: Step) -> Task:
    parts = [step.description] if step.description else []
    if step.after:
        parts.append("After: " + "; ".join(plan.steps[j].title for j in step.after))
    parts.append(f"Plan: {plan.goal} (pl/{plan.stem})")
    return Task(step.title, "\n\n".join(parts), plan.goal, plan.stem)


def _fallback_key(backend: PlanBackend | None) -> str:
    if backend is None:
        return ""
    name = getattr(backend, "name", "")
    return f"backend:{name if isinstance(name, str) and name else type(backend).__name__}"
