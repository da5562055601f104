"""Where a plan's steps are committed as tasks: the `PlanBackend` protocol a program's backend
follows, `MCPTaskBackend` (a tool server offering `task_create`, called by its input schemas), and
`task_server`, which finds one among the agent's tool servers. Which backend a session uses, and
when, is the package docstring's to say.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..tools import CallContext, Dispatcher, Server, Tool, ToolResult
from ..types import OllieError

CALL_TIMEOUT = 20.0  # seconds for one call to the backend
MAX_REASON = 300  # characters of a backend's error shown
MAX_TASK_ID = 200


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


class Slow(PlanBackendError):
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
            raise Slow(f"{name} gave no answer within {CALL_TIMEOUT:g} s") from None
        except OllieError as e:
            raise PlanBackendError(f"{name} failed: {e}") from None
        if result.is_error:
            raise PlanBackendError(f"{name} answered an error: {short(result.text())}")
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
        raise PlanBackendError(f"task_create answered {short(text)!r}, not a task id (one short line of text)")
    return text


def short(text: str) -> str:
    """`text` on one line, cut to MAX_REASON characters: what the user is shown of an error."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


async def task_server(dispatcher: Dispatcher) -> MCPTaskBackend | None:
    """The first of the agent's tool servers that offers task_create, as a backend; None if none
    does (a server that is down, or slow to list its tools, offers nothing)."""
    for server_name, server in dispatcher.servers().items():
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                tools = {t.name: t for t in await server.list_tools()}
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a server that is down offers nothing
            continue
        if "task_create" in tools:
            return MCPTaskBackend(server_name, server, tools)
    return None


def name_of(backend: PlanBackend) -> str:
    """The backend as the user is told of it."""
    name = getattr(backend, "name", "")
    return name if isinstance(name, str) and name else f"plan backend {type(backend).__name__}"
