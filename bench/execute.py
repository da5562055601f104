"""execute_code overhead, measured against a plain subprocess in the same run.

    .venv/bin/python bench/execute.py [runs]

Targets: a sandboxed `true` stage ≤ 3 ms median and ≤ +1.5 ms over `subprocess.run(["bash", "-c", "true"])`;
32 parallel `sleep 0.2` stages ≤ 0.3 s wall.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time

from ollie.tools import CallContext
from ollie.tools import execute


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def true_stages(server, ctx, runs: int) -> tuple[float, float]:
    """Median ms of `bash -c true` unsandboxed and as a sandboxed stage, interleaved so both see
    the same machine load."""
    true_call = {"steps": [{"code": "true"}]}
    baseline, sandboxed = [], []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        baseline.append(time.perf_counter() - t)
        t = time.perf_counter()
        result = await server.call_tool("execute_code", true_call, ctx)
        sandboxed.append(time.perf_counter() - t)
        assert not result.is_error, result.text()
    return median_ms(baseline), median_ms(sandboxed)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        server = execute.Decl(cwd)()
        ctx = CallContext(cwd=cwd, session_id="bench", tmpdir=cwd)
        await server.call_tool("execute_code", {"steps": [{"code": "true"}]}, ctx)  # build and cache the sandbox
        base, box = await true_stages(server, ctx, runs)

        fan_out = {"steps": [{"parallel": [{"code": "sleep 0.2"}] * 32}]}
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            result = await server.call_tool("execute_code", fan_out, ctx)
            walls.append(time.perf_counter() - t)
            assert not result.is_error, result.text()

        # The sandbox is entered between fork and exec, so a stage costs a fork of the server,
        # whose price grows with its memory: an agent's process also holds the provider SDKs.
        import anthropic, mcp, openai  # noqa: E401, F401
        big_base, big_box = await true_stages(server, ctx, runs)
        await server.close()

    wall = min(walls)
    print(f"`true` stage, median of {runs}:")
    print(f"  subprocess.run(bash -c true)   {base:6.2f} ms")
    print(f"  execute_code, sandboxed        {box:6.2f} ms   ({box / base:.2f}x, +{box - base:.2f} ms; "
          f"targets <= 3 ms, <= +1.5 ms)")
    print(f"  the same with openai, anthropic and mcp imported: {big_box:.2f} ms, +{big_box - big_base:.2f} ms")
    print(f"32 parallel `sleep 0.2` stages: {wall:.3f} s wall (best of 3; {wall / 0.2:.2f}x the sleep; "
          "target <= 0.3 s)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
