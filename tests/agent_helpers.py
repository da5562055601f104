"""Building Cores for tests: a scripted backend and small in-process tool servers, and the `cores`
fixture that opens them and closes them after the test."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ollie.agent.core import Core, CoreConfig
from ollie.agent.env import build_agent_env
from ollie.agent.session import SessionMeta, SessionStore, new_session_id
from ollie.backends.scripted import ScriptedBackend
from ollie.config import AgentConfig
from ollie.sandbox import jail
from ollie.tools import Tool, ToolResult, dispatcher_factory
from ollie.types import Event, Message


class ToyServer:
    """Tools for loop tests: `echo` (read-only), `sleep` (read-only, records overlap), `fail`, `write`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.running = 0
        self.max_running = 0

    async def list_tools(self) -> list[Tool]:
        obj = {"type": "object", "properties": {}}
        return [
            Tool("echo", "echo text", obj, read_only=True),
            Tool("sleep", "sleep", obj, read_only=True),
            Tool("fail", "always fails", obj),
            Tool("write", "not read-only", obj),
        ]

    async def call_tool(self, name: str, args: dict[str, Any], ctx: Any) -> ToolResult:
        self.calls.append((name, args))
        if name == "echo":
            return ToolResult.of(str(args.get("text", "")))
        if name == "sleep":
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                await asyncio.sleep(float(args.get("seconds", 0.05)))
            finally:
                self.running -= 1
            return ToolResult.of(f"slept {args.get('seconds', 0.05)}")
        if name == "fail":
            return ToolResult.of(str(args.get("why", "it failed")), is_error=True)
        return ToolResult.of("written")

    async def close(self) -> None:
        pass


def seed_history(messages: list[Message], session_id: str = "") -> str:
    """Store `messages` as a session's history (appended, when the session exists), the way a
    restored session finds it; returns the session's id."""
    sid = session_id or new_session_id()
    store = SessionStore(sid)
    if not store.exists():
        store.create()
        store.save_meta(SessionMeta(id=sid))
    store.append_messages(messages)
    store.close()
    return sid


def exchanges(n: int) -> list[Message]:
    """n user/assistant exchanges of history."""
    return [m for i in range(n) for m in (Message("user", f"question {i}"), Message("assistant", f"answer {i}"))]


async def make_core(
    script: Any,
    cfg: AgentConfig | None = None,
    server: ToyServer | None = None,
    session_id: str = "",
    extra_servers: dict[str, Any] | None = None,
    history: list[Message] | None = None,
) -> tuple[Core, ScriptedBackend, ToyServer, list[Event]]:
    """A Core on the scripted backend with the toy tools; `history` seeds its stored history."""
    if history:
        session_id = seed_history(history, session_id)
    server = server or ToyServer()
    backend = ScriptedBackend(script)
    new_dispatcher = dispatcher_factory({"toy": lambda: server, **(extra_servers or {})})
    env = await build_agent_env(cfg or AgentConfig(), new_dispatcher(), os.getcwd())
    core = Core(CoreConfig(backend, env, new_dispatcher, session_id=session_id))
    events: list[Event] = []
    core.subscribe(events.append)
    return core, backend, server, events


class Cores:
    """The Cores a test opens (`make_core`'s arguments and answer), each closed when the test ends,
    whatever it asserted: a failed assertion leaves no turn, tool server or tmpdir behind. A test
    that must close one before it ends (to open its session again) closes it here, and only once."""

    def __init__(self) -> None:
        self.open_cores: list[Core] = []

    async def open(self, script: Any, **options: Any) -> tuple[Core, ScriptedBackend, ToyServer, list[Event]]:
        made = await make_core(script, **options)
        self.open_cores.append(made[0])
        return made

    async def close(self, core: Core) -> None:
        self.open_cores.remove(core)
        await core.close()

    async def close_all(self) -> None:
        while self.open_cores:  # in the order they were opened
            await self.close(self.open_cores[0])


@pytest.fixture
async def cores() -> AsyncIterator[Cores]:
    """The Core set-up of the core and command tests: `core, backend, server, events = await
    cores.open(script, cfg=..., history=...)`, closed after the test."""
    opened = Cores()
    yield opened  # pytest comes back here whether the test passed or not
    await opened.close_all()


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events if e.kind not in ("state", "usage")]


def children() -> set[int]:
    """Our child processes, zombies included (a zombie is a process nobody reaped), but the jails'
    fork server, which lives as long as we do (started by whichever test first sandboxes code)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid():
            found.add(int(stat.parent.name))
    return found - {jail._FORK_SERVER.pid}


def running(marker: str) -> set[int]:
    """Processes whose command line holds `marker` (by their pids here: a jailed process has another
    pid inside its own PID namespace)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes().replace(b"\0", b" "):
                found.add(int(cmdline.parent.name))
        except OSError:
            continue
    return found - {os.getpid()}
