"""Batch jobs on a real Ray cluster: a head node started on loopback (`ray start --head`, with its
own workers), a real server whose `b/` runs its jobs there (OLLIE_BATCH_EXECUTOR=ray), scripted
agents. Jobs leave the same files as local ones (the log streaming while they run), a session's
`subagent_spawn` fans out through the cluster, `rm -r` and an interrupt cancel the task (its
sandboxed process ends, its worker lives on), a killed worker fails its job, an unreachable cluster
fails the submission, and a cwd the worker lacks fails the job saying so."""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed here (pip install 'ollie-agents[ray]')")

from fs_helpers import FsServer  # noqa: E402
from ollie.fs.ray_jobs import forwarded_env, run_task  # noqa: E402
from test_jobs import Jobs, _server, _spawn  # noqa: E402

RAY = Path(sys.executable).parent / "ray"  # the ray command of this Python's environment


HOST = socket.gethostname()
SERVER_ONLY = {"OLLIE_PROXY_AUTH": "Basic c2VjcmV0", "OLLIE_ANTHROPIC_URL": "https://user:hunter2@127.0.0.1:9/"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A Ray head with 4 CPUs' worth of workers, on loopback, in its own temp dir and session."""

    def __init__(self, env: dict[str, str]):
        for attempt in range(3):
            error = self._start(env)
            if error is None:
                return
            shutil.rmtree(self.temp, ignore_errors=True)
            # The port was free when picked; something took it before Ray's GCS bound it: pick again.
            assert "Failed to start the grpc server" in error and attempt < 2, error

    def _start(self, env: dict[str, str]) -> str | None:
        """Start the head; None once it answers, or what it said if it exited first."""
        self.port = _free_port()
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
        self.proc = subprocess.Popen(
            [
                str(RAY if RAY.exists() else shutil.which("ray")),
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=4",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={self.temp}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return None
            except OSError:
                if self.proc.poll() is not None:
                    return self.proc.stderr.read().decode() if self.proc.stderr else ""
                assert time.monotonic() < deadline, "the Ray head did not start in 60 s"
                time.sleep(0.2)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()  # --block: the command stops what it started
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever lingers in its session
        except ProcessLookupError:
            pass
        self.proc.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory):
    srv = _server(tmp_path_factory.mktemp("rayjobs"))
    # Token authentication, as a cluster should run: the head, its workers and the server share it.
    srv.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    cluster = Cluster(srv.env)
    # The server's own, after the cluster started: a worker has them only if they ride with a task.
    srv.env.update(OLLIE_BATCH_EXECUTOR="ray", RAY_ADDRESS=cluster.address, **SERVER_ONLY)
    srv.agent(
        "snoop",
        turns=[
            {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "env; echo END"}]}}]},
            {"text": "seen"},
        ],
    )
    srv.agent("sleeper", turns=_sleeper("sleep 301.5"))
    # An MCP server of the worker's reports the worker's variables (expanded there from its env).
    calc = Path(__file__).parent / "mcp_servers" / "calc.py"
    seen = {name: f"${{{name}:-unset}}" for name in SERVER_ONLY}
    srv.agent(
        "envsnoop",
        turns=[
            *({"tool_calls": [{"name": "env", "arguments": {"name": name}}]} for name in SERVER_ONLY),
            {"text": "seen"},
        ],
        mcpServers={"calc": {"command": sys.executable, "args": [str(calc)], "env": seen}},
    )
    try:
        srv.start()
        yield Jobs(srv)
    finally:
        srv.stop()
        cluster.stop()


def _sleeper(command: str) -> list[dict]:
    return [
        {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": command}]}}]},
        {"text": "woke"},
    ]


def _gone(marker: str, timeout: float = 20) -> None:
    """Wait for the sandboxed process to end; 20 s is well before its step's own 30 s timeout."""
    deadline = time.monotonic() + timeout
    while _sandboxed(marker):
        assert time.monotonic() < deadline, f"{marker!r} lives on"
        time.sleep(0.1)


def _log_until(jobs: Jobs, jid: str, pattern: str, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while not (found := re.search(pattern, (jobs.b / jid / "log").read_text())):
        assert time.monotonic() < deadline, (
            f"{jid}'s log never showed {pattern!r}: {(jobs.b / jid / 'log').read_text()!r}"
        )
        time.sleep(0.1)
    return found


def _sandboxed(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_jobs_run_on_the_cluster_and_leave_result_log_usage_and_cost(on_ray):
    ids = on_ray.submit("name=far\nagent=worker\nparallel=3\n---\ntwo of them\n")
    assert ids == ["far-0", "far-1", "far-2"]
    for jid in ids:
        assert on_ray.wait(jid, timeout=90) == "done"
        assert (on_ray.b / jid / "result").read_text() == "second\n"
        log = (on_ray.b / jid / "log").read_text()
        assert re.fullmatch(
            rf":: running on Ray node {re.escape(HOST)}, worker pid \d+\nuser: two of them\nassistant: second\n\n", log
        )
        assert re.fullmatch(r"\d+ in, \d+ out, 1 requests.*\n", (on_ray.b / jid / "usage").read_text())
        assert "costSession=$0.000000" in (on_ray.b / jid / "cost").read_text()
        assert on_ray.record(jid)["model"].endswith("worker.script.json")
    pids = {_log_until(on_ray, jid, r"worker pid (\d+)")[1] for jid in ids}
    assert str(os.getpid()) not in pids and str(on_ray.srv.pid()) not in pids  # workers, not the server


def test_a_json_job_on_the_cluster_is_checked_alike(on_ray):
    good, bad = on_ray.submit("agent=json\noutput=json\n---\ngood\n") + on_ray.submit(
        "agent=json\noutput=json\n---\nx\n"
    )
    assert on_ray.wait(good, timeout=90) == "done"
    assert on_ray.wait(bad, timeout=90).startswith("failed: the answer is not JSON")


def test_the_log_streams_while_the_job_runs_and_rm_r_cancels_its_task(on_ray):
    (jid,) = on_ray.submit("agent=sleeper\n---\nnap\n")
    pid = int(_log_until(on_ray, jid, r"worker pid (\d+)")[1])
    _log_until(on_ray, jid, r"sleep 301\.5")  # the tool call is in the log before the job ends
    assert (on_ray.b / jid / "status").read_text() == "running\n"
    deadline = time.monotonic() + 30
    while not _sandboxed("sleep 301.5"):
        assert time.monotonic() < deadline, "the sandboxed sleep never started"
        time.sleep(0.1)
    shutil.rmtree(on_ray.b / jid)
    assert jid not in (on_ray.b / "idx").read_text()
    _gone("sleep 301.5")  # the task was cancelled: its session closed its sandbox
    os.kill(pid, 0)  # the worker itself lives on, for the next task


def test_a_server_stop_interrupts_its_jobs_on_the_cluster_and_says_so_after_a_restart(on_ray, tmp_path):
    other = _server(tmp_path)
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "OLLIE_BATCH_EXECUTOR", "RAY_ADDRESS"):
        other.env[key] = on_ray.srv.env[key]
    other.agent("sleeper", turns=_sleeper("sleep 302.5"))
    other.start()
    try:
        jobs = Jobs(other)
        (jid,) = jobs.submit("agent=sleeper\n---\nnap\n")
        _log_until(jobs, jid, r"sleep 302\.5")
        other.stop()
        _gone("sleep 302.5")
        other.start()
        assert (jobs.b / jid / "status").read_text() == "failed: interrupted by a server stop\n"
    finally:
        other.stop()


def test_a_killed_worker_fails_its_job_and_the_cluster_runs_the_next(on_ray):
    (jid,) = on_ray.submit("agent=slow\n---\ntake your time\n")
    pid = int(_log_until(on_ray, jid, r"worker pid (\d+)")[1])
    os.kill(pid, signal.SIGKILL)
    assert on_ray.wait(jid, timeout=90) == "failed: its Ray worker died while running it"
    assert "died" in (on_ray.b / jid / "result").read_text().lower()
    (again,) = on_ray.submit("agent=worker\n---\none more\n")
    assert on_ray.wait(again, timeout=90) == "done"


def test_a_cwd_the_worker_lacks_fails_the_job_saying_where(on_ray):
    (jid,) = on_ray.submit("agent=worker\ncwd=/nonexistent/ollie-ray-test\n---\nhello\n")
    status = on_ray.wait(jid, timeout=90)
    assert status == (
        f"failed: cwd '/nonexistent/ollie-ray-test' does not exist on Ray node {HOST}: "
        "run jobs where every node shares it"
    )


def test_a_sessions_fan_out_runs_on_the_cluster_and_an_interrupt_cancels_it(on_ray):
    srv = on_ray.srv
    srv.agent(
        "lead",
        turns=[
            {"tool_calls": [_spawn("two", "one", agent="worker")]},
            {"text": "collected", "expect": "## 1: two\nsecond\n\n## 2: one\nfirst\n"},
        ],
        subagents=["worker"],
    )
    sid = srv.new_session(agent="lead")
    (srv.mnt / "s" / sid / "prompt").write_text("delegate\n")
    srv.wait_idle(sid, timeout=120)
    assert (srv.mnt / "s" / sid / "reply").read_text() == "collected"
    assert "(2 sub-agents)" in (srv.mnt / "s" / sid / "usage").read_text()
    spawned = [j.name for j in on_ray.b.iterdir() if on_ray.record(j.name)["parent"] == sid]
    assert len(spawned) == 2
    for jid in spawned:
        assert f"on Ray node {HOST}" in (on_ray.b / jid / "log").read_text()

    srv.agent("lazy", turns=[{"tool_calls": [_spawn("a", agent="sleeper")]}, {"text": "never"}], subagents=["sleeper"])
    sid = srv.new_session(agent="lazy")
    (srv.mnt / "s" / sid / "prompt").write_text("delegate\n")
    deadline = time.monotonic() + 60
    while not _sandboxed("sleep 301.5"):
        assert time.monotonic() < deadline, "the sub-agent's sandboxed sleep never started"
        time.sleep(0.1)
    (srv.mnt / "s" / sid / "ctl").write_text("stop\n")
    srv.wait_idle(sid, timeout=30)
    (child,) = [j.name for j in on_ray.b.iterdir() if on_ray.record(j.name)["parent"] == sid]
    assert on_ray.wait(child) == "cancelled"
    _gone("sleep 301.5")  # the task was cancelled: its session closed its sandbox


def test_an_unreachable_cluster_fails_the_submission_and_makes_nothing(tmp_path):
    port = _free_port()
    srv: FsServer = _server(tmp_path, OLLIE_BATCH_EXECUTOR="ray", RAY_ADDRESS=f"127.0.0.1:{port}")
    srv.start()
    try:
        jobs = Jobs(srv)
        with pytest.raises(OSError) as refused:
            (jobs.b / "new").write_text("agent=worker\n---\nhello\n")
        assert refused.value.errno == errno.ECONNREFUSED  # "Connection refused", at the write a shell reports
        out = subprocess.run(["sh", str(jobs.b / "job"), "agent=worker", "hello"], capture_output=True, text=True)
        assert out.returncode == 2 and "Connection refused" in out.stderr
        assert f"the Ray cluster at 127.0.0.1:{port} cannot be reached" in srv.log()
        assert (jobs.b / "idx").read_text() == ""
        assert not (srv.data / "jobs").exists() or not os.listdir(srv.data / "jobs")
    finally:
        srv.stop()


# A cluster address that accepts and never answers, three jobs' attempts to join it, then a call
# of the loop's pool: in a process of its own, where the Ray client left half-joined stays.
_SILENT_CLUSTER = """
import asyncio, os, socket
from concurrent.futures import ThreadPoolExecutor
from ollie.fs import ray_jobs
from ollie.types import OllieError

async def main():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
    ray_jobs.INIT_TIMEOUT = 1.0
    executor = ray_jobs.RayExecutor(None, "127.0.0.1:%d" % listener.getsockname()[1])
    for _ in range(3):
        try:
            await executor.ready()
        except OllieError as e:
            print("refused:", e, flush=True)
    try:
        async with asyncio.timeout(5):
            await asyncio.to_thread(lambda: None)
        print("served", flush=True)
    except TimeoutError:
        print("starved", flush=True)

asyncio.new_event_loop().run_until_complete(main())
os._exit(0)
"""


def test_a_cluster_that_never_answers_holds_none_of_the_loops_threads():
    """`ray.init` on an address that accepts and never answers waits a minute and more: it waited
    in a thread of the loop's pool, and each job's attempt took another, until the pool served no
    one (a jail's start, a snapshot). A later attempt now waits for the one still under way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", _SILENT_CLUSTER], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.count("did not answer in 1 s") == 3, out.stdout + out.stderr[-2000:]
    assert out.stdout.rstrip().endswith("served"), out.stdout


def test_sandboxed_code_on_a_worker_sees_neither_keys_nor_the_clusters_token(on_ray):
    (jid,) = on_ray.submit("agent=snoop\n---\nlook around\n")
    assert on_ray.wait(jid, timeout=90) == "done"
    log = (on_ray.b / jid / "log").read_text()
    assert "END" in log and "PATH=" in log  # the environment was printed
    assert on_ray.srv.env["RAY_AUTH_TOKEN"] not in log and "RAY_" not in log


def test_a_worker_gets_the_listed_settings_alone_and_urls_without_credentials(on_ray):
    (jid,) = on_ray.submit("agent=envsnoop\n---\nlook around\n")
    assert on_ray.wait(jid, timeout=90) == "done", (on_ray.b / jid / "result").read_text()
    log = (on_ray.b / jid / "log").read_text()
    assert "-> env(" in log and "\nunset\n" in log  # OLLIE_PROXY_AUTH stayed home
    assert "\nhttps://127.0.0.1:9/\n" in log  # the URL came, without its user and password
    assert "c2VjcmV0" not in log and "hunter2" not in log


def test_a_malformed_ray_address_fails_the_submission_naming_the_fix(tmp_path):
    srv: FsServer = _server(tmp_path, OLLIE_BATCH_EXECUTOR="ray", RAY_ADDRESS="head-node-without-port")
    srv.start()
    try:
        with pytest.raises(OSError) as refused:
            (srv.mnt / "b" / "new").write_text("agent=worker\n---\nhello\n")
        assert refused.value.errno == errno.EINVAL
        assert "RAY_ADDRESS='head-node-without-port': give the head node as host:port" in srv.log()
        assert (srv.mnt / "b" / "idx").read_text() == ""
    finally:
        srv.stop()


def test_an_unknown_executor_fails_the_servers_start_naming_it(tmp_path):
    srv: FsServer = _server(tmp_path, OLLIE_BATCH_EXECUTOR="rya")
    out = srv.ollie("srv", "start", check=False)
    assert out.returncode == 1 and "OLLIE_BATCH_EXECUTOR='rya': give local or ray" in out.stderr


def test_only_listed_settings_ride_with_a_task_and_urls_without_credentials():
    env = {
        "OLLIE_OPENAI_URL": "http://127.0.0.1:9",
        "OLLIE_OPENAI_KEY": "sk-1",
        "OLLIE_ANTHROPIC_API_KEY": "sk-2",
        "OLLIE_GITHUB_TOKEN": "t",
        "OLLIE_DB_PASSWORD": "p",
        "OLLIE_CFG_PATH": "/cfg",
        "OPENAI_API_KEY": "sk-3",
        "PATH": "/bin",
        # credentials under names no filter of words foresees, and settings that are the server's own
        "OLLIE_PROXY_AUTH": "Basic dTpw",
        "OLLIE_GCP_CREDENTIALS": '{"private_key": "k"}',
        "OLLIE_BASE_URL": "https://u:p@host/",
        "OLLIE_JOBS": "8",
        "OLLIE_SUBAGENT_DEPTH": "5",
        "OLLIE_TRANSCRIPT_DAYS": "1",
        # URLs that carry a user and password, with or without a scheme
        "OLLIE_ANTHROPIC_URL": "https://user:secret@proxy.example:8443/anthropic",
        "OPENAI_BASE_URL": "http://u:p@a@gw.example/v1?x=y",
        "OLLAMA_HOST": "u:p@gpu-box:11434",
        "OLLIE_VLLM_URL": "http://vllm.example/v1?who=a@b",  # an @ past the host is no credential
        "OLLIE_MODEL": "claude-sonnet-4@20250514",  # nor is one in a value that is no URL
    }
    assert forwarded_env(env) == {
        "OLLIE_CFG_PATH": "/cfg",
        "OLLIE_MODEL": "claude-sonnet-4@20250514",
        "OLLIE_OPENAI_URL": "http://127.0.0.1:9",
        "OPENAI_BASE_URL": "http://gw.example/v1?x=y",
        "OLLIE_ANTHROPIC_URL": "https://proxy.example:8443/anthropic",
        "OLLAMA_HOST": "gpu-box:11434",
        "OLLIE_VLLM_URL": "http://vllm.example/v1?who=a@b",
    }


def test_a_worker_refuses_a_sub_agent_whose_agent_runs_outside_the_sandbox_there(tmp_path, monkeypatch):
    """The server checked the agent against its own configs; a worker whose config differs (the
    same name, a `!command` prompt) refuses it too, before anything runs."""
    (tmp_path / "cfg" / "agents").mkdir(parents=True)
    bang = '{"backend": "scripted", "prompt": "!touch ran", "hookSandbox": false}'
    (tmp_path / "cfg" / "agents" / "bang.json").write_text(bang)
    monkeypatch.setenv("OLLIE_CFG_PATH", str(tmp_path / "cfg"))
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    task = {"job_id": "j-0", "prompt": "hi", "output": "", "cwd_within": str(tmp_path)}
    task["settings"] = {"agent": "bang", "cwd": str(tmp_path)}
    *_, last = run_task(task)
    why = 'runs hooks or prompt commands with "hookSandbox": false outside the sandbox'
    assert last["status"] == f"failed: agent 'bang' {why}"
    assert not (tmp_path / "ran").exists()


def test_a_worker_refuses_a_sub_agents_cwd_swapped_for_a_link_since_it_was_checked(tmp_path, monkeypatch):
    """The server made the cwd real and checked it was inside the parent's; sandboxed code that can
    write there may replace it with a link to elsewhere while the job waits in the cluster's queue."""
    (tmp_path / "cfg").mkdir()
    monkeypatch.setenv("OLLIE_CFG_PATH", str(tmp_path / "cfg"))
    monkeypatch.setenv("OLLIE_DATA_PATH", str(tmp_path / "data"))
    (tmp_path / "outside").mkdir()
    (tmp_path / "sub").symlink_to(tmp_path / "outside")  # was a directory when the server checked it
    task = {"job_id": "j-0", "prompt": "hi", "output": "", "cwd_within": str(tmp_path)}
    task["settings"] = {"agent": "", "backend": "scripted", "cwd": str(tmp_path / "sub")}
    *_, last = run_task(task)
    assert last["status"].startswith(f"failed: cwd '{tmp_path / 'sub'}' leads elsewhere on Ray node")
