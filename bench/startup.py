"""Start-up: what a command costs before it does anything, against `python -c pass` in the same run.

    .venv/bin/python bench/startup.py [-n RUNS] [--frames N]

Each command runs RUNS times, interleaved with the baseline so that both see the same machine:
`ollie --help` and every command's `--help`, the plain commands (`ollie --version`, `ollie
backends`, ...), and `ollie run` on a scripted backend to the first byte of its answer on stdout.
Then the terminal UI's first frame (bench/tui.py: from starting `ollie`, its server running, to the
status and input lines on a tmux screen; tmux needed). Target (issue 30): `--help` and plain
commands within 5x `python -c pass`.

ollie's modules are read from bytecode, as in an installed package (`bytecode_as_installed`),
written by a first, untimed run of each command. Times are to the first byte of output: a command
that prints nothing is timed to its exit (which adds ~5 ms of the interpreter's teardown).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ollie.cli import build_parser

OLLIE = [str(Path(sys.executable).with_name("ollie"))]
PLAIN = (["--version"], ["backends"], ["sessions"], ["keys", "list"], ["trust", "--list"], ["completion", "bash"])
TARGET = 5.0


def bytecode_as_installed(cache: Path) -> None:
    """The commands this process starts read ollie from bytecode, as an installed package is read:
    PYTHONDONTWRITEBYTECODE (a test environment may set it) would compile every module at each
    start. The bytecode goes to `cache`, not beside the sources."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


def first_byte(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.read(1)
    elapsed = time.perf_counter() - t
    proc.communicate()
    return elapsed


def command_names() -> list[str]:
    """Every command `ollie --help` lists."""
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def commands(script: Path) -> dict[str, list[str]]:
    """What is timed, by the name printed; those whose name ends in * have the 5x target."""
    timed = {"ollie --help *": [*OLLIE, "--help"]}
    timed |= {f"ollie {c} --help *": [*OLLIE, c, "--help"] for c in command_names()}
    timed |= {f"ollie {' '.join(argv)} *": [*OLLIE, *argv] for argv in PLAIN}
    timed["ollie run, to the answer's first byte"] = [*OLLIE, "run", "--script", str(script), "hi"]
    return timed


def tui_first_frames(n: int) -> list[float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tui import first_frames  # bench/tui.py, which needs tmux

    return first_frames(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=11)
    ap.add_argument("--frames", type=int, default=5, help="starts of the terminal UI (0: none)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bytecode_as_installed(Path(tmp, "pycache"))
        env = {**os.environ, "OLLIE_CFG_PATH": f"{tmp}/cfg", "OLLIE_DATA_PATH": f"{tmp}/data"}
        env["OLLIE_TMP_PATH"] = f"{tmp}/tmp"
        script = Path(tmp, "script.json")
        script.write_text(json.dumps({"rules": [{"match": ".", "text": "ok"}]}))
        subprocess.run([*OLLIE, "init"], env=env, check=True, capture_output=True)
        timed = commands(script)
        baseline = [sys.executable, "-c", "pass"]
        for cmd in [baseline, *timed.values()]:  # writes the bytecode
            subprocess.run(cmd, env=env, capture_output=True)
        base: list[float] = []
        times: dict[str, list[float]] = {name: [] for name in timed}
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run(baseline, env=env, check=True)
            base.append(time.perf_counter() - t)
            for name, cmd in timed.items():
                times[name].append(first_byte(cmd, env))
        frames = tui_first_frames(args.frames) if args.frames else []
    b = statistics.median(base) * 1000
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.runs} runs; python -c pass: {b:.1f} ms")
    over = []
    for name, samples in times.items():
        ms = statistics.median(samples) * 1000
        print(f"  {name:<42} {ms:7.1f} ms  {ms / b:5.1f}x")
        if name.endswith("*") and ms / b > TARGET:
            over.append(name)
    if frames:
        ms = statistics.median(frames) * 1000
        print(f"  {'ollie (TUI), to its first full frame':<42} {ms:7.1f} ms  {ms / b:5.1f}x  (n={len(frames)})")
    print(f"target (issue 30): * within {TARGET:g}x python -c pass; over it: {', '.join(over) or 'none'}")


if __name__ == "__main__":
    main()
