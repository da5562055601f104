"""What an agent config runs besides hooks (its prompt's !commands, its stdio tool servers) runs in
a sandbox, never in the cwd sandboxed code fills: the attacks of class 4, at the next session's
start in a project the model wrote."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ollie import config, sandbox
from ollie.agent import open_session
from ollie.agent.env import build_agent_env
from ollie.config import AgentConfig
from ollie.tools import CallContext, Dispatcher
from ollie.types import ConfigError
from sandbox_helpers import API_KEY, SECRET

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

PY = sys.executable
CALC = Path(__file__).parent / "mcp_servers" / "calc.py"


def agent(cfg: Path, name: str, **fields: object) -> None:
    (cfg / "agents").mkdir(exist_ok=True)
    (cfg / "agents" / f"{name}.json").write_text(json.dumps(fields))


@pytest.fixture
def project(home):
    """A project the model has written: a git repository with a planted core.fsmonitor, and a
    module named as a tool server's."""
    project = home / "project"
    project.mkdir()
    proof = home / "ran-unsandboxed"
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "config", "core.fsmonitor", f"env > {proof}; echo x > planted; false"])
    (project / "mcp_server_time.py").write_text(f"open({str(proof)!r}, 'w').write('imported')\n")
    return project, proof


async def test_a_prompt_command_runs_sandboxed_at_the_next_sessions_start(home, project):
    project, proof = project
    cfg = Path(os.environ["OLLIE_CFG_PATH"])
    agent(cfg, "gitty", prompt="!git status --short; echo prompt-made")
    core = await open_session(agent="gitty", cwd=str(project), backend="scripted", script=[{"text": "ok"}])
    try:
        assert core.system_prompt().endswith("prompt-made")
    finally:
        await core.close()
    assert not proof.exists(), proof.read_text()  # the fsmonitor ran in the sandbox, or not at all
    assert not (project / "planted").exists()  # the cwd is read-only to it, as to hooks


async def test_a_prompt_command_failing_or_hanging_says_so_without_blocking(home, tmp_path, monkeypatch):
    monkeypatch.setattr("ollie.agent.env.PROMPT_TIMEOUT", 1.0)
    for prompt, why in (("!exit 3", "failed (exit 3)"), ("!sleep 30", "timed out after 1 s")):
        with pytest.raises(ConfigError, match=f"prompt command .* {re.escape(why)}"):
            await build_agent_env(AgentConfig(prompt=prompt), Dispatcher(), str(tmp_path))


async def test_a_stdio_server_never_imports_a_module_the_model_planted(home, project):
    """`python -m mcp_server_time` in the project imported the model's mcp_server_time.py, as you."""
    project, proof = project
    d = Dispatcher()
    servers = {"time": {"command": PY, "args": ["-m", "mcp_server_time"]}}
    env = await build_agent_env(AgentConfig(mcp_servers=servers), d, str(project))
    try:
        assert env.infos == []
        assert "get_current_time" in await d.list_tools()  # the real server, from the virtualenv
    finally:
        await d.close()
    assert not proof.exists()


async def test_a_stdio_server_is_confined_to_its_home_with_only_its_variables(home, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLIE_TEST_TOKEN", "tok-123")
    project = home / "project"
    project.mkdir()
    (project / "readme").write_text("the project\n")
    d = Dispatcher()
    servers = {"calc": {"command": PY, "args": [str(CALC)], "env": {"MINE": "${OLLIE_TEST_TOKEN}"}}}
    env = await build_agent_env(AgentConfig(mcp_servers=servers), d, str(project))

    async def run(tool: str, **arguments: str) -> str:
        return (await d.dispatch(tool, arguments, CallContext(cwd=str(project)))).text()

    try:
        assert env.infos == []
        home_dir = config.data_path() / "tool-home" / "calc"
        assert await run("cwd") == str(home_dir)  # not the project
        assert await run("env", name="MINE") == "tok-123"  # what its env names
        assert await run("env", name="OPENAI_API_KEY") == ""  # and nothing else of ollie's
        assert await run("env", name="HOME") == str(home_dir)
        assert await run("read", path=str(project / "readme")) == "the project\n"  # the project, read-only
        for path in (home / ".ssh" / "id_rsa", Path(os.environ["OLLIE_CFG_PATH"]) / "env"):
            assert SECRET not in await run("read", path=str(path)) and API_KEY not in await run("read", path=str(path))
        for path in (project / "w", home / ".bashrc", home_dir / "cache"):
            await run("write", path=str(path), text="x")
        assert (home_dir / "cache").exists() and not (project / "w").exists() and not (home / ".bashrc").exists()
    finally:
        await d.close()


async def test_a_stdio_server_may_run_unsandboxed_when_its_entry_says_so(home, tmp_path):
    d = Dispatcher()
    servers = {"calc": {"command": PY, "args": [str(CALC)], "sandbox": False}}
    await build_agent_env(AgentConfig(mcp_servers=servers), d, str(tmp_path))
    try:
        assert (await d.dispatch("cwd", {}, CallContext())).text() == os.getcwd()  # as before: as you
    finally:
        await d.close()
    assert config.starts_outside_sandbox(config.parse_agent("x", {"mcpServers": servers})) == [
        "the tool server 'calc' (\"sandbox\": false)"
    ]


@pytest.mark.skipif(not shutil.which("node"), reason="needs node")
async def test_a_node_server_run_by_its_bin_link_finds_its_packages(home, tmp_path):
    everything = Path(__file__).parents[1] / ".venv/npm/node_modules/.bin/mcp-server-everything"
    if not everything.exists():
        pytest.skip("npm install @modelcontextprotocol/server-everything (./setup.sh --test)")
    project = tmp_path / "project"  # not "/": nothing of the checkout is readable through the project
    project.mkdir()
    d = Dispatcher()
    env = await build_agent_env(AgentConfig(mcp_servers={"everything": {"command": str(everything)}}), d, str(project))
    try:
        assert env.infos == [] and "echo" in await d.list_tools()
    finally:
        await d.close()


def test_a_bad_sandbox_entry_is_refused_naming_the_field():
    from ollie.mcp import parse_spec

    with pytest.raises(ConfigError, match=r"mcpServers.x.sandbox must be a sandbox policy name"):
        parse_spec("x", {"command": "srv", "sandbox": True})
