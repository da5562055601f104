"""Blocked readers: the latency of reading `s/<id>/state` while many readers wait in
`s/<id>/statewait` (each read blocks up to 5 s) and follow `chat` with `tail -f`, on the FUSE
mount and over 9P, against the same reads with nobody waiting (the baseline, same run).

    .venv/bin/python bench/blocked_readers.py [-n 2000] [--tails 0.25] [--sessions 20] [--reads 1000]
                                              [--only fuse|9p]

Runs `ollie srv` (scripted backend) on a temporary mount with temporary ollie directories, makes
`--sessions` sessions, then per transport: times `--reads` reads of one session's `state` (open,
read, close on the mount; walk, open, read, clunk over 9P) with no reader waiting; starts N blocked
readers, a `--tails` share of them following `chat` (`tail -f` processes on the mount; over 9P a
client re-reading the end of `chat` each second, as tail does on a FUSE file) and the others
reading `statewait` in a loop (threads in helper processes on the mount, a 9P client's concurrent
requests over 9P), spread over the sessions; and times the same reads again. Printed: p50, p99
and max of each, and the p99 under load as a ratio of the baseline's. Targets (issue 15): with
2,000 blocked readers, p99 <= 20 ms and no read over 200 ms. Also the server's RSS and threads, before the readers and
with them, and its CPU while they wait. The 1-minute load average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fs import Server, rss_kib  # noqa: E402 (the bench next door: a server on a temporary mount)

HERE = Path(__file__).resolve()


def quantiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"p50": statistics.median(s), "p99": s[min(len(s) - 1, int(len(s) * 0.99))], "max": s[-1], "n": len(s)}


def fmt(q: dict[str, float]) -> str:
    return f"p50 {q['p50']:7.3f} ms  p99 {q['p99']:7.3f} ms  max {q['max']:8.3f} ms"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# ---- the helpers, in processes of their own ---------------------------------------------------
def fuse_waiters(paths: list[str], per_path: int) -> None:
    """Threads reading each path's statewait in a loop, until stdin closes."""

    def loop(path: str) -> None:
        while True:
            try:
                with open(path, "rb") as f:
                    f.read()
            except OSError:
                time.sleep(0.1)

    for path in paths:
        for _ in range(per_path):
            threading.Thread(target=loop, args=(path,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    os._exit(0)  # the threads are blocked in reads: don't wait for them


async def ninep_waiters(addr: str, statewaits: list[str], chats: list[str], per_path: int, tails: int) -> None:
    """Over 9P: `per_path` concurrent statewait readers per path, and `tails` followers of chat
    re-reading its end each second; connections of at most 500 requests each."""
    from ollie.vfs import ninep as P
    from ollie.vfs.ninep_client import Client

    clients: list[Client] = []

    async def client() -> Client:
        if not clients or clients[-1]._bench_load >= 500:  # type: ignore[attr-defined]
            c = await Client.connect(addr)
            c._bench_load = 0  # type: ignore[attr-defined]
            clients.append(c)
        clients[-1]._bench_load += 1  # type: ignore[attr-defined]
        return clients[-1]

    async def waiter(c: Client, path: str) -> None:
        while True:
            await c.read_path(path)

    async def tail(c: Client, path: str) -> None:
        fid = await c.walk(path)
        await c.open(fid, P.OREAD)
        offset = 0
        while True:
            offset += len(await c.read(fid, offset, 8192))
            await asyncio.sleep(1)

    tasks = []
    for path in statewaits:
        for _ in range(per_path):
            tasks.append(asyncio.create_task(waiter(await client(), path)))
    for i in range(tails):
        tasks.append(asyncio.create_task(tail(await client(), chats[i % len(chats)])))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    os._exit(0)


# ---- the bench --------------------------------------------------------------------------------
DEADLINE = 60.0  # seconds of timed reads at most (a stalled mount answers one read in seconds)
PACE = 0.01  # seconds between timed reads: 1,000 of them span two rounds of statewait's 5 s timeouts


def time_fuse_reads(path: Path, n: int) -> list[float]:
    out: list[float] = []
    end = time.monotonic() + DEADLINE
    for _ in range(n):
        if time.monotonic() > end:
            break
        t = time.perf_counter()
        with open(path, "rb") as f:
            f.read()
        out.append((time.perf_counter() - t) * 1000)
        time.sleep(PACE)  # a script's pace, not a tight loop
    return out


async def time_9p_reads(addr: str, path: str, n: int) -> list[float]:
    from ollie.vfs.ninep_client import Client

    c = await Client.connect(addr)
    try:
        await c.read_path(path)
        out: list[float] = []
        end = time.monotonic() + DEADLINE
        for _ in range(n):
            if time.monotonic() > end:
                break
            t = time.perf_counter()
            await c.read_path(path)
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(PACE)
        return out
    finally:
        await c.close()


def helper(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a helper failed to start"
    return p


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.stdin is None:
            p.terminate()  # tail -f
            continue
        try:
            p.stdin.close()
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(s: Server, sids: list[str], args: argparse.Namespace, transport: str) -> dict[str, dict[str, float]]:
    n_tails = round(args.n * args.tails)
    n_wait = args.n - n_tails
    per_path = max(1, n_wait // len(sids))
    env = dict(s.env, PYTHONPATH=os.pathsep.join(sys.path))
    addr = f"unix!{s.root / 'ns' / 'ollie'}"
    state = f"s/{sids[0]}/state"

    def timed() -> list[float]:
        if transport == "fuse":
            return time_fuse_reads(s.mnt / state, args.reads)
        return asyncio.run(time_9p_reads(addr, state, args.reads))

    base = quantiles(timed())
    rss0, threads0 = rss_kib(s.pid()), threads_of(s.pid())
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    try:
        if transport == "fuse":
            waits = [str(s.mnt / "s" / sid / "statewait") for sid in sids]
            chunk = max(1, len(waits) // 4)  # 4 helper processes
            for i in range(0, len(waits), chunk):
                procs.append(helper(["--_fuse", str(per_path), *waits[i : i + chunk]], env))
            for i in range(n_tails):
                chat = s.mnt / "s" / sids[i % len(sids)] / "chat"
                procs.append(subprocess.Popen(["tail", "-f", str(chat)], stdout=subprocess.DEVNULL))
        else:
            waits = [f"s/{sid}/statewait" for sid in sids]
            chats = [f"s/{sid}/chat" for sid in sids]
            procs.append(helper(["--_9p", addr, str(per_path), str(n_tails), *waits, "--", *chats], env))
        started = time.perf_counter() - t0
        time.sleep(1.0)  # let them all block
        rss, threads = rss_kib(s.pid()), threads_of(s.pid())
        cpu0, t1 = cpu_s(s.pid()), time.perf_counter()
        loaded = quantiles(timed())
        cpu = (cpu_s(s.pid()) - cpu0) / (time.perf_counter() - t1)
    finally:
        stop(procs)
    total = per_path * len(sids) + n_tails
    print(
        f"{transport}: {total} blocked readers ({per_path * len(sids)} in statewait, {n_tails} following chat), "
        f"started in {started:.1f} s; server RSS {rss0 / 1024:.0f} -> {rss / 1024:.0f} MiB "
        f"({(rss - rss0) / total:.1f} KiB per reader), threads {threads0} -> {threads}, "
        f"CPU {cpu:.0%} of a core meanwhile"
    )
    print(f"  state, nobody waiting:   {fmt(base)}")
    print(
        f"  state, {total} waiting: {fmt(loaded)}   p99 {loaded['p99'] / base['p99']:.2f}x the baseline's"
        f"{'' if loaded['n'] == args.reads else f' (only {loaded[chr(110)]:.0f} reads in {DEADLINE:.0f} s)'}"
    )
    ok = loaded["p99"] <= 20 and loaded["max"] <= 200
    print(f"  target p99 <= 20 ms, max <= 200 ms: {'met' if ok else 'NOT met'}")
    return {"base": base, "loaded": loaded}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_fuse":
        fuse_waiters(sys.argv[3:], int(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_9p":
        rest = sys.argv[5:]
        cut = rest.index("--")
        asyncio.run(ninep_waiters(sys.argv[2], rest[:cut], rest[cut + 1 :], int(sys.argv[3]), int(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2000, help="blocked readers (default 2000)")
    ap.add_argument("--tails", type=float, default=0.25, help="the share of them following chat (default 0.25)")
    ap.add_argument("--sessions", type=int, default=20, help="sessions they are spread over (default 20)")
    ap.add_argument("--reads", type=int, default=1000, help="timed reads of state, 10 ms apart (default 1000)")
    ap.add_argument("--only", choices=("fuse", "9p"), help="one transport only")
    args = ap.parse_args()
    if args.n < 1 or args.sessions < 1 or args.reads < 1 or not 0 <= args.tails <= 1:
        ap.error("-n, --sessions and --reads must be at least 1, --tails from 0 to 1")
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="ollie-bench-blocked-") as tmp:
        s = Server(Path(tmp))
        s.srv("start")
        try:
            sids = [s.new() for _ in range(args.sessions)]
            for sid in sids:  # a turn each, so chat has something and the sessions are awake
                (s.mnt / "s" / sid / "prompt").write_text("hello")
            for sid in sids:
                while (s.mnt / "s" / sid / "state").read_text() != "idle\n":
                    (s.mnt / "s" / sid / "statewait").read_text()
            print(f"load before: {open('/proc/loadavg').read().strip()}")
            for transport in ("fuse", "9p"):
                if args.only in (None, transport):
                    run(s, sids, args, transport)
            print(f"load after: {open('/proc/loadavg').read().strip()}")
        finally:
            s.srv("stop")


if __name__ == "__main__":
    main()
