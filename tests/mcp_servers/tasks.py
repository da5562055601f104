"""A task server for the plan tests: `python tasks.py FILE [options]`, over stdio.

It keeps its tasks in the JSON file FILE ({"tasks": {id: {...}}, "calls": [[tool, arguments]]}),
written whole after every call, so a test reads what it did, and a second process started on the
same file goes on from there. Options:
  --create-only      offer task_create (and task_list) only: no task_dep, task_update, task_edit
                     or task_delete
  --fail-create N    the Nth task_create call of this process answers an error
  --die-create N     the Nth task_create call of this process ends the process, unanswered
  --hang-create N    the Nth task_create call of this process never answers
"""

import argparse
import asyncio
import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

parser = argparse.ArgumentParser()
parser.add_argument("file")
parser.add_argument("--create-only", action="store_true")
parser.add_argument("--fail-create", type=int, default=0)
parser.add_argument("--die-create", type=int, default=0)
parser.add_argument("--hang-create", type=int, default=0)
options = parser.parse_args()

server = MCPServer("tasks")
creates = 0


def load() -> dict:
    try:
        with open(options.file) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"tasks": {}, "calls": []}


def save(data: dict) -> None:
    tmp = f"{options.file}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, options.file)


def task(data: dict, task_id: str) -> dict:
    if task_id not in data["tasks"]:
        raise ToolError(f"no task {task_id}")
    return data["tasks"][task_id]


@server.tool()
async def task_create(title: str, description: str = "") -> str:
    """Create a task; answers its id."""
    global creates
    creates += 1
    data = load()
    data["calls"].append(["task_create", {"title": title, "description": description}])
    save(data)
    if creates == options.die_create:
        os._exit(3)
    if creates == options.hang_create:
        await asyncio.sleep(3600)
    if creates == options.fail_create:
        raise ToolError("the task store is locked")
    task_id = f"T{len(data['tasks']) + 1}"
    data["tasks"][task_id] = {"title": title, "description": description, "status": "open", "blocked_by": []}
    save(data)
    return task_id


@server.tool()
def task_list() -> str:
    """Every task: id, status, title."""
    return "\n".join(f"{i} {t['status']} {t['title']}" for i, t in load()["tasks"].items())


if not options.create_only:

    @server.tool()
    def task_dep(id: str, depends_on: str) -> str:  # noqa: A002 - the contract's names
        """Task `id` waits on task `depends_on`."""
        data = load()
        data["calls"].append(["task_dep", {"id": id, "depends_on": depends_on}])
        task(data, depends_on)
        task(data, id)["blocked_by"].append(depends_on)
        save(data)
        return "ok"

    @server.tool()
    def task_update(id: str, status: str) -> str:  # noqa: A002
        """Set a task's status (open, in_progress, done)."""
        if status not in ("open", "in_progress", "done"):
            raise ToolError(f"unknown status {status}")
        data = load()
        data["calls"].append(["task_update", {"id": id, "status": status}])
        task(data, id)["status"] = status
        save(data)
        return "ok"

    @server.tool()
    def task_edit(id: str, title: str | None = None, description: str | None = None) -> str:  # noqa: A002
        """Revise a task's title or description (what is left out stays)."""
        data = load()
        data["calls"].append(["task_edit", {"id": id, "title": title, "description": description}])
        found = task(data, id)
        found.update({k: v for k, v in (("title", title), ("description", description)) if v is not None})
        save(data)
        return "ok"

    @server.tool()
    def task_delete(id: str) -> str:  # noqa: A002
        """Remove a task (and what waited on it no longer does)."""
        data = load()
        data["calls"].append(["task_delete", {"id": id}])
        task(data, id)
        del data["tasks"][id]
        for other in data["tasks"].values():
            other["blocked_by"] = [b for b in other["blocked_by"] if b != id]
        save(data)
        return "ok"

    @server.tool()
    def task_read(id: str) -> str:  # noqa: A002
        """One task as JSON."""
        return json.dumps(task(load(), id))


server.run("stdio")
