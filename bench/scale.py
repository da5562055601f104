"""A thousand busy sessions in one server: N sessions made through the mount's `ctl`, each running
a 5-step turn at once against a local OpenAI-wire server (bench/wire.py), against a bare asyncio
HTTP client sending the same requests from one process (the baseline, same run), and against the
same turns run by sessions opened in the bench's own process with no file server (the agent loop
alone: what the mount and the server add is the difference).

    .venv/bin/python bench/scale.py [-n 1000] [--steps 5]

Runs `ollie srv` on a temporary mount, temporary ollie directories, the `openai` backend pointed at
the wire server (`OLLIE_OPENAI_URL`). A turn is `--steps` requests: tool calls, then the answer.
The tool called is one the agent lacks, answered at once with an error the loop hands back to the
model: no sandbox process runs, so the figures are the agent loop's and the file server's.
Printed (issue 15's targets in brackets): the requests per second of the N turns, from the first
prompt written to the last session idle, as a ratio of the bare client's [>= 0.7x]; p50/p99/max of
`cat s/<id>/state` on the mount meanwhile (the reads that poll the sessions until idle; open,
read, close in Python) [p99 <= 20 ms], against the same reads with the sessions idle; and the
server's RSS per busy session (its peak during the turns less its RSS before the sessions were
made, over N), and per idle session; the server's CPU time (every thread) during the turns, per
turn and per request: when it nears the wall time, the server's one event loop is the limit; and
the event loop's thread's share, user and system (the kernel's work for its syscalls: sockets,
/dev/fuse, files) apart.
`--profile FILE` runs the server's main thread (its event loop) under cProfile during the turns and
writes the stats to FILE (read them with `python -m pstats FILE`); it slows the server about twofold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fs import Server, rss_kib  # noqa: E402 (a server on a temporary mount)

from wire import WireServer  # noqa: E402 (the OpenAI-wire server)

TOOLS = [
    {
        "type": "function",
        "function": {"name": "noop", "description": "does nothing", "parameters": {"type": "object", "properties": {}}},
    }
]


def quantiles(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"p50": statistics.median(s), "p99": s[min(len(s) - 1, int(len(s) * 0.99))], "max": s[-1], "n": len(s)}


def fmt(q: dict[str, float]) -> str:
    return f"p50 {q['p50']:6.2f} ms  p99 {q['p99']:7.2f} ms  max {q['max']:8.2f} ms  ({q['n']:.0f} reads)"


def read_timed(path: Path, out: list[float]) -> str:
    t = time.perf_counter()
    with open(path) as f:
        text = f.read()
    out.append((time.perf_counter() - t) * 1000)
    return text


# ---- the baseline: a bare asyncio HTTP client ---------------------------------------------------
def _body(step: int) -> bytes:
    msgs: list[dict] = [{"role": "system", "content": "You are a benchmark."}, {"role": "user", "content": "go"}]
    for i in range(step):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "unknown tool 'noop'"})
    return json.dumps(
        {"model": "bench", "messages": msgs, "tools": TOOLS, "stream": True, "stream_options": {"include_usage": True}}
    ).encode()


async def bare_turn(port: int, steps: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(steps):
            body = _body(i)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            payload = await reader.readexactly(length)
            for line in payload.split(b"\n\n"):  # parse the stream, as any client must
                if line.startswith(b"data: {"):
                    json.loads(line[6:])
    finally:
        writer.close()


async def bare(port: int, n: int, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds of n turns at once."""
    await bare_turn(port, steps)  # warm up
    cpu, t = time.process_time(), time.perf_counter()
    await asyncio.gather(*(bare_turn(port, steps) for _ in range(n)))
    return time.perf_counter() - t, time.process_time() - cpu


# ---- the agent loop alone: the same turns by sessions opened in this process, no file server ---
async def direct(n: int, cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of n sessions' turns at once, each session opened with open_session as
    the server opens them (same agent config, stores on disk), prompted with Core.submit."""
    from ollie.agent import open_session

    cores = [await open_session(cwd=str(cwd)) for _ in range(n)]
    cpu, t = time.process_time(), time.perf_counter()
    await asyncio.gather(*(core.submit("go") for core in cores))
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    bad = [core.reply for core in cores if core.reply != "done"]
    assert not bad, f"{len(bad)} sessions did not answer 'done', e.g. {bad[0]!r}"
    for core in cores:
        await core.close()
    return wall, cpu


def cpu_s(pid: int, tid: int | None = None) -> tuple[float, float]:
    """(user, system) CPU seconds so far of the process (every thread), or of its thread `tid`."""
    stat = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(stat).read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


# ---- ollie ------------------------------------------------------------------------------------
# Imported by every Python process the server's environment starts (PYTHONPATH); in `ollie srv fg`,
# the server itself, SIGRTMIN+1 starts cProfile on the main thread (the event loop's; signal handlers
# run there) and SIGRTMIN+2 stops it and writes the stats: the bench sends them around the turns
# (not SIGUSR1: libfuse interrupts requests with it, vfs/fuse.py).
_SITECUSTOMIZE = """
import os, signal, sys
if sys.argv[1:3] == ["srv", "fg"] and os.environ.get("OLLIE_BENCH_PROFILE"):
    import cProfile
    _profile = cProfile.Profile()
    signal.signal(signal.SIGRTMIN + 1, lambda *_: _profile.enable())
    def _stop(*_):
        _profile.disable()
        _profile.dump_stats(os.environ["OLLIE_BENCH_PROFILE"])
    signal.signal(signal.SIGRTMIN + 2, _stop)
"""


def profile_env(env: dict[str, str], tmp: Path, out: Path) -> None:
    site = tmp / "profile-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["OLLIE_BENCH_PROFILE"] = str(out.resolve())


def busy(s: Server, n: int, profile: bool = False, writers: int = 1) -> dict[str, float | list[float]]:
    base_rss = rss_kib(s.pid())
    t = time.perf_counter()
    sids = [s.new() for _ in range(n)]
    made = time.perf_counter() - t
    idle_rss = rss_kib(s.pid())
    idle_reads: list[float] = []
    for sid in sids[: min(n, 500)]:
        read_timed(s.mnt / "s" / sid / "state", idle_reads)
    reads: list[float] = []
    peak = idle_rss
    if profile:
        os.kill(s.pid(), signal.SIGRTMIN + 1)
    cpu, loop_cpu = cpu_s(s.pid()), cpu_s(s.pid(), s.pid())  # the main thread runs the event loop
    t = time.perf_counter()
    if writers == 1:
        for sid in sids:
            (s.mnt / "s" / sid / "prompt").write_text("go")
    else:  # at once, as the bare client's turns start: each write is a FUSE round trip to the busy loop
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(writers) as pool:
            list(pool.map(lambda sid: (s.mnt / "s" / sid / "prompt").write_text("go"), sids))
    written = time.perf_counter() - t
    pending = list(sids)
    while pending:
        still = []
        for sid in pending:
            if read_timed(s.mnt / "s" / sid / "state", reads) != "idle\n":
                still.append(sid)
        pending = still
        peak = max(peak, rss_kib(s.pid()))
        if pending:
            time.sleep(0.01)
    wall = time.perf_counter() - t
    cpu = [b - a for a, b in zip(cpu, cpu_s(s.pid()), strict=True)]
    loop_cpu = [b - a for a, b in zip(loop_cpu, cpu_s(s.pid(), s.pid()), strict=True)]
    if profile:
        os.kill(s.pid(), signal.SIGRTMIN + 2)
    bad = [sid for sid in sids if (s.mnt / "s" / sid / "reply").read_text() != "done"]
    assert not bad, f"{len(bad)} sessions did not answer 'done', e.g. {(s.mnt / 's' / bad[0] / 'chat').read_text()}"
    return {
        "made": made,
        "written": written,
        "wall": wall,
        "cpu": sum(cpu),
        "loop_user": loop_cpu[0],
        "loop_system": loop_cpu[1],
        "idle_kib": (idle_rss - base_rss) / n,
        "busy_kib": (peak - base_rss) / n,
        "idle_reads": idle_reads,
        "reads": reads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1000, help="sessions, all busy at once (default 1000)")
    ap.add_argument("--steps", type=int, default=5, help="requests per turn: tool calls, then the answer (default 5)")
    ap.add_argument(
        "--writers",
        type=int,
        default=1,
        help="threads writing the prompts (default 1: one after another, each a FUSE round trip)",
    )
    ap.add_argument("--profile", metavar="FILE", type=Path, help="profile the server's event loop (cProfile) into FILE")
    args = ap.parse_args()
    if args.n < 1 or args.steps < 1 or args.writers < 1:
        ap.error("-n, --steps and --writers must be at least 1")
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"load before: {open('/proc/loadavg').read().strip()}")
    with WireServer(args.steps - 1) as port, tempfile.TemporaryDirectory(prefix="ollie-bench-scale-") as tmp:
        bare_s, bare_cpu = asyncio.run(bare(port, args.n, args.steps))
        s = Server(Path(tmp))
        cfg = {"backend": "openai", "model": "bench", "prompt": "You are a benchmark.\n"}
        (s.root / "cfg" / "agents" / "default.json").write_text(json.dumps(cfg))
        s.env.update(OLLIE_OPENAI_URL=f"http://127.0.0.1:{port}", OLLIE_OPENAI_KEY="k")
        if args.profile:
            profile_env(s.env, Path(tmp), args.profile)
        s.srv("start")
        try:
            r = busy(s, args.n, args.profile is not None, args.writers)
        finally:
            s.srv("stop")
        os.environ.update({k: v for k, v in s.env.items() if k.startswith("OLLIE_")})
        direct_s, direct_cpu = asyncio.run(direct(args.n, Path(tmp)))
        bare_again, bare_cpu_again = asyncio.run(bare(port, args.n, args.steps))  # the machine may have changed
    requests = args.n * args.steps
    base = min(bare_s, bare_again)
    bare_cpu = min(bare_cpu, bare_cpu_again)
    wall = float(r["wall"])  # type: ignore[arg-type]
    print(f"{args.n} sessions made through ctl in {r['made']:.1f} s; each a {args.steps}-request turn, all at once")
    print(
        f"  bare asyncio client, one process: {requests / base:8.0f} requests/s ({base:.2f} s; {bare_again:.2f}); "
        f"CPU {1000 * bare_cpu / requests:.3f} ms per request"
    )
    print(
        f"  ollie in one process, no server:  {requests / direct_s:8.0f} requests/s ({direct_s:.2f} s); "
        f"{base / direct_s:.2f}x the bare client; CPU {1000 * direct_cpu / requests:.3f} ms per request"
    )
    print(
        f"  ollie, through the mount:         {requests / wall:8.0f} requests/s ({wall:.2f} s, the prompts "
        f"written in {r['written']:.2f} s); {base / wall:.2f}x the bare client [target >= 0.7x]"
    )
    cpu = float(r["cpu"])  # type: ignore[arg-type]
    print(
        f"  server CPU during the turns: {cpu:.2f} s over {wall:.2f} s ({1000 * cpu / args.n:.1f} ms per turn, "
        f"{1000 * cpu / requests:.2f} ms per request)"
    )
    user, system = float(r["loop_user"]), float(r["loop_system"])  # type: ignore[arg-type]
    other = cpu - user - system
    print(
        f"    of which the event loop's thread: {1000 * user / requests:.2f} ms user + {1000 * system / requests:.2f} "
        f"ms system per request; the other threads {1000 * other / requests:.2f} ms"
    )
    idle_q, busy_q = quantiles(r["idle_reads"]), quantiles(r["reads"])  # type: ignore[arg-type]
    print(f"  cat s/<id>/state, sessions idle:  {fmt(idle_q)}")
    print(f"  cat s/<id>/state, during the load: {fmt(busy_q)}  p99 {busy_q['p99'] / idle_q['p99']:.1f}x idle's")
    print(f"     [target p99 <= 20 ms: {'met' if busy_q['p99'] <= 20 else 'NOT met'}]")
    print(f"  server RSS per session: {r['idle_kib']:.0f} KiB idle, {r['busy_kib']:.0f} KiB at the peak of the turns")
    print(f"load after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
