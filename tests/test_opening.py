"""What a program that embeds ollie gives `open_session`: held to the rules a file is, or refused
with a message, never half-taken."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ollie import open_session
from ollie.agent.session import list_stored
from ollie.backends.scripted import ScriptedBackend
from ollie.config import AgentConfig
from ollie.tools import CallContext, Tool, ToolResult
from ollie.types import Busy, ConfigError, InvalidValue, NotFound


def code_call(code: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": code}]}}]}


async def test_an_agent_built_in_code_is_checked_as_a_config_file_is(tmp_path):
    # A hook given as one command string is that command (its characters were run one by one).
    guard = AgentConfig(hooks={"preTool": "echo 'no code here' >&2; exit 2"})
    backend = ScriptedBackend([code_call("touch ran"), {"text": "ok", "expect": "no code here"}])
    async with open_session(agent=guard, backend=backend, cwd=str(tmp_path)) as core:
        assert await core.submit("go") == "ok"
    backend.assert_consumed()
    assert not (tmp_path / "ran").exists()
    for bad, words in (
        (AgentConfig(hooks={"pretool": ["exit 2"]}), "unknown hook event 'pretool'"),
        (AgentConfig(max_steps=-3), "maxSteps and contextWindow are counts"),
        (AgentConfig(compact_at=5.0), "compactWarn <= compactAt <= 1"),
        (AgentConfig(tools="yes"), "tools must be bool"),  # type: ignore[arg-type]
        (AgentConfig(name="../lead"), "invalid name"),
    ):
        with pytest.raises(ConfigError, match=words):
            await open_session(agent=bad, backend=ScriptedBackend([]), cwd=str(tmp_path))


async def test_a_session_whose_agent_was_built_in_code_goes_on_only_with_an_agent_given(tmp_path):
    """Its agent is not stored: continued without it, the default agent took over and its guard
    hooks were gone without a word."""
    lead = AgentConfig(name="lead", prompt="You are LEAD.", hooks={"preTool": ["exit 2"]})
    async with open_session(agent=lead, backend=ScriptedBackend([{"text": "a"}]), cwd=str(tmp_path)) as core:
        await core.submit("one")
        sid = core.session_id
    with pytest.raises(ConfigError, match="ran an agent built in code \\('lead'\\), which is not stored"):
        await open_session(session_id=sid, backend=ScriptedBackend([]))
    again = ScriptedBackend([{"text": "b", "expect": "two"}])
    async with open_session(session_id=sid, agent=lead, backend=again) as core:
        assert "You are LEAD." in core.system_prompt() and await core.submit("two") == "b"
    async with open_session(session_id=sid, agent="default", backend=ScriptedBackend([])) as core:
        assert core.agent.name == "default"  # named: the caller chose to go on under it
    async with open_session(session_id=sid, backend=ScriptedBackend([])) as core:
        assert core.agent.name == "default"  # stored as a config's now, found again by name


async def test_a_script_means_the_scripted_backend_and_servers_are_given_as_factories(tmp_path):
    async with open_session(script=[{"text": "scripted"}], cwd=str(tmp_path)) as core:
        assert core.backend.name == "scripted" and await core.submit("hi") == "scripted"
    with pytest.raises(ConfigError, match="script= is for the scripted backend, not 'openai'"):
        await open_session(backend="openai", script=[], cwd=str(tmp_path))
    with pytest.raises(ConfigError, match="servers\\['mine'\\] must be a function that builds the server"):
        await open_session(script=[], servers={"mine": Named()}, cwd=str(tmp_path))


class Named:
    """A tool server of the program's own whose tool is called as ollie's is."""

    async def list_tools(self) -> list[Tool]:
        return [Tool("execute_code", "mine")]

    async def call_tool(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        return ToolResult.of("the program's own")

    async def close(self) -> None:
        pass


async def test_a_tool_of_your_own_named_execute_code_leaves_ollies_its_name(tmp_path):
    """The system prompt tells the model to call execute_code: that name stays ollie's, and the
    program's tool is `<server>__execute_code`."""
    backend = ScriptedBackend([code_call("echo ollies"), {"text": "done", "expect": "ollies"}])
    async with open_session(backend=backend, servers={"mine": Named}, cwd=str(tmp_path)) as core:
        tools = await core.dispatcher.list_tools()
        assert {"execute_code", "mine__execute_code"} <= set(tools) and tools["execute_code"].description != "mine"
        assert await core.submit("go") == "done"
    backend.assert_consumed()


async def test_an_async_event_handler_is_refused_rather_than_never_awaited(tmp_path):
    async def on_event(event: object) -> None:
        pass

    with pytest.raises(InvalidValue, match="not an async one: it is called, never awaited"):
        await open_session(script=[], cwd=str(tmp_path), on_event=on_event)
    assert list_stored() == []  # refused before a session was made


async def test_a_session_id_not_stored_is_refused_unless_one_is_to_be_made(tmp_path):
    with pytest.raises(NotFound, match="no stored session 'nosuch-123'"):  # a typo started an empty one
        await open_session(session_id="nosuch-123", script=[], cwd=str(tmp_path))
    assert list_stored() == []
    async with open_session(session_id="mine-1", create=True, script=[], cwd=str(tmp_path)) as core:
        assert core.session_id == "mine-1"
    async with open_session(session_id="mine-1", script=[]) as core:  # stored now: it goes on
        assert core.session.cwd == str(tmp_path)


async def test_a_session_is_open_in_one_place_at_a_time(tmp_path):
    """Two Cores of one session mixed their conversations in its history, and the first to close
    removed the other's scratch directory."""
    first = await open_session(script=[{"text": "a"}], cwd=str(tmp_path))
    sid = first.session_id
    with pytest.raises(Busy, match=f"session {sid} is open elsewhere"):
        await open_session(session_id=sid, script=[])
    code = f"import asyncio, ollie\nasync def main():\n    await ollie.open_session(session_id={sid!r}, script=[])\n"
    held = subprocess.run(  # another process too (the file server, a script)
        [sys.executable, "-c", code + "asyncio.run(main())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert held.returncode != 0 and "is open elsewhere" in held.stderr
    await first.close()
    async with open_session(session_id=sid, script=[{"text": "b"}]) as again:
        assert await again.submit("two") == "b"
