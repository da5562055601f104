"""The MCP client against real servers: our FastMCP servers over stdio, streamable HTTP and SSE,
`mcp-server-time` from PyPI and the protocol's reference server from npm; faults; agent switches."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent_helpers import children, running
from ollie import mcp
from ollie.agent.env import build_agent_env
from ollie.config import AgentConfig
from ollie.mcp import log_path, parse_spec
from ollie.tools import CallContext, Dispatcher, Tool, ToolResult
from ollie.types import ConfigError

PY = sys.executable
SERVERS = Path(__file__).parent / "mcp_servers"
EVERYTHING = Path(__file__).parents[1] / ".venv/npm/node_modules/.bin/mcp-server-everything"
CTX = CallContext(cwd="/")


def calc(*args: str, **extra) -> dict:
    return {"command": PY, "args": [str(SERVERS / "calc.py"), *args], **extra}


def broken(mode: str, **extra) -> dict:
    return {"command": PY, "args": [str(SERVERS / "broken.py"), mode], **extra}


class Local:
    """A built-in style server, registered before the MCP ones."""

    def __init__(self) -> None:
        self.closed = False

    async def list_tools(self) -> list[Tool]:
        return [Tool("echo"), Tool("hello")]

    async def call_tool(self, name, arguments, ctx):
        return ToolResult.of(f"local {name}")

    async def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def no_process_left():
    before, servers = children(), running(str(SERVERS))
    yield
    assert children() - before == set(), "a server process outlived its dispatcher"
    for _ in range(50):  # a jail whose owner exited (`ollie tools`) ends its processes at once, not before that
        if not running(str(SERVERS)) - servers:
            break
        time.sleep(0.1)
    assert running(str(SERVERS)) - servers == set(), "a jailed server outlived its dispatcher"


# The session's cwd the servers are started for: a project apart from this checkout (a server's
# program is never taken from the session's cwd, which its code writes).
PROJECT = Path(tempfile.gettempdir()) / f"ollie-mcp-test-project-{os.getpid()}"


@pytest.fixture(autouse=True)
def project():
    PROJECT.mkdir(exist_ok=True)
    yield PROJECT
    shutil.rmtree(PROJECT, ignore_errors=True)


async def connect(servers: dict, cwd: str = str(PROJECT), **pre) -> tuple[Dispatcher, list[str]]:
    d = Dispatcher()
    for name, server in pre.items():
        d.add_server(name, server)
    env = await build_agent_env(AgentConfig(mcp_servers=servers), d, cwd)
    return d, env.infos


async def call(d: Dispatcher, tool: str, **arguments) -> ToolResult:
    return await d.dispatch(tool, arguments, CTX)


async def test_stdio_server_lists_calls_and_reports_a_tool_error(capfd):
    d, infos = await connect({"calc": calc()}, local=Local())
    try:
        assert infos == []
        tools = await d.list_tools()
        assert {"add", "sleep", "calc__echo", "local__echo", "hello"} <= set(tools)  # echo collides
        assert tools["add"].input_schema["required"] == ["a", "b"]
        assert (await call(d, "add", a=2, b=40)).text() == "42"
        assert (await call(d, "calc__echo", text="hi")).text() == "hi"
        assert (await call(d, "local__echo")).text() == "local echo"
        error = await call(d, "fail", reason="disk full")
        assert error.is_error and "failed on purpose: disk full" in error.text()
        invalid = await call(d, "add", a="two")
        assert invalid.is_error
        assert invalid.text() == (
            "invalid arguments for add:\n(arguments): 'b' is a required property\na: 'two' is not of type 'integer'"
        )
    finally:
        await d.close()
    assert "calc server starting" not in capfd.readouterr().err  # the server's stderr is not the terminal
    assert "calc server starting" in log_path("calc").read_text()


async def test_stdio_config_expands_variables_sets_cwd_and_keeps_secrets_out(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLIE_TEST_TOKEN", "t0k3n")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    (tmp_path / "work").mkdir()
    spec = calc(env={"TOKEN": "${OLLIE_TEST_TOKEN}", "MODE": "${OLLIE_TEST_UNSET:-fallback}"}, cwd="work")
    d, infos = await connect({"calc": spec}, cwd=str(tmp_path))
    try:
        assert infos == []
        assert (await call(d, "env", name="TOKEN")).text() == "t0k3n"
        assert (await call(d, "env", name="MODE")).text() == "fallback"
        assert (await call(d, "env", name="OPENAI_API_KEY")).text() == ""
        assert (await call(d, "cwd")).text() == str(tmp_path / "work")
    finally:
        await d.close()


def test_bad_server_entries_get_precise_errors(monkeypatch):
    monkeypatch.delenv("OLLIE_TEST_UNSET", raising=False)
    cases = {
        "x": ({"command": "srv", "args": ["${OLLIE_TEST_UNSET}"]}, "mcpServers.x.args[0]: ${OLLIE_TEST_UNSET} is not"),
        "y": ({"url": "http://h/mcp", "timeout": "soon"}, "mcpServers.y.timeout must be a positive number"),
        "z": ({"type": "websocket", "url": "ws://h"}, "mcpServers.z.type must be stdio, http or sse"),
    }
    for name, (raw, message) in cases.items():
        with pytest.raises(ConfigError, match=message.replace("$", r"\$").replace("[", r"\[").replace("]", r"\]")):
            parse_spec(name, raw)


@pytest.fixture(params=["http", "sse"])
def http_server(request, tmp_path):
    """calc.py served over streamable HTTP or SSE on 127.0.0.1 and a free port."""
    with open(tmp_path / "http.log", "w") as log:
        argv = [PY, str(SERVERS / "calc.py"), request.param]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        port = int(proc.stdout.readline().split()[1])
        path = "/mcp" if request.param == "http" else "/sse"
        yield {"type": request.param, "url": f"http://127.0.0.1:{port}{path}", "headers": {"X-Test": "1"}}, proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


async def test_http_and_sse_servers_list_call_and_fail_at_once_when_killed_mid_call(http_server):
    spec, proc = http_server
    d, infos = await connect({"web": spec})
    try:
        assert infos == []
        assert "add" in await d.list_tools()
        assert (await call(d, "add", a=1, b=2)).text() == "3"
        assert (await call(d, "fail", reason="x")).is_error
        pending = asyncio.create_task(call(d, "sleep", seconds=60))
        await asyncio.sleep(0.3)
        proc.kill()
        result = await pending
        assert result.is_error and result.text().startswith("tool sleep failed: ")
        assert (await d.server_status())["web"].error
    finally:
        await d.close()


async def test_an_unreachable_http_server_is_named_by_its_url():
    url = "http://127.0.0.1:1/mcp"  # nothing listens on port 1
    d, infos = await connect({"docs": {"url": url}})
    try:
        assert len(infos) == 1 and infos[0].startswith("mcp server docs failed: ") and infos[0].endswith(f"({url})")
    finally:
        await d.close()


async def test_servers_that_fail_to_start_exit_hang_or_answer_garbage_leave_the_others_working():
    servers = {
        "calc": calc(),
        "missing": {"command": "/nonexistent/mcp-server"},
        "exits": broken("exit"),
        "hangs": broken("hang", startupTimeout=1),
        "garbage": broken("garbage", startupTimeout=1),
        "unset": {"command": "${OLLIE_TEST_UNSET}"},
    }
    d, infos = await connect(servers)
    try:
        assert infos == [
            "mcp server unset failed: mcpServers.unset.command: ${OLLIE_TEST_UNSET} is not set "
            "(write ${OLLIE_TEST_UNSET:-default} for a default)",
            "mcp server missing failed: cannot run '/nonexistent/mcp-server': not found",
            "mcp server exits failed: the server closed the connection "
            "(stderr: broken: cannot open database /nonexistent/db)",
            "mcp server hangs failed: no answer within 1 s",
            "mcp server garbage failed: no answer within 1 s; it wrote 'this is not json-rpc', which is not MCP",
        ]
        status = await d.server_status()
        assert status["calc"].error == "" and "add" in status["calc"].tools
        assert status["exits"].error.startswith("the server closed the connection") and status["exits"].tools == {}
        # a bad entry stays listed with its reason, for /mcp and for the model that calls its tools
        assert status["unset"].error.startswith("mcpServers.unset.command: ${OLLIE_TEST_UNSET} is not set")
        assert (await call(d, "add", a=1, b=1)).text() == "2"
        result = await call(d, "query_db")
        assert result.is_error and "server hangs is unavailable: no answer within 1 s" in result.text()
        assert "server unset is unavailable: mcpServers.unset.command" in result.text()
    finally:
        await d.close()


async def test_a_server_killed_mid_call_fails_that_call_at_once_and_is_started_again_when_next_asked(monkeypatch):
    d, _ = await connect({"calc": calc()}, local=Local())
    try:
        (pid,) = running(str(SERVERS / "calc.py"))  # in its jail's PID namespace, the server is another pid
        pending = asyncio.create_task(call(d, "sleep", seconds=60))
        await asyncio.sleep(0.3)  # let the request reach the server; killed earlier, the outcome is the same
        os.kill(pid, signal.SIGKILL)
        result = await pending
        assert result.is_error and result.text() == "tool sleep failed: the server closed the connection"
        assert (await call(d, "hello")).text() == "local hello"
        again = await call(d, "add", a=1, b=1)  # a new server: the session has its tools back
        assert not again.is_error and again.text() == "2", again.text()
        (new_pid,) = running(str(SERVERS / "calc.py"))
        assert new_pid != pid and (await d.server_status())["calc"].error == ""
        # Dead again soon after its restart (a crash at every call): it waits before the next start,
        # and one that cannot start then says why; neither is started at every call.
        monkeypatch.setattr(mcp, "Client", Unstartable)
        os.kill(new_pid, signal.SIGKILL)
        first = await call(d, "add", a=1, b=1)  # the call that finds it dead
        assert first.is_error and "the server closed the connection" in first.text()
        for _ in range(3):
            gone = await call(d, "add", a=1, b=1)
            assert gone.is_error and "server calc is unavailable: the server closed the connection" in gone.text()
        assert Unstartable.starts == 0  # its wait (5 s, as it was) is not over
        server = d.get_server("calc")
        server._next_start = 0.0  # (as if the wait were over)
        for _ in range(3):
            gone = await call(d, "add", a=1, b=1)
            assert gone.is_error and "unavailable" in gone.text()
        assert Unstartable.starts == 1  # one start tried, then a longer wait
    finally:
        await d.close()


class Unstartable(mcp.Client):
    starts = 0

    async def connect(self) -> None:
        Unstartable.starts += 1
        raise mcp.Unavailable("its program is gone")


async def test_a_call_that_never_answers_times_out_and_the_server_stays_usable():
    d, _ = await connect({"calc": calc(timeout=0.5)})
    try:
        result = await call(d, "sleep", seconds=60)
        assert result.is_error and result.text() == "tool sleep timed out after 0.5 s (server calc)"
        assert (await call(d, "add", a=3, b=4)).text() == "7"
    finally:
        await d.close()
    assert asyncio.all_tasks() == {asyncio.current_task()}  # no owner or job task left behind


async def test_cancelling_the_start_up_closes_what_it_started():
    d = Dispatcher()
    start = asyncio.create_task(build_agent_env(AgentConfig(mcp_servers={"hangs": broken("hang")}), d, str(PROJECT)))
    await asyncio.sleep(0.3)
    assert running(f"{SERVERS / 'broken.py'} hang")  # the server runs, waiting for a handshake that never comes
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert d.servers() == {}  # closed: the fixture checks that no process is left


async def test_mcp_server_time_from_pypi():
    command = shutil.which("mcp-server-time", path=os.path.dirname(PY))
    assert command, "install the dev extra: pip install -e .[dev]"
    d, infos = await connect({"time": {"command": command}})
    try:
        assert infos == []
        assert {"get_current_time", "convert_time"} <= set(await d.list_tools())
        now = await call(d, "get_current_time", timezone="UTC")
        assert not now.is_error and '"timezone": "UTC"' in now.text()
        bad = await call(d, "get_current_time", timezone="Mars/Olympus_Mons")
        assert bad.is_error and "Invalid timezone" in bad.text()
    finally:
        await d.close()


@pytest.mark.skipif(not shutil.which("node") or not EVERYTHING.exists(), reason="needs node and ./setup.sh --test")
async def test_the_reference_server_everything_from_npm():
    d, infos = await connect({"everything": {"command": str(EVERYTHING)}})
    try:
        assert infos == []
        tools = await d.list_tools()
        assert {"echo", "get-sum", "trigger-long-running-operation"} <= set(tools)
        assert (await call(d, "echo", message="hi")).text() == "Echo: hi"
        assert (await call(d, "get-sum", a=2, b=3)).text() == "The sum of 2 and 3 is 5."
        invalid = await call(d, "get-sum", a="2")
        assert invalid.is_error and "a: '2' is not of type 'number'" in invalid.text()
    finally:
        await d.close()


def write_agent(name: str, servers: dict) -> None:
    agents = Path(os.environ["OLLIE_CFG_PATH"]) / "agents"
    agents.mkdir(exist_ok=True)
    (agents / f"{name}.json").write_text(json.dumps({"mcpServers": servers}))


def ollie(*args: str) -> subprocess.CompletedProcess:
    main = "import sys; from ollie.cli import main; sys.exit(main())"
    return subprocess.run([PY, "-c", main, *args], capture_output=True, text=True, timeout=60)


def test_the_tools_command_lists_and_calls_mcp_and_built_in_tools(tmp_path):
    write_agent("calc", {"calc": calc(), "gone": {"command": "/nonexistent/mcp-server"}})
    listed = ollie("tools", "list", "--agent", "calc", "--json")
    assert listed.returncode == 0, listed.stderr
    servers = json.loads(listed.stdout)
    assert list(servers) == ["execute", "calc", "gone"]
    assert "add" in [t["name"] for t in servers["calc"]["tools"]] and servers["calc"]["error"] == ""
    assert servers["gone"] == {"error": "cannot run '/nonexistent/mcp-server': not found", "tools": []}
    assert ":: mcp server gone failed: cannot run" in listed.stderr

    added = ollie("tools", "call", "add", '{"a": 20, "b": 22}', "--agent", "calc")
    assert (added.returncode, added.stdout) == (0, "42\n")
    failed = ollie("tools", "call", "execute_code", '{"steps": [{"code": "echo oops; exit 3"}]}')
    assert failed.returncode == 1 and "exit status 3" in failed.stderr and "oops" in failed.stderr
    bad_json = ollie("tools", "call", "add", '{"a": 1', "--agent", "calc")
    assert bad_json.returncode == 2 and "invalid JSON arguments at line 1 column 8" in bad_json.stderr
    staged = ollie("tools", "call", "execute_code", '{"steps": [{"code": "pwd"}]}', "--cwd", str(tmp_path))
    assert (staged.returncode, staged.stdout) == (0, f"{tmp_path}\n"), staged.stderr


async def test_an_agent_turn_calls_an_mcp_tool_and_execute_code_then_switches_agent(tmp_path):
    from ollie.agent import open_session

    write_agent("calc", {"calc": calc()})
    write_agent("other", {"other": calc("stdio", "other")})
    script = [
        {
            "tool_calls": [
                {"name": "add", "arguments": {"a": 2, "b": 3}},
                {"name": "execute_code", "arguments": {"steps": [{"code": "echo sandboxed; pwd"}]}},
                {"name": "pid", "arguments": {}},
            ]
        },
        {"text": "All done."},
        {"tool_calls": [{"name": "pid", "arguments": {}}]},
        {"text": "Switched."},
    ]
    core = await open_session(agent="calc", cwd=str(tmp_path), backend="scripted", script=script)
    try:
        await core.submit("add and run")
        results = [(m.name, m.content, m.is_error) for m in core.session.messages if m.role == "tool"]
        assert results[:2] == [("add", "5", False), ("execute_code", f"sandboxed\n{tmp_path}\n", False)]
        assert results[2][1].isdigit()  # its pid in its jail
        calc_server = running(f"{SERVERS / 'calc.py'}")
        assert core.reply == "All done." and len(calc_server) == 1
        assert set(await core.list_servers()) == {"execute", "calc"}

        await core.set_agent("other")
        assert not running(f"{SERVERS / 'calc.py'}") & calc_server
        servers = await core.list_servers()
        assert set(servers) == {"execute", "other"} and "add" in [t.name for t in servers["other"]]
        assert core.session.cwd == str(tmp_path)
        await core.submit("which process now?")
        assert [m.content for m in core.session.messages if m.role == "tool"][-1].isdigit()
        assert running(f"{SERVERS / 'calc.py'} stdio other") and core.reply == "Switched."
    finally:
        await core.close()
