"""N agents at work on one server, each turn running sandboxed tool calls, against a model whose
every answer takes a set time, streamed in a set number of chunks.

    .venv/bin/python bench/agents.py [-n 500] [--delay 1] [--chunks 50] [--tools 4] [--within 1]

Runs `ollie srv` on a temporary mount (bench/fs.py) against the OpenAI-wire mock (bench/wire.py,
in a process of its own) and drives N sessions through the file interface: each gets a prompt
(written evenly over `--within` seconds, one by default: the issue's "all first calls within
1 s", as many a second as the ideal steps; 0 writes them as fast as 8 threads can, in about half
a second, a burst of stages every step) and answers it in a turn of `--tools` requests
that call `execute_code` (`true`, sandboxed) and a last one that answers; the ideal turn is
(tools + 1) x delay. Two turns: the cold one (every session's jail starts on its first call) and a
warm one (the jails run). Meanwhile one thread reads `s/<id>/state` of each session in turn
(as `cat` does: open, fstat, read to the end, close; `--reads` a second at most, so that the
server's CPU a step does not depend on how fast the reads come back), to see each turn end: those
reads' latency is what a user's `cat state` waits.
Then the same with a tool that needs no sandbox (the A/B): `noop`, a tool the agent lacks,
answered at once with an error.

Printed per turn: the turn's time against the ideal (median and p99 of the sessions', each from
its prompt's write to its chat's last write, and the whole turn's wall, from the first prompt to
the last turn's end), steps (requests) per second against the ideal (N / delay): steady (the sum
of the sessions' rates, each its steps over its turn's time) and over the whole wall (which the
prompts' writing, spread over a fraction of a second, stretches), `state` latency
(p50, p99, max), CPU per step: the server's, the jails' (their PID 1s and the fork server) and
their stages' (what each PID 1 reaped: the stages and whatever they started), the mock's, this
bench's, the whole machine's (the wall on every core less /proc/stat's idle time) and what is left
of it (the kernel's work no process is charged for, such as the network's softirqs, and whatever
else ran), with the share of the turn the machine was idle, and after the warm turn the memory per live session (the
proportional set size of the server and of every jail process, less the server's before the
sessions, over N). Before the sandboxed run it prints the floor the machine sets: its CPU a step
at the ideal rate (cores x delay / N: 4 ms for 500 agents on 2 cores), and what each stage's own
program (`bash -c true`, started plainly) costs before any sandbox; with the A/B's whole-machine
figure, that says how much of the machine is left for the sandbox. Issue 31's targets at 500
agents (1 s answers in 50 chunks, 4 tool calls a turn): warm steps/s >= 0.9x ideal, turn <= 1.1x
ideal, `state` p99 <= 20 ms in both turns, <= 2 MiB per live session. `uptime` is printed before
and after: the machine's load is the figures'.
Checkpoints (a git snapshot of the cwd each turn) are off unless `--checkpoints`: their cost is
git's, not the loop's or the sandbox's. The sessions work in one directory (sub-agents in one
project), or with `--own-cwd` each in one of its own, holding 20 small files (agents at work in
projects of their own, each snapshot its own `git`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from sys import path as sys_path

sys_path.insert(0, str(Path(__file__).resolve().parent))
from fs import Server  # noqa: E402 (a server on a temporary mount)

from wire import WireServer  # noqa: E402 (the OpenAI-wire mock)

TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_of(pid: int) -> float:
    return sum(int(x) for x in stat_fields(pid)[11:13]) / TICK


def jail_pids() -> list[int]:
    """Every process of a fork server's session: the jails' PID 1s and what they run."""
    servers, found = set(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            if (
                b"-c" in argv
                and argv.index(b"-c") + 1 < len(argv)
                and b"The jail helper" in argv[argv.index(b"-c") + 1]
            ):
                servers.add(int(name))
        except OSError:
            continue
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if int(stat_fields(int(name))[3]) in servers:
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def jails_cpu(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Each jail process's CPU: its own, and its reaped children's (a PID 1's: the stages it ran,
    each waited for when it exited), in seconds."""
    found = {}
    for pid in pids:
        try:
            f = stat_fields(pid)
        except OSError:
            continue
        found[pid] = ((int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK)
    return found


def machine_idle() -> float:
    """Seconds the cores were idle (iowait and steal counted idle) since boot, from /proc/stat: the
    kernel counts idle time exactly and busy time by sampling ticks, so busy is the wall less this."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[3] + f[4] + f[7]) / TICK


def pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def cat(path: Path) -> str:
    """The file's text, read as `cat` reads it (open, fstat, read to the end, close): Python's
    open() asks the file system two things more (an ioctl, isatty's, and another fstat)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fstat(fd)
        parts = []
        while part := os.read(fd, 131072):
            parts.append(part)
        return b"".join(parts).decode()
    finally:
        os.close(fd)


def q(values: list[float]) -> tuple[float, float, float]:
    s = sorted(values) or [0.0]
    return statistics.median(s), s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]


def program_cpu_ms(argv: list[str], n: int = 200) -> float:
    """The CPU (user and system) one run of `argv` costs, started plainly (posix_spawn, waited):
    what each sandboxed stage's own program costs the machine before any sandbox."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        os.waitpid(os.posix_spawn(argv[0], argv, os.environ), 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n * 1000


def turn(
    s: Server, sids: list[str], ideal: float, mock: int, rate: float, within: float
) -> dict[str, float | list[float]]:
    """Prompt every session, then read their states, `rate` reads a second at most, until every
    one is idle."""
    reads: list[float] = []
    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    jails0 = jails_cpu(jail_pids())
    server_cpu, mock_cpu, own_cpu = cpu_of(s.pid()), cpu_of(mock), time.process_time()
    idle0, mono0 = machine_idle(), time.monotonic()
    t0 = time.time()

    first = time.perf_counter() + 0.01
    slot = {sid: first + i * within / len(sids) for i, sid in enumerate(sids)}

    def prompt(sid: str) -> None:
        time.sleep(max(0.0, slot[sid] - time.perf_counter()))
        started[sid] = time.time()
        (s.mnt / "s" / sid / "prompt").write_text("go")

    with ThreadPoolExecutor(8) as pool:
        writing = pool.map(prompt, sids)
        pending = list(sids)
        time.sleep(0.2)
        due = time.perf_counter()
        while pending:
            still = []
            for sid in pending:
                due += 1 / rate
                time.sleep(max(0.0, due - time.perf_counter()))
                t = time.perf_counter()
                state = cat(s.mnt / "s" / sid / "state")
                now = time.perf_counter()
                reads.append((now - t) * 1000)
                if state == "idle\n" and sid in started and time.time() - started[sid] > ideal * 0.5:
                    # when the turn ended: its chat's last write (the blank line that ends a turn);
                    # a pass over 500 states takes a second, which the turn did not
                    ended[sid] = (s.mnt / "s" / sid / "chat").stat().st_mtime
                else:
                    still.append(sid)
            pending = still
            time.sleep(0.005)
        list(writing)
    wall = max(ended.values()) - t0
    # the machine's and the processes' figures together (the checks below cost the server)
    idle, span = machine_idle() - idle0, time.monotonic() - mono0
    server_cpu, mock_cpu = cpu_of(s.pid()) - server_cpu, cpu_of(mock) - mock_cpu
    own_cpu = time.process_time() - own_cpu
    pids = jail_pids()
    jails = jails_cpu(pids)  # a jail started in the turn counts from nothing
    jails_own = sum(own - jails0.get(pid, (0.0, 0.0))[0] for pid, (own, _) in jails.items())
    stages_cpu = sum(kids - jails0.get(pid, (0.0, 0.0))[1] for pid, (_, kids) in jails.items())
    bad = [sid for sid in sids if not (s.mnt / "s" / sid / "reply").read_text().endswith("done")]
    assert not bad, f"{len(bad)} sessions did not answer 'done', e.g. {(s.mnt / 's' / bad[0] / 'chat').read_text()}"
    return {
        "wall": wall,
        "turns": [ended[sid] - started[sid] for sid in sids],
        "reads": reads,
        "server_cpu": server_cpu,
        "mock_cpu": mock_cpu,
        "own_cpu": own_cpu,
        "jails_cpu": jails_own,
        "stages_cpu": stages_cpu,
        "machine_cpu": span * CORES - idle,
        "machine_idle": idle / (span * CORES),
        "jail_pids": pids,
    }


def new(s: Server, own: str = "") -> str:
    """A session working in `work` (or `work/<own>`, made with 20 small files): not a directory
    holding the server's mount (a session that snapshots its cwd with git would read the mount
    its own server serves)."""
    work = s.root / "work" / own
    if not work.is_dir():
        work.mkdir(parents=True)
        for i in range(20 if own else 0):
            (work / f"file{i}.txt").write_text(f"line {i}\n" * 20)
    with open(s.mnt / "ctl", "r+") as f:
        f.write(f"new cwd={work}\n")
        f.flush()
        f.seek(0)
        return f.read().strip()


def run(
    n: int,
    delay: float,
    chunks: int,
    tools: int,
    sandboxed: bool,
    checkpoints: bool = False,
    rate: float = 500,
    within: float = 1.0,
    own_cwd: bool = False,
) -> None:
    tool, arguments = ("execute_code", json.dumps({"steps": [{"code": "true"}]})) if sandboxed else ("noop", "{}")
    ideal = (tools + 1) * delay
    mock = WireServer(tools, tool, arguments, delay=delay, chunks=chunks)
    with (
        mock as port,
        tempfile.TemporaryDirectory(prefix="ollie-bench-agents-", dir="/var/tmp") as tmp,
    ):
        s = Server(Path(tmp))
        cfg = {"backend": "openai", "model": "bench", "prompt": "You are a benchmark.\n"}
        (s.root / "cfg" / "agents" / "default.json").write_text(json.dumps(cfg))
        s.env.update(OLLIE_OPENAI_URL=f"http://127.0.0.1:{port}", OLLIE_OPENAI_KEY="k")
        s.env["OLLIE_CHECKPOINTS"] = "on" if checkpoints else "off"
        s.srv("start")
        try:
            base_pss = pss_kib([s.pid()])
            sids = [new(s, f"a{i}" if own_cwd else "") for i in range(n)]
            what = "sandboxed execute_code" if sandboxed else "noop (no sandbox)"
            print(f"{n} agents, {tools} calls of {what} a turn, answers of {delay:g} s in {chunks} chunks")
            capacity = CORES * delay / n * 1000
            if sandboxed:
                bash = shutil.which("bash") or "/bin/bash"
                program = program_cpu_ms([bash, "-c", "true"])
                print(
                    f"  the machine's CPU a step at the ideal rate: {capacity:.2f} ms ({CORES} cores); each stage's "
                    f"own program (`bash -c true`, unsandboxed) takes {program:.2f} ms, "
                    f"{program * tools / (tools + 1):.2f} ms a step"
                )
            else:
                print(f"  the machine's CPU a step at the ideal rate: {capacity:.2f} ms ({CORES} cores)")
            for name in ("cold", "warm"):
                r = turn(s, sids, ideal, mock.pid or 0, rate, within)
                steps = n * (tools + 1)
                tq, rq = q(r["turns"]), q(r["reads"])  # type: ignore[arg-type]
                wall = float(r["wall"])  # type: ignore[arg-type]
                turns: list[float] = r["turns"]  # type: ignore[assignment]
                steady = sum((tools + 1) / t for t in turns)
                print(
                    f"  {name}: turn p50 {tq[0]:.2f} s ({tq[0] / ideal:.2f}x ideal), p99 {tq[1]:.2f} s "
                    f"({tq[1] / ideal:.2f}x), all {wall:.2f} s; steady {steady:.0f} steps/s "
                    f"({steady / (n / delay):.2f}x ideal {n / delay:.0f}), {steps / wall:.0f} over the whole wall "
                    f"({steps / wall / (n / delay):.2f}x)"
                )
                print(
                    f"        state: p50 {rq[0]:.2f} ms, p99 {rq[1]:.2f} ms, max {rq[2]:.1f} ms "
                    f"({len(r['reads'])} reads)"  # type: ignore[arg-type]
                )
                keys = ("server_cpu", "jails_cpu", "stages_cpu", "mock_cpu", "own_cpu", "machine_cpu")
                cpu = {k: 1000 * float(r[k]) / steps for k in keys}  # type: ignore[arg-type]
                rest = cpu["machine_cpu"] - sum(cpu[k] for k in keys[:-1])
                print(
                    f"        CPU per step: server {cpu['server_cpu']:.2f} ms, the jails {cpu['jails_cpu']:.2f} ms "
                    f"and their stages {cpu['stages_cpu']:.2f} ms, the mock model {cpu['mock_cpu']:.2f} ms, "
                    f"this bench {cpu['own_cpu']:.2f} ms, the rest (the kernel's own work, other programs) "
                    f"{rest:.2f} ms; the whole machine {cpu['machine_cpu']:.2f} ms "
                    f"(idle {100 * float(r['machine_idle']):.0f} % of the turn)"  # type: ignore[arg-type]
                )
            server_pss = pss_kib([s.pid()]) - base_pss
            jails_pss = pss_kib(r["jail_pids"])  # type: ignore[arg-type]
            print(
                f"  memory per live session: {(server_pss + jails_pss) / n / 1024:.2f} MiB (PSS: the server's "
                f"{server_pss / n / 1024:.2f}, the jails' {jails_pss / n / 1024:.2f})"
            )
        finally:
            s.srv("stop")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="agents, all at work at once (default 500)")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds each answer takes (default 1)")
    ap.add_argument("--chunks", type=int, default=50, help="events each answer streams in (default 50)")
    ap.add_argument("--tools", type=int, default=4, help="tool calls a turn (default 4)")
    ap.add_argument("--no-ab", action="store_true", help="skip the run without the sandbox")
    ap.add_argument("--only-ab", action="store_true", help="only the run without the sandbox")
    ap.add_argument("--reads", type=float, default=500, help="`state` reads a second at most (default 500)")
    ap.add_argument(
        "--within", type=float, default=1.0, help="seconds the prompts are written over, evenly (default 1)"
    )
    ap.add_argument("--checkpoints", action="store_true", help="snapshot each turn's cwd (off by default: git's cost)")
    ap.add_argument("--own-cwd", action="store_true", help="each session in a directory of its own (default: one)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"uptime before: {os.popen('uptime').read().strip()}")
    if not args.only_ab:
        run(args.n, args.delay, args.chunks, args.tools, True, args.checkpoints, args.reads, args.within, args.own_cwd)
    if not args.no_ab:
        run(args.n, args.delay, args.chunks, args.tools, False, args.checkpoints, args.reads, args.within, args.own_cwd)
    print(f"uptime after: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
