"""Loop overhead: what ollie adds per agent step, on each HTTP backend, over the raw SDK calls and
plain HTTP; and what `ollie run` imports to use the Anthropic backend.

Scenario (as in the peers' table): N steps, each one call of an in-process no-op tool, then a
final answer, against a local server in another process that speaks the three wires (OpenAI's
Chat Completions, Anthropic's Messages, Ollama's /api/chat). Per request, the wall time and the
CPU time of this process (the server's is not counted), for a Core on each backend, and in the
same run, interleaved: the same requests made with the raw `openai` SDK, with the raw `anthropic`
SDK (the transport the Anthropic backend used before issue 29; skipped if the SDK is not
installed), and over a minimal keep-alive HTTP/1.1 client (the practical limit).

Targets (issue 29): each backend's CPU per request within 1.2x the OpenAI-compatible one's.

Tracing (issue 28), on the OpenAI wire, interleaved with the rest: the Core as shipped with no
OTEL_* variable set ("ollie openai", tracing off), the same with ollie.telemetry's entry points
replaced by bare no-ops ("no otel": the loop as if it had no tracing at all), and exporting every
span and metric over OTLP/HTTP to the same local server ("tracing on"; the exporter's thread counts
in this process's CPU). Target: off within 1.05x of no otel.

Then, in fresh interpreters, the time to import `ollie.cli` and build the Anthropic backend with
what its first request needs: now (ollie's own client) against before (the `anthropic` SDK and its
`httpx2`, which the backend imported then).

    .venv/bin/python bench/loop_overhead.py [--steps 10] [--runs 30] [--imports 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wire import answer as openai_answer  # noqa: E402 (the OpenAI-wire answers bench/wire.py gives)

# ---- the server: three wires, one process -----------------------------------------------------


def _anthropic_answer(body: dict, steps: int) -> bytes:
    """Messages SSE: a tool_use until the history holds `steps` tool results, then the text "done"."""
    done = sum(
        1
        for m in body.get("messages", ())
        for b in (m.get("content") if isinstance(m.get("content"), list) else ())
        if b.get("type") == "tool_result"
    )
    usage = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "bench"),
             "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    events: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": start})]
    if done < steps:
        block = {"type": "tool_use", "id": f"toolu_{done}", "name": "noop", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": "{}"}
        stop = "tool_use"
    else:
        block, delta, stop = {"type": "text", "text": ""}, {"type": "text_delta", "text": "done"}, "end_turn"
    events += [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
        ),  # fmt: skip
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(b"event: %s\ndata: %s\n\n" % (n.encode(), json.dumps(d).encode()) for n, d in events)


def _ollama_answer(body: dict, steps: int) -> bytes:
    """/api/chat NDJSON: a tool call until the history holds `steps` tool results, then "done"."""
    done = sum(1 for m in body.get("messages", ()) if m.get("role") == "tool")
    base = {"model": body.get("model", "bench"), "created_at": "2025-01-01T00:00:00Z"}
    if done < steps:
        message = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "noop", "arguments": {}}}]}
    else:
        message = {"role": "assistant", "content": "done"}
    lines = [
        {**base, "message": message, "done": False},
        {
            **base,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": 10,
            "eval_count": 2,
        },  # fmt: skip
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


_ANTHROPIC_MODEL = {"type": "model", "id": "bench", "display_name": "bench", "max_input_tokens": 131072}
_SHOW = {"model_info": {"general.architecture": "llama", "llama.context_length": 131072}}


def _route(method: bytes, path: bytes, raw: bytes, steps: int) -> tuple[str, str, bytes]:
    if method == b"GET" and path in (b"/v1/models", b"/models"):
        data = {"object": "list", "data": [{"id": "bench", "object": "model", "context_length": 131072}]}
        return "200 OK", "application/json", json.dumps(data).encode()
    if method == b"GET" and path == b"/v1/models/bench":
        return "200 OK", "application/json", json.dumps(_ANTHROPIC_MODEL).encode()
    if method == b"POST" and path == b"/api/show":
        return "200 OK", "application/json", json.dumps(_SHOW).encode()
    if method == b"POST" and path in (b"/v1/traces", b"/v1/metrics"):  # OTLP/HTTP: taken, not read
        return "200 OK", "application/x-protobuf", b""
    try:
        body = json.loads(raw) if method == b"POST" else None
    except ValueError:
        return "400 Bad Request", "application/json", b'{"error": {"message": "bad JSON"}}'
    if path in (b"/v1/chat/completions", b"/chat/completions") and body is not None:
        return "200 OK", "text/event-stream", openai_answer(body, steps)
    if path == b"/v1/messages" and body is not None:
        return "200 OK", "text/event-stream", _anthropic_answer(body, steps)
    if path == b"/api/chat" and body is not None:
        return "200 OK", "application/x-ndjson", _ollama_answer(body, steps)
    return "404 Not Found", "application/json", b'{"error": {"message": "not found"}}'


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, steps: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = (lines[0].split(b" ") + [b"", b""])[:2]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            raw = await reader.readexactly(length) if length else b""
            status, ctype, payload = _route(method, path.split(b"?")[0].rstrip(b"/"), raw, steps)
            writer.write(
                b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                % (status.encode(), ctype.encode(), len(payload), payload)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(steps: int, ready: Any) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, steps), "127.0.0.1", 0, backlog=4096)
    ready.put(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def _run_server(ready: Any, steps: int) -> None:
    try:
        asyncio.run(_serve(steps, ready))
    except KeyboardInterrupt:
        pass


class Server:
    """The server in a child process: `with Server(steps) as port: ...`."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.proc: multiprocessing.Process | None = None

    def __enter__(self) -> int:
        q: multiprocessing.Queue = multiprocessing.Queue()
        self.proc = multiprocessing.Process(target=_run_server, args=(q, self.steps), daemon=True)
        self.proc.start()
        return q.get(timeout=10)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join()


# ---- the clients ------------------------------------------------------------------------------------


def _history(steps_done: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a benchmark."}, {"role": "user", "content": "go"}]
    for i in range(steps_done):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "ok"})
    return msgs


def _anthropic_history(steps_done: int) -> list[dict]:
    msgs: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for i in range(steps_done):
        msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "noop",
                                                       "input": {}}]})  # fmt: skip
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                  "content": "ok"}]})  # fmt: skip
    return msgs


TOOLS = [
    {
        "type": "function",
        "function": {"name": "noop", "description": "does nothing", "parameters": {"type": "object", "properties": {}}},
    }
]
ANTHROPIC_TOOLS = [
    {"name": "noop", "description": "does nothing", "input_schema": {"type": "object", "properties": {}}}
]


def _backend(name: str, port: int) -> Any:
    from ollie import backends

    root = f"http://127.0.0.1:{port}"
    if name == "openai":
        return backends.create("openai", "bench", base_url=root + "/v1", api_key="k")
    if name == "anthropic":
        return backends.create("anthropic", "bench", base_url=root, api_key="k")
    return backends.create("ollama", "bench", base_url=root)


async def run_ollie(name: str, port: int) -> tuple[float, float]:
    """One turn of a Core on backend `name`: (wall, CPU) seconds."""
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.config import AgentConfig
    from ollie.tools import Tool, ToolResult, dispatcher_factory

    class Noop:
        async def list_tools(self):
            return [Tool("noop", "does nothing", {"type": "object", "properties": {}})]

        async def call_tool(self, name, args, ctx):
            return ToolResult.of("ok")

        async def close(self):
            pass

    nd = dispatcher_factory({"noop": Noop})
    env = await build_agent_env(AgentConfig(prompt="You are a benchmark.\n"), nd(), os.getcwd())
    core = Core(CoreConfig(_backend(name, port), env, nd))
    t, c = time.perf_counter(), time.process_time()
    await core.submit("go")
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert core.reply == "done", (name, core.reply)
    await core.close()
    return wall, cpu


_TRACING: dict[str, Any] = {}  # mode -> what ollie.telemetry is set to for it


def tracing_modes(port: int) -> None:
    """Set up the three tracing modes once: the exporter of "on" posts to the bench server."""
    from ollie import telemetry

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    on = telemetry.setup(force=True)
    del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert on is not None, "tracing on needs the otel extra: pip install -e '.[otel]'"
    off = {name: getattr(telemetry, name) for name in ("turn", "chat", "tool", "stage", "hook", "compaction")}
    bare = {name: (lambda *a, **k: telemetry.OFF) for name in off}
    _TRACING.update({"off": (None, off), "no otel": (None, bare), "on": (on, off)})


async def run_traced(mode: str, port: int) -> tuple[float, float]:
    from ollie import telemetry

    provider, entry_points = _TRACING[mode]
    telemetry._on, telemetry._decided = provider, True
    for name, fn in entry_points.items():
        setattr(telemetry, name, fn)
    try:
        return await run_ollie("openai", port)
    finally:
        telemetry._on = None
        for name, fn in _TRACING["off"][1].items():
            setattr(telemetry, name, fn)


async def run_openai_sdk(client: Any, steps: int) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps + 1):
        stream = await client.chat.completions.create(
            model="bench", messages=_history(i), tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass
    return time.perf_counter() - t, time.process_time() - c


async def run_anthropic_sdk(client: Any, steps: int) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps + 1):
        stream = await client.messages.create(
            model="bench", max_tokens=1024, system="You are a benchmark.", messages=_anthropic_history(i),
            tools=ANTHROPIC_TOOLS, stream=True,
        )  # fmt: skip
        async for _ in stream:
            pass
    return time.perf_counter() - t, time.process_time() - c


async def run_plain(port: int, steps: int) -> tuple[float, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t, c = time.perf_counter(), time.process_time()
    for i in range(steps + 1):
        body = json.dumps(
            {
                "model": "bench",
                "messages": _history(i),
                "tools": TOOLS,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
        payload = await reader.readexactly(length)
        for line in payload.split(b"\n\n"):
            if line.startswith(b"data: {"):
                json.loads(line[6:])
    elapsed = time.perf_counter() - t, time.process_time() - c
    writer.close()
    return elapsed


async def bench(port: int, steps: int, runs: int) -> None:
    import openai

    try:
        import anthropic
    except ImportError:
        anthropic = None  # type: ignore[assignment]
    url = f"http://127.0.0.1:{port}"
    openai_client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    anthropic_client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) if anthropic else None
    tracing_modes(port)
    jobs: dict[str, Any] = {
        "ollie openai": lambda: run_traced("off", port),
        "no otel": lambda: run_traced("no otel", port),
        "tracing on": lambda: run_traced("on", port),
        "ollie anthropic": lambda: run_ollie("anthropic", port),
        "ollie ollama": lambda: run_ollie("ollama", port),
        "openai SDK": lambda: run_openai_sdk(openai_client, steps),
        "plain HTTP": lambda: run_plain(port, steps),
    }
    if anthropic_client is not None:
        jobs["anthropic SDK"] = lambda: run_anthropic_sdk(anthropic_client, steps)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
    for _ in range(3):  # warm-up
        for job in jobs.values():
            await job()
    order = list(jobs.items())
    shuffle = random.Random(28).shuffle
    for _ in range(runs):  # interleaved, so machine noise hits all alike, and in a new order each
        shuffle(order)  # time: a job that always ran after the same one measured its leftovers too
        for name, job in order:  # (the SDKs' garbage, collected in the next job's time)
            results[name].append(await job())
    _TRACING["on"][0].shutdown()  # its last spans and metrics, exported while the server runs
    await openai_client.close()
    if anthropic_client is not None:
        await anthropic_client.close()
    per = steps + 1
    wall = {k: statistics.median(w for w, _ in v) / per * 1000 for k, v in results.items()}
    cpu = {k: statistics.median(c for _, c in v) / per * 1000 for k, v in results.items()}
    base = cpu["ollie openai"]
    print(f"{steps} tool steps + final answer ({per} requests), {runs} runs, medians per request:")
    print(f"  {'':<16} {'wall ms':>8} {'CPU ms':>8}  CPU / ollie openai")
    for k in results:
        print(f"  {k:<16} {wall[k]:8.3f} {cpu[k]:8.3f}  {cpu[k] / base:5.2f}x")
    for k in ("ollie anthropic", "ollie ollama"):
        ratio = cpu[k] / base
        print(
            f"{k} CPU per request: {ratio:.2f}x ollie openai's (target <= 1.2x): {'met' if ratio <= 1.2 else 'MISSED'}"
        )
    if "anthropic SDK" in cpu:
        ratio = cpu["ollie anthropic"] / cpu["anthropic SDK"]
        print(f"ollie anthropic CPU per request against the anthropic SDK's: {ratio:.2f}x")
    ratio = cpu["ollie openai"] / cpu["no otel"]
    print(f"tracing off (as shipped) CPU per request against no otel: {ratio:.3f}x (target <= 1.05x): ", end="")
    print("met" if ratio <= 1.05 else "MISSED")
    print(f"tracing on (exporting over OTLP/HTTP) against no otel:      {cpu['tracing on'] / cpu['no otel']:.3f}x")
    print(f"ollie openai CPU per request against the openai SDK's: {cpu['ollie openai'] / cpu['openai SDK']:.2f}x")
    print(f"ollie openai CPU per request against plain HTTP's:     {cpu['ollie openai'] / cpu['plain HTTP']:.2f}x")


# ---- import time ------------------------------------------------------------------------------------

IMPORTS_NOW = "from ollie import cli, backends; b = backends.create('anthropic', 'm', api_key='k'); b._http()"
# Before issue 29 the backend imported the SDK when built and its HTTP client at the first request.
IMPORTS_BEFORE = IMPORTS_NOW + "; import anthropic, httpx2"
_TIMED = "import time; t = time.perf_counter(); {}; print(time.perf_counter() - t)"


def import_times(runs: int) -> None:
    have_sdk = subprocess.run([sys.executable, "-c", "import anthropic"], capture_output=True).returncode == 0
    cases = {"now": IMPORTS_NOW} | ({"before": IMPORTS_BEFORE} if have_sdk else {})
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):  # interleaved, in fresh interpreters
        for name, code in cases.items():
            out = subprocess.run(
                [sys.executable, "-c", _TIMED.format(code)], capture_output=True, text=True, check=True
            )
            times[name].append(float(out.stdout))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"import of ollie.cli + the Anthropic backend and its client, fresh interpreters, median of {runs}:")
    print(f"  now (ollie's own client): {med['now']:7.1f} ms")
    if "before" in med:
        print(
            f"  before (the anthropic SDK): {med['before']:5.1f} ms   now / before = {med['now'] / med['before']:.2f}x"
        )
    else:
        print("  before: the anthropic SDK is not installed (pip install anthropic) to compare")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="tool steps before the final answer (default 10)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs of each, interleaved (default 30)")
    ap.add_argument("--imports", type=int, default=10, help="fresh interpreters per import measure (default 10)")
    args = ap.parse_args()
    if args.steps < 0 or args.runs < 1 or args.imports < 1:
        ap.error("--steps must be at least 0, --runs and --imports at least 1")
    with tempfile.TemporaryDirectory(prefix="ollie-bench-loop-") as tmp:
        for var in ("OLLIE_DATA_PATH", "OLLIE_TMP_PATH", "OLLIE_CFG_PATH"):
            os.environ[var] = os.path.join(tmp, var.lower())
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            os.environ.pop(var, None)
        with Server(args.steps) as port:
            asyncio.run(bench(port, args.steps, args.runs))
        import_times(args.imports)


if __name__ == "__main__":
    sys.exit(main())
