"""The terminal frontend's latency: from Enter to the first streamed characters of the answer on
the screen, against `ollie run` on the same script (from starting the command to the answer's first
characters on its stdout: what a user of `ollie run` waits for each prompt).

    .venv/bin/python bench/tui.py [-n 20]

The TUI runs in a tmux pane (its screen read with capture-pane, every ~2 ms: the figure includes
up to that much polling delay) against `ollie srv` on a temporary mount, with a scripted agent
whose answers stream in 4-character chunks; the first chunk is a marker unique to the round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fs_helpers import OLLIE, FsServer  # noqa: E402
from tui_helpers import Tmux  # noqa: E402


def marker(i: int) -> str:
    return f"Q{i:03d}"


def turns(n: int) -> list[dict]:
    return [{"text": f"{marker(i)} is the answer, streamed in pieces.", "chunk": 4} for i in range(n)]


def tui_times(srv: FsServer, root: Path, n: int) -> list[float]:
    t = Tmux(root, srv.env, width=100, height=30)
    try:
        t.ollie("--agent", "bench", cwd=srv.work)
        t.wait_for(" idle ", timeout=30)
        times = []
        for i in range(n):
            t.type(f"round {i}")
            start = time.perf_counter()
            t.keys("Enter")
            while marker(i) not in t.screen():
                if time.perf_counter() - start > 30:
                    raise SystemExit(f"round {i}: no answer on the screen:\n{t.screen()}")
            times.append(time.perf_counter() - start)
            t.wait_for(" idle ")
        return times
    finally:
        t.close()


def run_times(srv: FsServer, script: Path, n: int) -> list[float]:
    times = []
    for i in range(n):
        script.write_text(json.dumps(turns(n)[i : i + 1]))
        start = time.perf_counter()
        proc = subprocess.Popen(
            [*OLLIE, "run", "--script", str(script), f"round {i}"],
            env=srv.env,
            cwd=srv.work,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        seen = b""
        while marker(i).encode() not in seen:
            byte = proc.stdout.read(1)
            if not byte:
                raise SystemExit(f"round {i}: `ollie run` ended without its answer: {seen!r}")
            seen += byte
        times.append(time.perf_counter() - start)
        proc.wait()
    return times


def show(name: str, times: list[float]) -> None:
    ms = sorted(t * 1000 for t in times)
    print(f"{name:<34} median {statistics.median(ms):7.1f} ms   min {ms[0]:7.1f}   max {ms[-1]:7.1f}   (n={len(ms)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-tui-") as tmp:
        root = Path(tmp)
        srv = FsServer(root / "srv")
        srv.agent("bench", turns=turns(args.n))
        srv.start()
        try:
            tui = tui_times(srv, root, args.n)
            run = run_times(srv, root / "one.json", args.n)
        finally:
            srv.stop()
    show("ollie (TUI): Enter -> first chars", tui)
    show("ollie run: start -> first chars", run)


if __name__ == "__main__":
    main()
