"""A project's `.mcp.json` starts nothing until the user trusts that exact content (`ollie trust`),
and nothing again once it changes; `"disabled": true` is honoured; the trust cannot be given from
the sandbox. Against a real stdio MCP server (tests/mcp_servers/calc.py), in jails of its own."""

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agent_helpers import children, running
from ollie import project_mcp
from ollie.agent.env import build_agent_env
from ollie.config import AgentConfig
from ollie.tools import CallContext, Dispatcher

PY = sys.executable
CALC = str(Path(__file__).parent / "mcp_servers" / "calc.py")
CTX = CallContext(cwd="/")


@pytest.fixture(autouse=True)
def no_process_left():
    before, servers = children(), running(CALC)
    yield
    assert children() - before == set(), "a server process outlived its dispatcher"
    for _ in range(50):
        if not running(CALC) - servers:
            break
        time.sleep(0.1)
    assert running(CALC) - servers == set(), "a jailed server outlived its dispatcher"


@pytest.fixture
def repo(tmp_path) -> Path:
    """A project of its own (a git repository, with a subdirectory), apart from this checkout."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "sub").mkdir()
    return tmp_path / "repo"


def calc(marker: str, **extra) -> dict:
    """A stdio server whose processes carry `marker` on their command line."""
    return {"command": PY, "args": [CALC, "stdio", marker], **extra}


def write(directory: Path, servers: dict) -> Path:
    path = directory / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}, indent=2) + "\n")
    return path


def ollie(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    main = "import sys; from ollie.cli import main; sys.exit(main())"
    return subprocess.run([PY, "-c", main, *args], input=stdin, capture_output=True, text=True, timeout=60)


async def env_for(cwd: Path, servers: dict | None = None):
    return await build_agent_env(AgentConfig(mcp_servers=servers or {}), Dispatcher(), str(cwd))


async def test_a_file_starts_nothing_until_trusted_and_nothing_again_once_changed(repo):
    marker = f"proj-{uuid.uuid4().hex[:8]}"
    path = write(repo, {"calc": calc(marker)})

    env = await env_for(repo)
    try:
        assert env.dispatcher.servers() == {} and not running(marker)
        [notice] = env.infos
        assert f"{path}: its MCP servers (calc) not started: it is not trusted yet" in notice
        assert f"run `ollie trust {repo}`" in notice
    finally:
        await env.dispatcher.close()

    # Without a terminal to ask on, and without --yes, nothing is trusted.
    asked = ollie("trust", str(repo))
    assert asked.returncode == 1 and "no terminal to ask on" in asked.stderr
    assert f"{path} (not trusted yet; sha256 " in asked.stdout and f"calc: {PY} {CALC} stdio {marker}" in asked.stdout
    assert not project_mcp.store_path().exists()

    trusted = ollie("trust", "--yes", str(repo))
    assert trusted.returncode == 0, trusted.stderr
    assert f"trusted: {path}" in trusted.stdout
    store = project_mcp.store_path()
    assert oct(store.stat().st_mode & 0o777) == "0o600"
    assert json.loads(store.read_text())["files"][str(path)]["sha256"] == project_mcp.read(str(repo)).sha256

    env = await env_for(repo)
    try:
        assert env.infos == [] and list(env.dispatcher.servers()) == ["calc"]
        assert (await env.dispatcher.dispatch("add", {"a": 2, "b": 40}, CTX)).text() == "42"
        assert running(marker)
    finally:
        await env.dispatcher.close()
    listed = ollie("trust", "--list")
    assert listed.stdout.startswith(f"trusted    {path}  (sha256 "), listed.stdout

    path.write_bytes(path.read_bytes().replace(b"\n}\n", b"\n} \n"))  # one byte more: whitespace only
    env = await env_for(repo)
    try:
        assert env.dispatcher.servers() == {}
        [notice] = env.infos
        assert "not started: it changed since you trusted it" in notice and f"`ollie trust {repo}`" in notice
    finally:
        await env.dispatcher.close()
    assert ollie("trust", "--list").stdout.startswith(f"changed    {path}")
    assert "changed since you trusted it" in ollie("trust", str(repo)).stdout

    assert ollie("trust", "--yes", str(repo)).returncode == 0  # trusted again: starts again
    assert ollie("trust", "--yes", str(repo)).stdout == f"already trusted: {path}\n"
    revoked = ollie("trust", "--revoke", str(repo / "sub"))  # the same file, found from below
    assert (revoked.returncode, revoked.stdout) == (0, f"revoked: {path}\n")
    env = await env_for(repo)
    try:
        assert env.dispatcher.servers() == {} and "not trusted yet" in env.infos[0]
    finally:
        await env.dispatcher.close()


async def test_the_repository_root_and_the_cwd_files_merge_and_the_agent_config_wins(repo):
    root_marker, sub_marker, agent_marker = (f"{w}-{uuid.uuid4().hex[:8]}" for w in ("root", "sub", "agent"))
    root = write(repo, {"shared": calc(root_marker), "rooted": calc(root_marker), "mine": calc(root_marker)})
    sub = write(repo / "sub", {"shared": calc(sub_marker)})
    # `ollie trust` from the subdirectory trusts both files a session there reads.
    trusted = ollie("trust", "--yes", str(repo / "sub"))
    assert trusted.returncode == 0 and f"trusted: {root}" in trusted.stdout and f"trusted: {sub}" in trusted.stdout

    env = await env_for(repo / "sub", {"mine": calc(agent_marker)})
    try:
        assert sorted(env.dispatcher.servers()) == ["mine", "rooted", "shared"]
        assert env.infos == [
            f"{sub}: mcp server shared replaces the one {root} declares",
            f"{root}: mcp server mine skipped: the agent config declares one of that name",
        ]
        status = await env.dispatcher.server_status()
        assert all(s.error == "" for s in status.values())
        assert running(agent_marker) and running(root_marker) and running(sub_marker)
        assert len(running(root_marker)) == len(running(sub_marker))  # `rooted` alone; `shared` is the cwd's
    finally:
        await env.dispatcher.close()


async def test_disabled_entries_are_listed_not_started_and_a_project_cannot_choose_its_sandbox(repo):
    marker = f"off-{uuid.uuid4().hex[:8]}"
    write(
        repo,
        {
            "off": calc(marker, disabled=True),
            "web": {"url": "http://127.0.0.1:9/mcp", "disabled": True},
            "loose": calc(marker, sandbox=False),
            "wide": calc(marker, sandbox="default"),
            "../../x": calc(marker),
        },
    )
    shown = ollie("trust", "--yes", str(repo))
    assert shown.returncode == 0, shown.stderr
    assert f"off: {PY} {CALC} stdio {marker} (disabled)" in shown.stdout
    assert "web: http://127.0.0.1:9/mcp (http) (disabled)" in shown.stdout
    assert "loose: " in shown.stdout and "(will not start: sandbox: a project's .mcp.json cannot choose" in shown.stdout

    env = await env_for(repo, {"agent-off": calc(marker, disabled=True)})
    try:
        status = await env.dispatcher.server_status()
        assert {name: s.error.split(":")[0] for name, s in status.items()} == {
            "agent-off": "disabled",
            "off": "disabled",
            "web": "disabled",
            "loose": str(repo / ".mcp.json"),
            "wide": str(repo / ".mcp.json"),
            "../../x": str(repo / ".mcp.json"),
        }
        assert (
            "mcpServers.loose.sandbox: a project's .mcp.json cannot choose a server's sandbox" in status["loose"].error
        )
        assert "the server's name must be letters" in status["../../x"].error
        assert not running(marker)  # not one of them started
        assert len(env.infos) == 3 and all("failed" in i for i in env.infos)  # disabled ones say nothing
    finally:
        await env.dispatcher.close()
    bad = await env_for(repo / "sub", {"odd": calc(marker, disabled="yes")})
    try:
        assert bad.infos[0] == "mcp server odd failed: mcpServers.odd.disabled must be true or false, got 'yes'"
    finally:
        await bad.dispatcher.close()


async def test_a_symlink_a_fifo_or_a_huge_file_is_not_read(repo, tmp_path):
    marker = f"link-{uuid.uuid4().hex[:8]}"
    other = tmp_path / "other"
    other.mkdir()
    write(other, {"calc": calc(marker)})
    assert ollie("trust", "--yes", str(other)).returncode == 0  # trusted where it is: not through a link
    (repo / "sub" / ".mcp.json").symlink_to(other / ".mcp.json")
    env = await env_for(repo / "sub")
    try:
        assert env.dispatcher.servers() == {} and not running(marker)
        assert env.infos == [f"{repo}/sub/.mcp.json not read: it is a symbolic link; " + env.infos[0].split("; ", 1)[1]]
    finally:
        await env.dispatcher.close()
    refused = ollie("trust", "--yes", str(repo / "sub"))
    assert refused.returncode == 1 and "is a symbolic link" in refused.stderr
    assert list(project_mcp.trusted_files()) == [str(other / ".mcp.json")]

    os.mkfifo(repo / ".mcp.json")  # never waited on
    (repo / "sub" / ".mcp.json").unlink()
    (repo / "sub" / ".mcp.json").write_bytes(b" " * (project_mcp.MAX_BYTES + 1))
    env = await env_for(repo / "sub")
    try:
        assert env.infos == [
            f"{repo}/.mcp.json not read: not a regular file",
            f"{repo}/sub/.mcp.json not read: it is over 256 KiB",
        ]
    finally:
        await env.dispatcher.close()


async def test_the_sandbox_can_change_the_file_but_not_the_trust(repo, monkeypatch):
    """Code in a session's sandbox rewrites a trusted .mcp.json and forges the store's entry for
    its new content; the store is hidden in its jail, even with ollie's data inside the project it
    writes, so the next session starts nothing of the file."""
    from ollie.agent import open_session
    from ollie.types import Event

    monkeypatch.setenv("OLLIE_DATA_PATH", str(repo / "ollie-data"))
    marker, evil = (f"{w}-{uuid.uuid4().hex[:8]}" for w in ("kept", "evil"))
    write(repo, {"calc": calc(marker)})
    project_mcp.trust(project_mcp.read(str(repo)))
    store = project_mcp.store_path()
    before = store.read_bytes()
    planted = json.dumps({"mcpServers": {"calc": calc(marker), "evil": calc(evil)}})
    digest = hashlib.sha256(planted.encode() + b"\n").hexdigest()
    forged = json.dumps({"version": 1, "files": {str(repo / ".mcp.json"): {"sha256": digest}}})
    code = (
        f"cat {store}; echo before=$?\n"
        f"echo '{planted}' > .mcp.json; echo planted=$?\n"
        f"echo '{forged}' > {store}; echo forged=$?\n"
    )
    script = [{"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": code}]}}]}, {"text": "ok"}]
    events: list[Event] = []
    core = await open_session(cwd=str(repo), backend="scripted", script=script, on_event=events.append)
    try:
        assert running(marker) and not [e for e in events if e.kind == "info"]  # trusted: started
        await core.submit("trust it yourself")
        [result] = [m.content for m in core.session.messages if m.role == "tool"]
        # The store is not there for it to read; what it wrote in its place, it wrote to the jail's own.
        assert "before=1" in result and "planted=0" in result and "forged=" in result, result
    finally:
        await core.close()
    assert store.read_bytes() == before
    assert project_mcp.read(str(repo)).sha256 == digest  # the file did change as the code meant
    env = await env_for(repo)
    try:
        assert env.dispatcher.servers() == {} and not running(evil) and not running(marker)
        assert "(calc, evil) not started: it changed since you trusted it" in env.infos[0]
    finally:
        await env.dispatcher.close()


def test_a_broken_store_trusts_nothing_and_says_so(repo):
    write(repo, {"calc": calc("never")})
    store = project_mcp.store_path()
    project_mcp.private_dir(store.parent)
    store.write_text("{not json")
    servers, infos = project_mcp.declared(str(repo))
    assert servers == []
    assert infos[0] == (
        f"{store}: not the trusted MCP files ollie writes; remove it (and trust again); "
        "no project's .mcp.json is trusted until it is"
    )
    failed = ollie("trust", "--yes", str(repo))
    assert failed.returncode == 1 and "not the trusted MCP files ollie writes" in failed.stderr
    assert store.read_text() == "{not json"  # not overwritten: the user decides
