"""Start-up: what a command costs before it does anything, against `python -c pass` in the same run.

    .venv/bin/python bench/startup.py [-n RUNS]

Each command runs RUNS times, interleaved with the baseline so that both see the same machine:
`ollie --help`, every command's `--help`, `ollie backends`, and `ollie run` on a scripted backend
to the first byte of its answer on stdout. Target (issue 30): `--help` and plain commands within
5x `python -c pass`.
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

OLLIE = [str(Path(sys.executable).with_name("ollie"))]


def first_byte(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.read(1)
    elapsed = time.perf_counter() - t
    proc.communicate()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--runs", type=int, default=11)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OLLIE_CFG_PATH": f"{tmp}/cfg", "OLLIE_DATA_PATH": f"{tmp}/data"}
        env["OLLIE_TMP_PATH"] = f"{tmp}/tmp"
        script = Path(tmp, "script.json")
        script.write_text(json.dumps({"rules": [{"match": ".", "text": "ok"}]}))
        subprocess.run([*OLLIE, "init"], env=env, check=True, capture_output=True)
        commands = {
            "ollie --help": [*OLLIE, "--help"],
            **{f"ollie {c} --help": [*OLLIE, c, "--help"] for c in ("run", "srv", "tools", "web", "init")},
            "ollie backends": [*OLLIE, "backends"],
            "ollie run, to the answer's first byte": [*OLLIE, "run", "--script", str(script), "hi"],
        }
        base: list[float] = []
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append(time.perf_counter() - t)
            for name, cmd in commands.items():
                times[name].append(first_byte(cmd, env))
        b = statistics.median(base) * 1000
        print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.runs} runs; python -c pass: {b:.1f} ms")
        for name, samples in times.items():
            ms = statistics.median(samples) * 1000
            print(f"  {name:<40} {ms:7.1f} ms  {ms / b:5.1f}x")
        print("target: --help and plain commands <= 5x python -c pass (issue 30)")


if __name__ == "__main__":
    main()
