"""What a checkpoint adds to a turn, against `git status` on the same tree, in the same run.

    .venv/bin/python bench/checkpoints.py [--files 10000 100000] [--changed 10] [-n RUNS]

For each tree size: a project of N small files in nested directories (a git repository, so that
`git status` has an index to compare with), checkpointed once (the first snapshot reads every
file, as it must), then RUNS times: change `--changed` files, and time what a turn's checkpoint
costs (the snapshot before its first tool call and the one at its end), interleaved with
`git status --porcelain` on the same tree. Printed: both snapshots' work, and what the turn
waits for: the snapshot at its end (the first is taken while the model answers the first request,
and waited for only if a tool call comes sooner). Target (issue 26): within 2x `git status` on
10,000 files of which 10 changed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def make_tree(root: Path, files: int) -> list[Path]:
    paths = []
    for i in range(files):
        d = root / f"d{i % 50:02d}" / f"e{i // 50 % 20:02d}"  # 1,000 directories: about 10 files each at 10,000
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"f{i}.txt"
        p.write_text(f"file {i}\n" * 4)
        paths.append(p)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b"}
    env["GIT_COMMITTER_EMAIL"] = "b@b"
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tree"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True)
    return paths


async def one_size(files: int, changed: int, runs: int) -> None:
    from ollie.agent.checkpoints import Shadow

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OLLIE_DATA_PATH"] = str(Path(tmp, "data"))
        root = Path(tmp, "project")
        root.mkdir()
        paths = make_tree(root, files)
        shadow = Shadow(str(root))
        t = time.perf_counter()
        await shadow.snapshot()
        first = time.perf_counter() - t
        before, after, status = [], [], []
        for run in range(runs):
            t = time.perf_counter()
            subprocess.run(["git", "status", "--porcelain"], cwd=root, check=True, capture_output=True)
            status.append(time.perf_counter() - t)
            t = time.perf_counter()
            await shadow.snapshot()  # before the turn's first tool call: nothing changed since the last turn
            before.append(time.perf_counter() - t)
            for p in paths[run * changed : (run + 1) * changed]:
                p.write_text(f"changed in run {run}\n")  # what the turn's tool calls change
            t = time.perf_counter()
            await shadow.snapshot()  # at the turn's end
            after.append(time.perf_counter() - t)
        b, a, st = (statistics.median(x) * 1000 for x in (before, after, status))
        print(
            f"{files:>7} files, {changed} changed: git status {st:6.1f} ms | checkpoint: before {b:6.1f} ms, "
            f"after {a:6.1f} ms, work {(b + a) / st:4.2f}x git status; the turn waits {a:6.1f} ms = "
            f"{a / st:4.2f}x (the first snapshot is taken while the model answers) | first snapshot of the "
            f"tree, every file read: {first * 1000:.0f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--changed", type=int, default=10)
    ap.add_argument("-n", "--runs", type=int, default=9)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.runs} runs")
    for files in args.files:
        asyncio.run(one_size(files, args.changed, args.runs))
    print("target: checkpoint <= 2x git status at 10,000 files, 10 changed (issue 26)")


if __name__ == "__main__":
    main()
