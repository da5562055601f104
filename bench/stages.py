"""Timing execute_code calls for the benches: each call once to warm up (the jail starts, caches
fill), then `runs` rounds with the calls interleaved, so that all of them see the same machine load."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ollie.tools import CallContext, execute


async def time_calls(
    cwd: str, ctx: CallContext, calls: dict[str, list[dict[str, Any]]], runs: int
) -> dict[str, list[float]]:
    """Seconds each named call (a list of steps) took, `runs` samples apiece, on one execute server."""
    server = execute.factory(cwd)()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for steps in calls.values():
            result = await server.call_tool("execute_code", {"steps": steps}, ctx)
            assert not result.is_error, result.text()
        for _ in range(runs):
            for name, steps in calls.items():
                t = time.perf_counter()
                result = await server.call_tool("execute_code", {"steps": steps}, ctx)
                samples[name].append(time.perf_counter() - t)
                assert not result.is_error, result.text()
    finally:
        await server.close()
    return samples


if __name__ == "__main__":  # a helper of bench/tool_scripts.py, not a bench: --help says so
    argparse.ArgumentParser(description=__doc__ + "\nRun bench/tool_scripts.py instead.").parse_args()
