"""Many sessions starting their jails at once: what it costs ollie's process and its event loop.

    .venv/bin/python bench/jails.py [-n 500] [--rounds 2] [--busy SECONDS]

N execute servers (a session's each, its own working directory) make their first sandboxed call
(`true`) in the same instant: every jail starts (the cold round); then each makes another call in
its running jail (the warm round). Printed per round: the wall time of the N calls, ollie's CPU
(this process, every thread) per call, the event loop's lag meanwhile (a task that asks to run
every 1 ms: how late it ran, p50/p99/max: what a `cat state` on the file server would wait on
top of its own work), and, once the jails run, the memory per live jail (the proportional set
size of every process of the jails: what the machine pays per session). The baseline, same run:
N plain `true` programs started at once by asyncio's subprocess support, unsandboxed.
With `--busy`, a last round of stages that each burn CPU for that long (a build in every session):
the loop's lag then says how much of the CPU the jails leave ollie's process; its baseline is the
same programs started by asyncio, unsandboxed, in ollie's own session.
Issue 31's targets: a jail's start <= 5 ms of ollie's CPU; lag p99 <= 20 ms; <= 2 MiB a session.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time

from agents import jail_pids, pss_kib  # the fork server's session: it and every jail process

from ollie.sandbox.caches import cache_dir
from ollie.tools import CallContext, execute


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def quantiles(ms: list[float]) -> str:
    s = sorted(ms) or [0.0]
    return (
        f"lag p50 {statistics.median(s):6.2f}  p99 {s[min(len(s) - 1, int(len(s) * 0.99))]:7.2f}  max {s[-1]:7.2f} ms"
    )


class Ticker:
    """How late the loop runs a task that wants to run every millisecond."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(max(0.0, (time.perf_counter() - t - 0.001) * 1000))

    def stop(self) -> list[float]:
        self._task.cancel()
        return self.lags


async def measured(what: str, n: int, work) -> None:
    ticker = Ticker()
    await asyncio.sleep(0.01)
    c, t = cpu(), time.perf_counter()
    await work()
    wall, used = time.perf_counter() - t, cpu() - c
    lags = ticker.stop()
    print(f"{what:34} wall {wall:6.2f} s  CPU {used / n * 1000:6.2f} ms a call  {quantiles(lags)}")


async def main(n: int, rounds: int, busy: float) -> None:
    os.system("uptime")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as top:
        cwds = [os.path.join(top, f"s{i}") for i in range(n)]
        for d in cwds:
            os.mkdir(d)
        servers = [execute.factory(d)() for d in cwds]
        ctxs = [CallContext(cwd=d, session_id=f"s{i}", tmpdir="") for i, d in enumerate(cwds)]
        call = {"steps": [{"code": "true"}]}

        async def baseline() -> None:
            async def one() -> None:
                p = await asyncio.create_subprocess_exec("true")
                await p.wait()

            await asyncio.gather(*(one() for _ in range(n)))

        async def calls() -> None:
            results = await asyncio.gather(
                *(s.call_tool("execute_code", call, c) for s, c in zip(servers, ctxs, strict=True))
            )
            bad = [r.text() for r in results if r.is_error]
            assert not bad, bad[:3]

        await measured(f"baseline: {n} plain `true` at once", n, baseline)
        await measured(f"cold: {n} first calls (jails start)", n, calls)
        procs = jail_pids()
        print(f"jails' memory: {pss_kib(procs) / n / 1024:.2f} MiB a session (PSS of {len(procs)} processes)")
        for r in range(rounds - 1):
            await measured(f"warm {r + 1}: {n} calls in running jails", n, calls)
        if busy:
            burn = f"timeout {busy:g} sh -c 'while :; do :; done'; true"

            async def plain_burns() -> None:
                async def one() -> None:
                    p = await asyncio.create_subprocess_exec("sh", "-c", burn)
                    await p.wait()

                await asyncio.gather(*(one() for _ in range(n)))

            async def burns() -> None:
                busy_call = {"steps": [{"code": burn}]}
                await asyncio.gather(
                    *(s.call_tool("execute_code", busy_call, c) for s, c in zip(servers, ctxs, strict=True))
                )

            await measured(f"baseline: {n} plain programs busy {busy:g} s", n, plain_burns)
            await measured(f"busy: {n} stages busy {busy:g} s", n, burns)
        await asyncio.gather(*(s.close() for s in servers))
        for d in cwds:  # the caches their first calls made in ollie's data, used no more
            shutil.rmtree(cache_dir(os.path.realpath(d)), ignore_errors=True)
    os.system("uptime")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy", type=float, default=0, help="seconds each stage of a last round burns CPU (0: none)")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.rounds, args.busy))
