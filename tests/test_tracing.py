"""Traces and metrics: exported over OTLP/HTTP to a receiver on loopback (decoded with
opentelemetry-proto), for a scripted turn with two tool calls, one of which starts a sub-agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ollie import telemetry

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (./setup.sh --test installs it)")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

KEY = "sk-test-7f3a9c1d5e"  # an API key in the environment: it must appear nowhere in what is exported


class Receiver:
    """An OTLP/HTTP receiver: what ollie exports, decoded."""

    def __init__(self) -> None:
        self.spans: list = []
        self.metrics: list = []
        self.resources: list = []
        self.raw: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.raw.append(body + str(self.headers).encode())
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    receiver.spans += [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
                    receiver.resources += [r.resource for r in request.resource_spans]
                elif self.path == "/v1/metrics":
                    request = ExportMetricsServiceRequest.FromString(body)
                    receiver.metrics += [
                        m for r in request.resource_metrics for sm in r.scope_metrics for m in sm.metrics
                    ]
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver(monkeypatch):
    r = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")  # exported at the flush, not on a timer
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert telemetry.setup(force=True) is not None
    try:
        yield r
    finally:
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
        telemetry.setup(force=True)  # shuts the exporters down; off again for the other tests
        r.close()
        assert telemetry.active() is None


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = list(x.string_value for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)
    return out


def lead_script(h, tmp_path, usage):
    """The lead agent: one answer with two execute_code calls (the second starts a sub-agent, prompts
    it and reads its reply), then its text."""
    kid = """echo 'new name=kid agent=default' > $OLLIE/ctl
s=$OLLIE/s/$OLLIE_SESSION_ID.kid
echo 'hello kid' > $s/prompt
until [ "$(cat $s/state)" = idle ]; do cat $s/statewait > /dev/null; done
cat $s/reply"""
    script = [
        {
            "tool_calls": [
                {"name": "execute_code", "arguments": {"steps": [{"code": "echo first-secret-output"}]}},
                {"name": "execute_code", "arguments": {"steps": [{"code": kid}]}},
            ],
            "usage": usage,
        },
        {"text": "all done", "usage": {"input_tokens": 300, "output_tokens": 7}, "expect": "default says ok"},
    ]
    path = tmp_path / "lead.script.json"
    path.write_text(json.dumps(script))
    h.agent("lead")
    (h.cfg / "agents" / "lead.json").write_text(
        json.dumps({"backend": "scripted", "model": str(path), "prompt": "You are lead.", "subagents": ["default"]})
    )


async def run_lead(h, tmp_path, usage):
    lead_script(h, tmp_path, usage)
    parent = await h.new(agent="lead")
    core = await parent.wake()
    events = []
    core.subscribe(events.append)
    await core.submit("please do the secret-prompt task")
    assert core.reply == "all done", [(e.kind, e.text) for e in events if e.kind not in ("state", "usage")]
    telemetry.flush()
    return parent


async def test_a_turn_with_two_tool_calls_and_a_sub_agent_is_one_span_tree(h, tmp_path, receiver):
    usage = {"input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 1000}
    parent = await run_lead(h, tmp_path, usage)
    spans = receiver.spans
    by_id = {s.span_id: s for s in spans}
    names = sorted(s.name for s in spans)
    assert names.count("invoke_agent lead") == 1 and names.count("invoke_agent default") == 1
    assert names.count("execute_tool execute_code") == 2 and names.count("stage bash") == 2
    assert len({s.trace_id for s in spans}) == 1  # the sub-agent's spans are in the parent's trace
    assert {attrs(r)["service.name"] for r in receiver.resources} == {"ollie"}  # when no variable names one

    [turn] = [s for s in spans if s.name == "invoke_agent lead"]
    assert not turn.parent_span_id
    a = attrs(turn)
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "lead"
    assert a["gen_ai.conversation.id"] == parent.id and a["gen_ai.provider.name"] == "scripted"
    assert a["gen_ai.usage.input_tokens"] == 120 + 1000 + 300 and a["gen_ai.usage.output_tokens"] == 37

    chats = sorted(
        (s for s in spans if s.name.startswith("chat ") and by_id[s.parent_span_id] is turn),
        key=lambda s: s.start_time_unix_nano,
    )
    assert len(chats) == 2
    first, second = (attrs(c) for c in chats)
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.request.model"].endswith("lead.script.json")
    assert first["gen_ai.usage.input_tokens"] == 1120 and first["gen_ai.usage.output_tokens"] == 30
    assert first["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert first["gen_ai.response.finish_reasons"] == ["tool_calls"] and second["gen_ai.response.finish_reasons"] == [
        "stop"
    ]

    tools = sorted((s for s in spans if s.name == "execute_tool execute_code"), key=lambda s: s.start_time_unix_nano)
    assert all(by_id[t.parent_span_id] is turn for t in tools)
    assert [attrs(t)["gen_ai.tool.name"] for t in tools] == ["execute_code", "execute_code"]
    assert all(attrs(t)["gen_ai.tool.call.id"] for t in tools)
    for t in tools:  # each has its sandboxed stage, with its exit status
        [stage] = [s for s in spans if s.parent_span_id == t.span_id and s.name == "stage bash"]
        assert attrs(stage)["process.exit.code"] == 0

    [child] = [s for s in spans if s.name == "invoke_agent default"]
    assert child.parent_span_id == tools[1].span_id  # the sub-agent's turn: a child of the call that prompted it
    assert attrs(child)["gen_ai.conversation.id"] == f"{parent.id}.kid"
    assert any(s.parent_span_id == child.span_id and s.name.startswith("chat ") for s in spans)

    exported = b"".join(receiver.raw)
    for secret in (b"secret-prompt", b"first-secret-output", b"You are lead", KEY.encode()):
        assert secret not in exported  # no content without the opt-in, and never a key

    metrics = {m.name: m for m in receiver.metrics}
    assert set(metrics) >= {
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "ollie.turns",
        "ollie.tool_calls",
        "ollie.sandbox.stage.duration",
        "ollie.sessions.active",
    }
    lead_tokens = {
        attrs(p)["gen_ai.token.type"]: p.sum
        for p in metrics["gen_ai.client.token.usage"].histogram.data_points
        if attrs(p)["gen_ai.request.model"].endswith("lead.script.json")
    }
    assert lead_tokens == {"input": 1120 + 300, "output": 37}
    tool_calls = sum(p.as_int for p in metrics["ollie.tool_calls"].sum.data_points)
    assert tool_calls == 2


async def test_contents_only_when_opted_in(h, tmp_path, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    await run_lead(h, tmp_path, {"input_tokens": 1, "output_tokens": 1})
    spans = receiver.spans
    [turn] = [s for s in spans if s.name == "invoke_agent lead"]
    assert (
        "secret-prompt" in attrs(turn)["gen_ai.input.messages"] and "all done" in attrs(turn)["gen_ai.output.messages"]
    )
    tool = min((s for s in spans if s.name == "execute_tool execute_code"), key=lambda s: s.start_time_unix_nano)
    assert "first-secret-output" in attrs(tool)["gen_ai.tool.call.result"]
    assert "echo first-secret-output" in attrs(tool)["gen_ai.tool.call.arguments"]
    chat = min(
        (s for s in spans if s.name.startswith("chat ") and s.parent_span_id == turn.span_id),
        key=lambda s: s.start_time_unix_nano,
    )
    assert "You are lead" in attrs(chat)["gen_ai.system_instructions"]
    assert KEY.encode() not in b"".join(receiver.raw)


async def test_a_failed_tool_call_and_stage_are_errors(h, tmp_path, receiver):
    script = tmp_path / "fail.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "exit 3"}]}}]},
                {"text": "it failed"},
            ]
        )
    )
    agent = {"backend": "scripted", "model": str(script), "hooks": {"preTool": "true", "postTool": "exit 1"}}
    (h.cfg / "agents" / "failing.json").write_text(json.dumps(agent))
    session = await h.new(agent="failing")
    core = await session.wake()
    await core.submit("go")
    telemetry.flush()
    [tool] = [s for s in receiver.spans if s.name == "execute_tool execute_code"]
    [stage] = [s for s in receiver.spans if s.name == "stage bash"]
    assert attrs(tool)["error.type"] == "tool_error" and tool.status.code == 2  # STATUS_CODE_ERROR
    assert attrs(stage)["process.exit.code"] == 3 and stage.status.code == 2
    hooks = {s.name: s for s in receiver.spans if s.name.startswith("hook ")}
    assert set(hooks) == {"hook preTool", "hook postTool"}
    assert all(s.parent_span_id == tool.span_id for s in hooks.values())  # the hooks of that call
    assert attrs(hooks["hook preTool"])["process.exit.code"] == 0 and hooks["hook preTool"].status.code != 2
    assert attrs(hooks["hook postTool"])["process.exit.code"] == 1 and hooks["hook postTool"].status.code == 2


def test_off_unless_asked_and_then_nothing_of_opentelemetry_is_imported():
    code = (
        "import sys, ollie.telemetry as t, ollie.agent.loop; assert t.active() is None; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_verbose_logs_each_request_its_retries_and_timings_in_one_line(cores, caplog, monkeypatch):
    monkeypatch.setattr("ollie.agent.loop._countdown", _no_wait)
    script = [
        {
            "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}],
            "usage": {"input_tokens": 100, "output_tokens": 5},
        },
        {"error": {"type": "transient", "message": "502 from upstream"}},
        {"text": "done", "usage": {"input_tokens": 120, "output_tokens": 3, "cache_read_tokens": 50}},
    ]
    core, backend, _, _ = await cores.open(script)
    with caplog.at_level("INFO", logger="ollie.requests"):
        await core.submit("go")
    await cores.close(core)
    lines = [r.getMessage() for r in caplog.records if r.name == "ollie.requests"]
    assert len(lines) == 3, lines
    name = f"scripted {backend.model}"
    assert lines[0].startswith(f"{name}: ") and ", 100 in / 5 out, stop tool_calls, 1 tool calls" in lines[0]
    assert lines[1].startswith(f"{name}: ") and "failed: " in lines[1] and "502 from upstream" in lines[1]
    assert lines[2].startswith(f"{name} (try 2): ") and "170 in (50 cached) / 3 out, stop stop" in lines[2]
    assert all(" s, " in line for line in lines)  # each with its time


async def _no_wait(*args, **kwargs):
    pass


def test_ollie_run_verbose_prints_the_request_lines_on_stderr(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "hi", "usage": {"input_tokens": 9, "output_tokens": 2}}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    argv = [sys.executable, "-m", "ollie", "run", "--verbose", "--backend", "scripted", "--script", str(script), "hi"]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ollie.requests: scripted " in done.stderr and "9 in / 2 out, stop stop" in done.stderr
    assert "ollie.requests" not in done.stdout


def test_a_ray_jobs_turns_are_children_of_the_call_whose_context_its_task_carries(receiver, tmp_path):
    """The worker's side of a job on Ray (run_task, as a worker runs it, without a cluster): the
    task carries the W3C trace context of the tool call that started the job."""
    from opentelemetry import trace as api

    from ollie.fs.ray_jobs import run_task

    on = telemetry.active()
    with on.tracer.start_as_current_span("execute_tool execute_code") as call:
        carried = telemetry.inject(api.set_span_in_context(call))
    assert set(carried) == {"traceparent"}
    script = tmp_path / "job.json"
    script.write_text(json.dumps([{"text": "job done", "usage": {"input_tokens": 5, "output_tokens": 2}}]))
    settings = {"agent": "", "backend": "scripted", "model": str(script), "cwd": str(tmp_path)}
    task = {"job_id": "j-0", "prompt": "hi", "output": "", "cwd_within": "", "settings": settings, "trace": carried}
    *_, last = run_task(task)
    assert not last["status"].startswith("failed"), last
    telemetry.flush()
    [turn] = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    context = call.get_span_context()
    assert turn.trace_id == context.trace_id.to_bytes(16, "big")
    assert turn.parent_span_id == context.span_id.to_bytes(8, "big")
    assert attrs(turn)["gen_ai.conversation.id"] == "j-0" and attrs(turn)["gen_ai.usage.output_tokens"] == 2


async def test_a_provider_request_is_a_client_span_with_its_server_and_never_its_key(receiver, tmp_path):
    from ollie import backends
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.config import AgentConfig
    from ollie.tools import dispatcher_factory
    from wire import WireServer
    from wire.openai import PATH, text_stream

    with WireServer() as server:
        server.reply(PATH, text_stream("hello there", prompt_tokens=40))
        new_dispatcher = dispatcher_factory({})
        env = await build_agent_env(AgentConfig(prompt="You are terse."), new_dispatcher(), str(tmp_path))
        backend = backends.create("openai", "gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY)
        core = Core(CoreConfig(backend, env, new_dispatcher))
        await core.submit("hi")
        await core.close()
        assert core.reply == "hello there" and server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    telemetry.flush()
    [chat] = [s for s in receiver.spans if s.name == "chat gpt-4o-mini"]
    a = attrs(chat)
    assert chat.kind == 3  # SPAN_KIND_CLIENT
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.request.model"] == "gpt-4o-mini"
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(server.url.rsplit(":", 1)[1])
    assert a["gen_ai.usage.input_tokens"] == 40 and a["gen_ai.response.finish_reasons"] == ["stop"]
    assert KEY.encode() not in b"".join(receiver.raw) and b"Bearer" not in b"".join(receiver.raw)


async def test_a_compaction_is_a_span(cores, receiver):
    core, *_ = await cores.open([{"text": "one"}, {"text": "two"}, {"text": "three"}, {"text": "the summary"}])
    for prompt in ("a", "b", "c"):
        await core.submit(prompt)
    await core.compact()
    await cores.close(core)
    telemetry.flush()
    [compact] = [s for s in receiver.spans if s.name == "compact"]
    assert attrs(compact)["ollie.compaction.reason"] == "manual" and not compact.parent_span_id
    assert len([s for s in receiver.spans if s.name.startswith("invoke_agent")]) == 3


async def test_a_batch_jobs_turn_is_a_child_of_the_call_that_submitted_it(h, tmp_path, receiver):
    submit = """printf 'name=job\\nagent=default\\n---\\nwork\\n' > $OLLIE/b/new
until [ "$(cat $OLLIE/b/job-0/status)" = done ]; do sleep 0.1; done
cat $OLLIE/b/job-0/result"""
    script = tmp_path / "boss.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": submit}]}}]},
                {"text": "the job is done", "expect": "default says ok"},
            ]
        )
    )
    agent = {"backend": "scripted", "model": str(script), "subagents": ["default"]}
    (h.cfg / "agents" / "boss.json").write_text(json.dumps(agent))
    session = await h.new(agent="boss")
    core = await session.wake()
    await core.submit("run a job")
    assert core.reply == "the job is done"
    telemetry.flush()
    [call] = [s for s in receiver.spans if s.name == "execute_tool execute_code"]
    [job] = [s for s in receiver.spans if s.name == "invoke_agent default"]
    assert job.parent_span_id == call.span_id and job.trace_id == call.trace_id
    assert attrs(job)["gen_ai.conversation.id"].endswith(".job-0")


def test_a_job_on_a_ray_cluster_is_a_child_of_the_call_that_started_it(tmp_path_factory):
    """End to end: a file server (its own process) whose session's code starts a sub-agent as a job
    on a Ray cluster; the server and the worker each export to the same receiver, and the job's
    turn on the worker is a child of the server's tool call (the task carried its context)."""
    pytest.importorskip("ray", reason="Ray is not installed here (pip install 'ollie-agents[ray]')")
    import secrets
    import time

    from test_jobs import _server, _spawn
    from test_ray_jobs import Cluster

    receiver = Receiver()
    srv = _server(tmp_path_factory.mktemp("raytrace"))
    srv.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    cluster = Cluster(srv.env)
    srv.env.update(OLLIE_BATCH_EXECUTOR="ray", RAY_ADDRESS=cluster.address)
    srv.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_METRICS_EXPORTER="none", OPENAI_API_KEY=KEY)
    srv.agent(
        "lead",
        turns=[{"tool_calls": [_spawn("one", agent="worker")]}, {"text": "collected", "expect": "first"}],
        subagents=["worker"],
    )
    try:
        srv.start()
        sid = srv.new_session(agent="lead")
        (srv.mnt / "s" / sid / "prompt").write_text("delegate\n")
        srv.wait_idle(sid, timeout=120)
        assert (srv.mnt / "s" / sid / "reply").read_text() == "collected"
    finally:
        srv.stop()  # the server exports what its exporter still holds as it exits
        cluster.stop()
    try:
        deadline = time.monotonic() + 10
        while not {"invoke_agent lead", "invoke_agent worker"} <= {s.name for s in receiver.spans}:
            assert time.monotonic() < deadline, sorted(s.name for s in receiver.spans)
            time.sleep(0.2)
    finally:
        receiver.close()
    [lead] = [s for s in receiver.spans if s.name == "invoke_agent lead"]
    [call] = [s for s in receiver.spans if s.name == "execute_tool execute_code"]
    [job] = [s for s in receiver.spans if s.name == "invoke_agent worker"]
    assert call.parent_span_id == lead.span_id
    assert job.trace_id == lead.trace_id and job.parent_span_id == call.span_id
    assert KEY.encode() not in b"".join(receiver.raw)


def test_ollie_run_exports_its_spans_before_it_exits(tmp_path):
    receiver = Receiver()
    try:
        script = tmp_path / "s.json"
        script.write_text(json.dumps([{"text": "hi", "usage": {"input_tokens": 9, "output_tokens": 2}}]))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="ollie-test")
        argv = [sys.executable, "-m", "ollie", "run", "--backend", "scripted", "--script", str(script), "hi"]
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        receiver.close()
    assert {s.name for s in receiver.spans} == {"invoke_agent default", "chat scripted"}
    assert {attrs(r)["service.name"] for r in receiver.resources} == {"ollie-test"}  # OTEL_SERVICE_NAME
    assert {m.name for m in receiver.metrics} >= {"gen_ai.client.token.usage", "ollie.turns"}


EMBEDDED = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # the embedding program's own, before any session

from agent_helpers import make_core

async def main():
    core, *_ = await make_core([{"text": "hi"}])
    with trace.get_tracer("app").start_as_current_span("app request"):
        await core.submit("go")
    await core.close()

asyncio.run(main())
spans = {s.name: s for s in exporter.get_finished_spans()}
turn = spans["invoke_agent default"]
assert turn.parent.span_id == spans["app request"].context.span_id, "under the program's own span"
print(sorted(spans))
"""


def test_a_program_that_set_up_its_own_provider_gets_ollies_spans_under_its_own(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    tests = os.path.dirname(__file__)
    done = subprocess.run(
        [sys.executable, "-c", EMBEDDED, tests], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['app request', 'chat scripted', 'invoke_agent default']"


async def test_a_failure_to_record_never_fails_the_turn(cores, receiver, monkeypatch):
    from ollie.telemetry import spans as _spans

    def broken(*args):
        raise RuntimeError("a bug in recording")

    monkeypatch.setattr(_spans, "_usage_attributes", broken)  # every span's end
    monkeypatch.setattr(_spans.Tool, "__init__", broken)  # a span's start
    core, *_ = await cores.open([{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "fine"}])
    await core.submit("go")
    await cores.close(core)
    assert core.reply == "fine"
    telemetry.flush()
    assert {s.name for s in receiver.spans} == {"invoke_agent default", "chat scripted"}
