"""Batch jobs on Ray: N one-step jobs through `b/new` of a server running them on a Ray cluster
(OLLIE_BATCH_EXECUTOR=ray; a head node with --slots CPUs started on loopback for the run, on this
machine), against the same N jobs on the local executor (the baseline, same run, --slots at once).

    .venv/bin/python bench/ray_jobs.py [-n 200] [--slots 4]

Prints jobs per second for each, the server's RSS growth per finished job, the ratio, and Ray's
overhead per job: the difference of the two wall times over N, times the slots (what one job costs
a slot more on Ray; negative when Ray's worker processes run in parallel what the server's one
event loop runs in turn). Needs the `ray` extra.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jobs import run_jobs  # noqa: E402 (the local-executor bench next door)


def start_head(slots: int, temp: str, auth: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray = Path(sys.executable).parent / "ray"
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         f"--num-cpus={slots}", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        env={**os.environ, **auth}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return head, f"127.0.0.1:{port}"
        except OSError:
            if head.poll() is not None:
                sys.exit("the Ray head did not start")
            time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200, help="jobs on each executor")
    ap.add_argument("--slots", type=int, default=4, help="jobs at once: OLLIE_JOBS locally, the head's CPUs on Ray")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-ray-") as tmp:
        root = Path(tmp)
        (root / "local").mkdir()
        local_s, local_kib = run_jobs(root / "local", args.n, args.slots, warm=args.slots)
        temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        head, address = start_head(args.slots, temp, auth)
        try:
            (root / "ray").mkdir()
            # every job handed to the cluster at once (the Ray executor's default): its CPUs pace them
            ray_env = {"OLLIE_BATCH_EXECUTOR": "ray", "RAY_ADDRESS": address, **auth}
            ray_s, ray_kib = run_jobs(root / "ray", args.n, None, warm=args.slots, **ray_env)
        finally:
            head.terminate()
            head.wait()
            shutil.rmtree(temp, ignore_errors=True)
    print(f"{args.n} one-step jobs (scripted backend), {args.slots} at a time; load {os.getloadavg()[0]:.1f}")
    print(f"  local executor: {args.n / local_s:7.1f} jobs/s   server RSS {local_kib:6.1f} KiB per finished job")
    print(f"  Ray executor:   {args.n / ray_s:7.1f} jobs/s   server RSS {ray_kib:6.1f} KiB per finished job")
    print(f"  ratio: Ray takes {ray_s / local_s:.2f}x the local executor's time")
    print(f"  Ray's overhead per job: {(ray_s - local_s) / args.n * args.slots * 1000:.1f} ms of a slot")


if __name__ == "__main__":
    main()
