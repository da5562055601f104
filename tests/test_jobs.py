"""Batch jobs (b/) and sub-agents on a real server's mount, with scripted agents: specs, parallel
jobs, JSON answers, cancellation, the concurrency limit, a restart, the b/ and u/ scripts,
subagent_spawn from a session's code, an interrupted fan-out, the depth limit, and IDEAS.md's
spawn_subagents.py run verbatim inside a session's sandbox."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from fs_helpers import FsServer
from ollie.fs.job import TEMPLATE
from test_fs_examples import SPAWN_SUBAGENTS_PY


class Jobs:
    def __init__(self, srv: FsServer):
        self.srv = srv
        self.b = srv.mnt / "b"

    def submit(self, spec: str) -> list[str]:
        """Write a spec to b/new and read the new jobs' ids back on the same open file."""
        with open(self.b / "new", "r+") as f:
            f.write(spec)
            f.flush()
            f.seek(0)
            return f.read().split()

    def wait(self, jid: str, timeout: float = 30) -> str:
        status = (self.b / jid / "status").read_text().strip()
        deadline = os.times().elapsed + timeout
        while status in ("queued", "running"):
            assert os.times().elapsed < deadline, f"job {jid} still {status}"
            status = (self.b / jid / "statewait").read_text().strip()
        return status

    def record(self, jid: str) -> dict:
        return json.loads((self.srv.data / "jobs" / jid / "job.json").read_text())


def _server(tmp_path: Path, **env: str) -> FsServer:
    srv = FsServer(tmp_path)
    srv.env.update(env)
    srv.agent(
        "worker",
        [{"match": "^one", "text": "first"}, {"match": "^two", "text": "second"}, {"match": ".", "text": "done it"}],
    )
    srv.agent("slow", [{"match": ".", "text": "slowly", "delay": 30}])
    srv.agent("brief", [{"match": ".", "text": "briefly", "delay": 0.4}])
    srv.agent("json", [{"match": "good", "text": '{"ok": true}'}, {"match": ".", "text": "not json at all"}])
    srv.ollie("init")
    return srv


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    srv = _server(tmp_path_factory.mktemp("jobs"), OLLIE_JOBS="2")
    srv.start()
    try:
        yield Jobs(srv)
    finally:
        srv.stop()


def test_a_spec_makes_parallel_jobs_that_leave_result_log_usage_and_cost(jobs):
    assert (jobs.b / "new").read_text() == TEMPLATE
    ids = jobs.submit("name=trio\nagent=worker\nparallel=3\n---\nanything\n")
    assert ids == ["trio-0", "trio-1", "trio-2"]
    for jid in ids:
        assert jobs.wait(jid) == "done"
        assert (jobs.b / jid / "result").read_text() == "done it\n"
        assert (jobs.b / jid / "log").read_text() == "user: anything\nassistant: done it\n\n"
        assert re.fullmatch(r"\d+ in, \d+ out, 1 requests.*\n", (jobs.b / jid / "usage").read_text())
        assert "costSession=$0.000000" in (jobs.b / jid / "cost").read_text()
        assert (jobs.b / jid / "spec").read_text() == "name=trio\nagent=worker\nparallel=3\n---\nanything\n"
    assert "loop thread" not in jobs.srv.log()  # making a job's session never waited on the mount
    index = (jobs.b / "idx").read_text()
    assert "trio-1\tdone\tworker\tanything\n" in index
    assert set(ids) <= set(os.listdir(jobs.b)) and "new" not in os.listdir(jobs.b)
    assert not set(ids) & set(os.listdir(jobs.srv.mnt / "s"))  # jobs are not sessions of s/


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("bogus=1\n---\nhi\n", "line 1: unknown key 'bogus'"),
        ("agent=worker\nparallel=0\n---\nhi\n", "line 2: parallel is a whole number from 1 to 64"),
        ("parallel=many\n---\nhi\n", "line 1: parallel is a whole number"),
        ("output=xml\n---\nhi\n", "line 1: output is json"),
        ("agent=worker\njust words\n---\nhi\n", "line 2: expected key=value"),
        ("name=a/b\n---\nhi\n", "line 1: name 'a/b': use letters, digits"),
        ("agent=worker\n", "no line '---'"),
        ("agent=worker\n---\n\n", "the prompt after '---' is empty"),
        ("agent=nobody\n---\nhi\n", "nobody"),
        ("cwd=relative\n---\nhi\n", "relative"),
    ],
)
def test_a_malformed_spec_is_refused_at_its_write_naming_the_line(jobs, spec, reason):
    before = os.listdir(jobs.b)
    fd = os.open(jobs.b / "new", os.O_RDWR)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, spec.encode())
            os.fsync(fd)  # the checks that need the whole spec run at the flush
            os.close(os.dup(fd))
        assert e.value.errno in (22, 2), e.value
        answer = os.pread(fd, 4096, 0).decode()
        assert answer.startswith("error: ") and reason in answer, answer
    finally:
        os.close(fd)
    assert os.listdir(jobs.b) == before


@pytest.mark.parametrize(
    "header",
    ["agent=nobody", "backend=nosuch", "cwd=/nonexistent", "cwd=relative", "model=m\nagent=worker\nbackend=nosuch"],
)
def test_a_header_naming_what_is_not_there_fails_the_shells_write(jobs, header):
    """`printf 'agent=nosuch\n---\nhi\n' > b/new` exited 0 and made no job: the agent, the
    backend and the cwd were checked at the close, whose error a shell ignores."""
    before = os.listdir(jobs.b)
    out = jobs.srv.sh(f"printf '{header}\\n---\\nhi\\n' | cat > b/new", check=False)  # cat names the errno
    assert out.returncode != 0 and ("Invalid argument" in out.stderr or "No such file" in out.stderr), out
    assert os.listdir(jobs.b) == before


def test_output_json_takes_json_and_fails_anything_else(jobs):
    good, bad = (
        jobs.submit("agent=json\noutput=json\n---\ngood\n")[0],
        jobs.submit("agent=json\noutput=json\n---\nx\n")[0],
    )
    assert jobs.wait(good) == "done" and json.loads((jobs.b / good / "result").read_text()) == {"ok": True}
    assert jobs.wait(bad).startswith("failed: the answer is not JSON")
    assert (jobs.b / bad / "result").read_text() == "not json at all\n"  # the answer is kept
    assert "Answer with one JSON value" in (jobs.b / good / "log").read_text()


def test_rm_r_cancels_a_running_job_and_removes_it(jobs):
    [jid] = jobs.submit("agent=slow\n---\ntake your time\n")
    assert (jobs.b / jid / "statewait").read_text().strip() == "running"
    jobs.srv.sh(f"rm -r b/{jid}")
    assert jid not in os.listdir(jobs.b)
    assert not (jobs.srv.data / "jobs" / jid).exists()


def test_no_more_jobs_run_at_once_than_the_server_allows(jobs):
    ids = jobs.submit("name=four\nagent=brief\nparallel=4\n---\ngo\n")
    for jid in ids:
        assert jobs.wait(jid) == "done"
    spans = sorted((r["started"], r["finished"]) for r in map(jobs.record, ids))
    for i, (start, _) in enumerate(spans):
        running = sum(1 for s, f in spans[:i] if f > start)
        assert running < 2, spans  # OLLIE_JOBS=2: a third starts only once one has finished


def test_b_q_waits_and_b_sched_returns_at_once(jobs):
    out = jobs.srv.sh("b/q agent=worker one thing")
    assert out.stdout == "first\n"
    out = jobs.srv.sh("b/q agent=worker parallel=2 two things")
    assert re.fullmatch(r"== (job-\S+-0)\nsecond\n== job-\S+-1\nsecond\n", out.stdout), out.stdout
    out = jobs.srv.sh("echo two | b/sched agent=brief")
    [jid] = out.stdout.split()
    assert jobs.wait(jid) == "done" and (jobs.b / jid / "result").read_text() == "briefly\n"
    failed = jobs.srv.sh("b/q agent=json output=json no", check=False)
    assert failed.returncode == 1 and "failed: the answer is not JSON" in failed.stderr
    refused = jobs.srv.sh("b/q agent=nosuch hi", check=False)  # why, not only "Invalid argument"
    assert refused.returncode == 2 and "b/job: no agent 'nosuch'" in refused.stderr, refused.stderr
    before = set(os.listdir(jobs.b))
    typo = jobs.srv.sh("b/q agnet=worker one thing", check=False)  # not run with "agnet=worker" as its prompt
    assert typo.returncode == 2 and "b/job: unknown setting 'agnet'" in typo.stderr, typo.stderr
    assert set(os.listdir(jobs.b)) == before
    out = jobs.srv.sh("b/q agent=worker -- x=1 one thing")  # after --, the prompt's own words
    assert out.stdout == "done it\n"  # (the prompt is "x=1 one thing": not the rule for "^one")


def test_b_job_without_a_cwd_works_where_it_is_run_from(jobs, tmp_path):
    """`cd ~/proj && $OLLIE/b/q "review main.py"` reviews ~/proj, not the server's start directory;
    run on the mount (the README's tour), or with `cwd=` alone, the job works in the server's."""
    proj = tmp_path / "proj"
    proj.mkdir()
    sched = ["sh", str(jobs.b / "sched"), "agent=brief", "hi"]
    out = subprocess.run(sched, cwd=proj, env=jobs.srv.env, capture_output=True, text=True, timeout=30, check=True)
    [jid] = out.stdout.split()
    assert f"cwd={proj.resolve()}\n" in (jobs.b / jid / "spec").read_text()
    assert jobs.wait(jid) == "done"
    out = subprocess.run([*sched[:2], "cwd=", *sched[2:]], cwd=proj, env=jobs.srv.env, capture_output=True, text=True)
    [jid] = out.stdout.split()
    assert "cwd=\n" in (jobs.b / jid / "spec").read_text()
    [jid] = jobs.srv.sh("b/sched agent=brief hi").stdout.split()
    assert "cwd" not in (jobs.b / jid / "spec").read_text()
    odd = tmp_path / "x\nagent=slow"  # (a name that would add a line of its own to the spec)
    odd.mkdir()
    out = subprocess.run(sched, cwd=odd, env=jobs.srv.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "holds a newline" in out.stderr, out.stderr


def test_u_optimize_judges_on_the_backend_and_model_it_was_given(jobs, tmp_path):
    """`backend=` and `model=` are the judge's too: it ran on the default agent's backend."""
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([{"text": "2\nShorter."}]))  # each job's session reads it from its start
    out = jobs.srv.sh(f"u/optimize -n 2 backend=scripted model={script} name the thing")
    assert out.stdout == "candidate 2 of 2:\n2\nShorter.\n\nwhy: Shorter.\n", out.stderr


def test_u_optimize_has_a_judge_pick_a_candidate(jobs):
    jobs.srv.agent("judge", [{"match": "Candidate 3", "text": "2\nIt is the clearest."}])
    out = jobs.srv.sh("OPTIMIZE_JUDGE_AGENT=judge u/optimize -n 3 agent=worker name the thing")
    assert out.stdout == "candidate 2 of 3:\ndone it\n\nwhy: It is the clearest.\n"


def test_finished_jobs_keep_their_results_across_a_restart_and_running_ones_are_marked(tmp_path):
    srv = _server(tmp_path, OLLIE_JOBS="2")
    srv.start()
    try:
        jobs = Jobs(srv)
        [done] = jobs.submit("agent=worker\n---\none more\n")
        assert jobs.wait(done) == "done"
        [stopped] = jobs.submit("agent=slow\n---\nlong\n")
        assert (jobs.b / stopped / "statewait").read_text().strip() == "running"
        srv.stop()
        srv.start()
        [crashed, queued] = jobs.submit("name=crash\nagent=slow\nparallel=2\n---\nlong\n")
        [early] = jobs.submit("agent=slow\n---\nlong\n")
        assert (jobs.b / crashed / "statewait").read_text().strip() == "running"
        srv.kill9()
        srv.start()
        assert (jobs.b / done / "status").read_text() == "done\n"
        assert (jobs.b / done / "result").read_text() == "first\n"
        assert (jobs.b / stopped / "status").read_text() == "failed: interrupted by a server stop\n"
        for jid in (crashed, queued, early):  # running or queued (OLLIE_JOBS=4: one of them waited)
            assert (jobs.b / jid / "status").read_text() == "failed: interrupted by restart\n"
    finally:
        srv.stop()


# ---- sub-agents -------------------------------------------------------------------------------------


def _spawn(*prompts: str, agent: str = "") -> dict:
    args = (["--agent", agent] if agent else []) + list(prompts)
    return {"name": "execute_code", "arguments": {"steps": [{"tool": "subagent_spawn", "args": args}]}}


@pytest.fixture
def lead(tmp_path):
    srv = _server(tmp_path)
    srv.env["OLLIE"] = str(srv.mnt)
    yield srv
    srv.stop()


def test_a_parent_turn_fans_out_three_sub_agents_and_gets_their_answers_in_order(lead):
    lead.agent(
        "lead",
        turns=[
            {"tool_calls": [_spawn("two", "one", "three", agent="worker")]},
            {"text": "collected", "expect": "## 1: two\nsecond\n\n## 2: one\nfirst\n\n## 3: three\ndone it\n"},
        ],
        subagents=["worker"],
    )
    lead.start()
    sid = lead.new_session(agent="lead")
    (lead.mnt / "s" / sid / "prompt").write_text("delegate\n")
    lead.wait_idle(sid, timeout=60)
    assert (lead.mnt / "s" / sid / "reply").read_text() == "collected"
    cost = (lead.mnt / "s" / sid / "cost").read_text()
    assert "costSubagents=$0.000000\ncostTotal=$0.000000\n" in cost
    assert "(3 sub-agents)" in (lead.mnt / "s" / sid / "usage").read_text()
    assert len(os.listdir(lead.mnt / "b")) == 3  # the user sees them in b/


def test_an_interrupted_parent_leaves_no_sub_agent_running(lead):
    lead.agent(
        "lead",
        turns=[{"tool_calls": [_spawn("a", "b", agent="slow")]}, {"text": "never"}],
        subagents=["slow"],
    )
    lead.start()
    sid = lead.new_session(agent="lead")
    jobs = Jobs(lead)
    (lead.mnt / "s" / sid / "prompt").write_text("delegate\n")
    while len(os.listdir(jobs.b)) < 2 or any(
        (jobs.b / j / "status").read_text() != "running\n" for j in os.listdir(jobs.b)
    ):
        (lead.mnt / "s" / sid / "statewait").read_text()  # wait a little: a state change, or 5 s
    (lead.mnt / "s" / sid / "ctl").write_text("stop\n")
    lead.wait_idle(sid)
    assert [jobs.wait(j) for j in sorted(os.listdir(jobs.b))] == ["cancelled", "cancelled"]


def test_sub_agents_nest_only_as_deep_as_allowed(lead):
    lead.env["OLLIE_SUBAGENT_DEPTH"] = "1"
    lead.agent(
        "nester",
        turns=[
            {"tool_calls": [_spawn("deeper")]},
            {"text": "could not go deeper", "expect": "cannot start a sub-agent: sub-agents nest 1 deep at most"},
        ],
    )
    lead.agent(
        "lead",
        turns=[{"tool_calls": [_spawn("nest", agent="nester")]}, {"text": "ok", "expect": "could not go deeper"}],
        subagents=["nester"],
    )
    lead.start()
    sid = lead.new_session(agent="lead")
    (lead.mnt / "s" / sid / "prompt").write_text("go\n")
    lead.wait_idle(sid, timeout=60)
    assert (lead.mnt / "s" / sid / "reply").read_text() == "ok"
    [child] = os.listdir(lead.mnt / "b")
    assert "sub-agents nest 1 deep at most (OLLIE_SUBAGENT_DEPTH)" in (lead.mnt / "b" / child / "log").read_text()


def test_ideas_spawn_subagents_runs_verbatim_inside_a_sessions_sandbox(lead):
    tool = lead.cfg / "tools" / "spawn_subagents.py"
    tool.write_text(SPAWN_SUBAGENTS_PY)  # IDEAS.md's, verbatim
    tool.chmod(0o755)
    spec = json.dumps([{"task": "one", "agent": "worker", "context": "ctx"}, {"task": "two", "agent": "worker"}])
    lead.agent(
        "lead",
        turns=[
            {
                "tool_calls": [
                    {
                        "name": "execute_code",
                        "arguments": {
                            "steps": [{"code": f"printf '%s' '{spec}'"}, {"tool": "spawn_subagents.py"}],
                            "timeout": 60,
                        },
                    }
                ]
            },
            {"text": "fanned out", "expect": '"reply": "second"'},
        ],
        subagents=["worker"],
    )
    lead.start()
    sid = lead.new_session(agent="lead")
    (lead.mnt / "s" / sid / "prompt").write_text("fan out\n")
    lead.wait_idle(sid, timeout=90)
    chat = (lead.mnt / "s" / sid / "chat").read_text()
    result = json.loads(chat.split("spawn_subagents.py", 2)[-1].split("\n", 1)[1].rsplit("]", 1)[0] + "]")
    assert result == [{"agent": "worker", "reply": "done it"}, {"agent": "worker", "reply": "second"}]
    assert os.listdir(lead.mnt / "s") == [sid]  # it killed its sub-sessions
    out = subprocess.run(["cat", str(lead.mnt / "s" / sid / "usage")], capture_output=True, text=True)
    assert "(2 sub-agents)" in out.stdout


def test_a_refused_spec_fails_every_later_write_of_that_open_file_alike(jobs):
    """Python's buffered writer (and a shell's) may write again after a refusal: still EINVAL, not
    another error that would hide the reason."""
    with pytest.raises(OSError) as e:
        (jobs.b / "new").write_text("parallel=100\n---\nhi\n")  # written at close, and again
    assert e.value.errno == 22
