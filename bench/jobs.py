"""Batch jobs: N jobs of one scripted step each through `b/new` of a running server, against the same
N turns run through `Core` directly in this process (baseline, measured in the same run).

    .venv/bin/python bench/jobs.py [-n 100] [--slots 4]

Prints jobs per second for each and their ratio, and memory: the server's RSS growth per finished
job, against this process's RSS growth per finished `Core` session (each closed when its turn ends,
as a finished job's session is). Both run `--slots` at a time (OLLIE_JOBS for the server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fs import Server, rss_kib  # noqa: E402 (the bench next door: a server on a temporary mount)


def run_jobs(root: Path, n: int, slots: int | None, warm: int = 1, **env: str) -> tuple[float, float]:
    """(seconds, KiB of server RSS per finished job); `env`: the server's other settings; `slots`
    None leaves OLLIE_JOBS unset (the executor's default); `warm` jobs run first, untimed."""
    server = Server(root)
    if slots is not None:
        server.env["OLLIE_JOBS"] = str(slots)
    server.env.update(env)
    server.srv("start")
    try:
        b = server.mnt / "b"
        # the first jobs import what every job needs (on Ray, each worker process its own)
        (b / "new").write_text(f"name=warm\nparallel={warm}\n---\nwarm up\n")
        for i in range(warm):
            while (b / f"warm-{i}" / "status").read_text().strip() in ("queued", "running"):
                (b / f"warm-{i}" / "statewait").read_text()
        before = rss_kib(server.pid())
        start = time.perf_counter()
        ids = []
        for first in range(0, n, 50):  # a spec makes 64 jobs at most
            count = min(50, n - first)
            (b / "new").write_text(f"name=bench{first}\nparallel={count}\n---\nhello\n")
            ids += [f"bench{first}-{i}" for i in range(count)]
        for jid in ids:
            status = b / jid / "status"
            while status.read_text().strip() in ("queued", "running"):
                (b / jid / "statewait").read_text()
            assert status.read_text().strip() == "done", status.read_text()
        seconds = time.perf_counter() - start
        return seconds, (rss_kib(server.pid()) - before) / n
    except OSError:
        sys.stderr.write((root / "ns" / "ollie.log").read_text()[-2000:])
        raise
    finally:
        server.srv("stop")


async def run_cores(root: Path, n: int, slots: int) -> tuple[float, float]:
    """The same turns through Core, `slots` at a time, in this process."""
    from ollie.agent import open_session

    script = root / "script.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "ok"}]}))
    gate = asyncio.Semaphore(slots)

    async def one() -> None:
        async with gate, open_session(backend="scripted", script=str(script), cwd=str(root)) as core:
            await core.submit("hello")
            assert core.reply == "ok"

    await one()  # warm up
    before = rss_kib(os.getpid())
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    seconds = time.perf_counter() - start
    return seconds, (rss_kib(os.getpid()) - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="jobs (and baseline turns)")
    ap.add_argument("--slots", type=int, default=4, help="at once, in both")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-jobs-") as tmp:
        root = Path(tmp)
        (root / "cores").mkdir()
        for var, sub in (
            ("OLLIE_CFG_PATH", "cores/cfg"),
            ("OLLIE_DATA_PATH", "cores/data"),
            ("OLLIE_TMP_PATH", "cores/tmp"),
        ):
            os.environ[var] = str(root / sub)
        core_s, core_kib = asyncio.run(run_cores(root / "cores", args.n, args.slots))
        (root / "server").mkdir()
        job_s, job_kib = run_jobs(root / "server", args.n, args.slots)
    print(f"{args.n} turns, {args.slots} at a time, scripted backend")
    print(f"  Core, in process:   {args.n / core_s:7.1f} turns/s   {core_kib:8.1f} KiB RSS per finished session")
    print(f"  b/new jobs, server: {args.n / job_s:7.1f} jobs/s    {job_kib:8.1f} KiB RSS per finished job")
    print(f"  ratio: jobs take {job_s / core_s:.2f}x the time of the turns alone")


if __name__ == "__main__":
    main()
