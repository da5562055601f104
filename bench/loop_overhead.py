"""Loop overhead: what ollie adds per agent step over the raw OpenAI SDK call and over plain HTTP.

Scenario (as in the peers' table): N steps, each one call of an in-process no-op tool, then a
final answer, against a local Chat Completions server in another process. In the same run and
interleaved, (a) the same N+1 requests made with the raw SDK (`chat.completions.create`), and
(b) the same requests over a minimal keep-alive HTTP/1.1 client (the practical limit).

    .venv/bin/python bench/loop_overhead.py [--steps 10] [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wire import WireServer  # noqa: E402 (the bench's OpenAI-wire server, in a process of its own)


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


TOOLS = [
    {
        "type": "function",
        "function": {"name": "noop", "description": "does nothing", "parameters": {"type": "object", "properties": {}}},
    }
]


async def run_ollie(url: str, steps: int) -> float:
    from ollie.agent.core import Core, CoreConfig
    from ollie.agent.env import build_agent_env
    from ollie.backends.openai import OpenAIBackend
    from ollie.config import AgentConfig
    from ollie.tools import Tool, ToolResult, new_dispatcher_func

    class Noop:
        async def list_tools(self):
            return [Tool("noop", "does nothing", {"type": "object", "properties": {}})]

        async def call_tool(self, name, args, ctx):
            return ToolResult.of("ok")

        async def close(self):
            pass

    nd = new_dispatcher_func({"noop": Noop})
    env = await build_agent_env(AgentConfig(prompt="You are a benchmark.\n"), nd(), os.getcwd())
    core = Core(CoreConfig(OpenAIBackend("bench", base_url=url, api_key="k"), env, nd))
    t = time.perf_counter()
    await core.submit("go")
    elapsed = time.perf_counter() - t
    assert core.reply == "done", core.reply
    await core.close()
    return elapsed


async def run_sdk(client, steps: int) -> float:
    t = time.perf_counter()
    for i in range(steps + 1):
        stream = await client.chat.completions.create(
            model="bench", messages=_history(i), tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        async for _ in stream:
            pass
    return time.perf_counter() - t


async def run_plain(port: int, steps: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t = time.perf_counter()
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
    elapsed = time.perf_counter() - t
    writer.close()
    return elapsed


async def bench(port: int, steps: int, runs: int) -> None:
    import openai

    url = f"http://127.0.0.1:{port}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
    results: dict[str, list[float]] = {"ollie": [], "sdk": [], "plain": []}
    for _ in range(3):  # warm-up
        await run_ollie(url, steps), await run_sdk(client, steps), await run_plain(port, steps)
    for _ in range(runs):  # interleaved, so machine noise hits all three alike
        results["ollie"].append(await run_ollie(url, steps))
        results["sdk"].append(await run_sdk(client, steps))
        results["plain"].append(await run_plain(port, steps))
    await client.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    per = steps + 1
    print(f"{steps} tool steps + final answer ({per} requests), {runs} runs, medians:")
    for k in ("plain", "sdk", "ollie"):
        print(f"  {k:<6} {med[k] * 1000:8.2f} ms per run, {med[k] / per * 1000:6.3f} ms per request")
    over_sdk = (med["ollie"] - med["sdk"]) / per * 1000
    over_plain = (med["ollie"] - med["plain"]) / per * 1000
    print(
        f"ollie per-step overhead over the raw SDK call: {over_sdk:+.3f} ms (target <= +0.3 ms); "
        f"ratio ollie/sdk = {med['ollie'] / med['sdk']:.2f}"
    )
    print(
        f"ollie per-step overhead over plain HTTP:       {over_plain:+.3f} ms; ratio ollie/plain = "
        f"{med['ollie'] / med['plain']:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="tool steps before the final answer (default 10)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs of each, interleaved (default 30)")
    args = ap.parse_args()
    if args.steps < 0 or args.runs < 1:
        ap.error("--steps must be at least 0 and --runs at least 1")
    with tempfile.TemporaryDirectory(prefix="ollie-bench-loop-") as tmp:
        for var in ("OLLIE_DATA_PATH", "OLLIE_TMP_PATH", "OLLIE_CFG_PATH"):
            os.environ[var] = os.path.join(tmp, var.lower())
        with WireServer(args.steps) as port:
            asyncio.run(bench(port, args.steps, args.runs))


if __name__ == "__main__":
    sys.exit(main())
