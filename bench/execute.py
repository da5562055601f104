"""execute_code overhead, measured against a plain subprocess in the same run.

    .venv/bin/python bench/execute.py [-n RUNS]

Every stage runs in the session's jail (fresh namespaces, Landlock, seccomp, limits): what it adds
is the cost of asking the jail and of the confinement itself, not a fork of ollie's process.
Targets: a sandboxed `true` stage <= 1.5x `subprocess.run(["bash", "-c", "true"])`, measured in a
process that has the openai, anthropic and mcp SDKs imported (as an agent's does); 32 parallel
`sleep 0.2` stages <= 0.3 s wall. Also printed: the jail's start (once per session), a hook, and
what a stage costs the machine's CPU (its busy time over many stages in a row, from /proc/stat):
ollie's share, and the jail's with the program's, against the same program started plainly: the
figure that counts when hundreds of sessions run stages at once (bench/agents.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from agents import machine_idle  # the machine's idle seconds, from /proc/stat

from ollie.agent import hooks
from ollie.tools import CallContext, execute


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


def busy() -> float:
    """CPU seconds the machine has spent (every core) since boot."""
    return time.monotonic() * (os.cpu_count() or 1) - machine_idle()


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def stage_cpu(server, ctx, runs: int) -> tuple[float, float, float]:
    """ms of the machine's CPU a sandboxed `true` stage costs, of it ollie's, and a plain `bash -c
    true` (posix_spawn, waited): stages one after another, so that the idle time is the gaps."""
    true_call = {"steps": [{"code": "true"}]}
    machine, own = busy(), own_cpu()
    for _ in range(runs):
        await server.call_tool("execute_code", true_call, ctx)
    machine, own = busy() - machine, own_cpu() - own
    bash, plain = shutil.which("bash") or "/bin/bash", busy()
    for _ in range(runs):
        os.waitpid(os.posix_spawn(bash, [bash, "-c", "true"], os.environ), 0)
    plain = busy() - plain
    return machine / runs * 1000, own / runs * 1000, plain / runs * 1000


async def first_call_ms(cwd: str, ctx: CallContext) -> float:
    """A new session's first call: the jail starts, the policy is built."""
    samples = []
    for _ in range(5):
        server = execute.factory(cwd)()
        t = time.perf_counter()
        await server.call_tool("execute_code", {"steps": [{"code": "true"}]}, ctx)
        samples.append(time.perf_counter() - t)
        await server.close()
    return median_ms(samples)


async def hook_ms(cwd: str, runs: int) -> float:
    runner = hooks.Runner("hooks")
    await hooks.run_command("true", {}, cwd, {}, runner=runner)
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        await hooks.run_command("true", {}, cwd, {}, runner=runner)
        samples.append(time.perf_counter() - t)
    await runner.close()
    return median_ms(samples)


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        ctx = CallContext(cwd=cwd, session_id="bench", tmpdir=cwd)
        server = execute.factory(cwd)()
        await server.call_tool("execute_code", {"steps": [{"code": "true"}]}, ctx)  # start the jail
        lean_base, lean_box = await true_stages(server, ctx, runs)

        fan_out = {"steps": [{"parallel": [{"code": "sleep 0.2"}] * 32}]}
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            result = await server.call_tool("execute_code", fan_out, ctx)
            walls.append(time.perf_counter() - t)
            assert not result.is_error, result.text()

        # An agent's process holds the SDKs: measure with them loaded.
        import anthropic  # noqa: F401
        import mcp  # noqa: F401
        import openai  # noqa: F401

        base, box = await true_stages(server, ctx, runs)
        cpu_box, cpu_ollie, cpu_plain = await stage_cpu(server, ctx, max(runs, 500))
        await server.close()
        start = await first_call_ms(cwd, ctx)
        hook = await hook_ms(cwd, max(runs // 4, 10))

    wall = min(walls)
    print(f"`true` stage, median of {runs}:")
    print(
        f"  lean process:       bash -c true {lean_base:6.2f} ms   stage {lean_box:6.2f} ms   "
        f"({lean_box / lean_base:.2f}x)"
    )
    print(
        f"  with the SDKs:      bash -c true {base:6.2f} ms   stage {box:6.2f} ms   ({box / base:.2f}x; target <= 1.5x)"
    )
    print(
        f"  the machine's CPU a stage: {cpu_box:.2f} ms (ollie {cpu_ollie:.2f}, the jail and the program "
        f"{cpu_box - cpu_ollie:.2f}); bash -c true started plainly {cpu_plain:.2f} ms ({cpu_box / cpu_plain:.2f}x)"
    )
    print(f"a session's first call (the jail starts): {start:.1f} ms   a sandboxed hook (`true`): {hook:.2f} ms")
    print(
        f"32 parallel `sleep 0.2` stages: {wall:.3f} s wall (best of 3; {wall / 0.2:.2f}x the sleep; target <= 0.3 s)"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=200, help="`true` stages timed, as many baselines (default 200)")
    ap.add_argument("runs_positional", nargs="?", type=int, metavar="RUNS", help="the same as -n (the old form)")
    args = ap.parse_args(argv)
    if args.runs_positional is not None:
        args.runs = args.runs_positional
    if args.runs < 1:
        ap.error("RUNS must be at least 1")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:]).runs))
