"""The agent's extension point (ollie.agent.extensions): the loop calls every extension after each
tool round, with the agent's tool servers as they are then, and each tool call runs with what the
extensions add to its env. The plans (ollie.plans) are one, which open_session installs: a Core
built without them knows nothing of plans."""

from __future__ import annotations

import os
from typing import Any

from agent_helpers import ToyServer
from ollie.agent import open_session
from ollie.agent.core import Core, CoreConfig
from ollie.agent.env import build_agent_env
from ollie.agent.extensions import SessionHandle
from ollie.backends.scripted import ScriptedBackend
from ollie.config import AgentConfig
from ollie.plans import KEY_FILE, KEY_VAR
from ollie.tools import Dispatcher, ToolResult, dispatcher_factory


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "arguments": args}


SCRIPT = [
    {"tool_calls": [call("echo", text="one")]},
    {"tool_calls": [call("echo", text="two"), call("echo", text="three")]},
    {"text": "done"},
]


class EnvServer(ToyServer):
    """The toy tools, recording the env each call runs with."""

    def __init__(self) -> None:
        super().__init__()
        self.envs: list[dict[str, str]] = []

    async def call_tool(self, name: str, args: dict[str, Any], ctx: Any) -> ToolResult:
        self.envs.append(dict(ctx.env))
        return await super().call_tool(name, args, ctx)


class Recorder:
    """An extension that keeps what it was given, and writes the session's plan."""

    def __init__(self, session: SessionHandle, name: str, calls: list[tuple[str, Dispatcher, str]]) -> None:
        self.session, self.name = session, name
        self.core: Core | None = None
        self.calls = calls  # every recorder's, in order: its name, the dispatcher, the last message's role

    def stage_env(self) -> dict[str, str]:
        return {f"RECORDER_{self.name}": self.session.id}

    async def after_tools(self, dispatcher: Dispatcher) -> None:
        assert self.core is not None
        self.calls.append((self.name, dispatcher, self.core.session.messages[-1].role))
        self.session.set_plan(f"{self.name} after call {len(self.calls)}")


async def core_with(server: EnvServer, *extensions: Any) -> Core:
    new_dispatcher = dispatcher_factory({"toy": lambda: server})
    env = await build_agent_env(AgentConfig(), new_dispatcher(), os.getcwd())
    return Core(CoreConfig(ScriptedBackend(SCRIPT), env, new_dispatcher, extensions=extensions))


async def test_every_extension_is_called_after_each_tool_round_and_adds_to_each_calls_env():
    server, calls, made = EnvServer(), [], []

    def recorder(name: str) -> Any:
        def make(session: SessionHandle) -> Recorder:
            made.append(Recorder(session, name, calls))
            return made[-1]

        return make

    core = await core_with(server, recorder("A"), recorder("B"))
    for extension in made:
        extension.core = core
    try:
        await core.submit("go")
    finally:
        await core.close()
    assert core.reply == "done"
    # in their order, after each round's results are committed, never after the answer
    assert [(name, role) for name, _, role in calls] == [("A", "tool"), ("B", "tool")] * 2
    assert all(dispatcher is core.dispatcher for _, dispatcher, _ in calls)
    assert core.session.plan == "B after call 4"
    sid = core.session_id
    assert server.envs == [{"RECORDER_A": sid, "RECORDER_B": sid}] * 3


async def test_open_session_installs_the_plans_and_a_bare_core_has_none():
    server = EnvServer()
    planned = await open_session(backend="scripted", script=SCRIPT, servers={"toy": lambda: server})
    try:
        await planned.submit("go")
        key = (planned.session.store.dir / KEY_FILE).read_text().strip()
    finally:
        await planned.close()
    assert [env.get(KEY_VAR) for env in server.envs] == [key] * 3

    bare_server = EnvServer()
    bare = await core_with(bare_server)
    try:
        await bare.submit("go")
    finally:
        await bare.close()
    assert bare.reply == "done"
    assert not any(KEY_VAR in env for env in bare_server.envs)
    assert not (bare.session.store.dir / KEY_FILE).exists()
