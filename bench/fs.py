"""File server figures: `cat s/<id>/state` latency on the FUSE mount (target: median <= 2 ms), the
same over 9P (bench/fs_9p.py), and the memory of idle sessions in one server (target: <= 256 KiB
each), for sessions created live and for the same sessions restored after a restart.

    .venv/bin/python bench/fs.py [-n 500] [--sessions 1000]

Runs `ollie srv` on a temporary mount with temporary ollie directories and a scripted backend.
Baselines measured in the same run: `cat` of a regular file on disk (process spawn included), and a
Python open/read/close of that file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OLLIE = [sys.executable, "-c", "import sys; from ollie.cli import main; sys.exit(main())"]


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Server:
    def __init__(self, root: Path):
        self.root, self.mnt = root, root / "mnt"
        script = root / "script.json"
        script.write_text(json.dumps({"rules": [{"match": ".", "text": "ok"}]}))
        (root / "cfg" / "agents").mkdir(parents=True)
        (root / "cfg" / "agents" / "default.json").write_text(json.dumps({"backend": "scripted", "model": str(script)}))
        self.env = dict(
            os.environ,
            OLLIE_CFG_PATH=str(root / "cfg"),
            OLLIE_DATA_PATH=str(root / "data"),
            OLLIE_TMP_PATH=str(root / "tmp"),
            NAMESPACE=str(root / "ns"),
            OLLIE=str(self.mnt),
        )

    def srv(self, action: str) -> None:
        subprocess.run([*OLLIE, "srv", action], env=self.env, check=True, capture_output=True)

    def pid(self) -> int:
        return int((self.root / "ns" / "ollie.pid").read_text().split()[0])

    def new(self) -> str:
        with open(self.mnt / "ctl", "r+") as f:
            f.write(f"new cwd={self.root}\n")
            f.flush()
            f.seek(0)
            return f.read().strip()


def read_file(path: Path) -> None:
    with open(path, "rb") as f:
        f.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="reads per latency figure (default 500)")
    ap.add_argument("--sessions", type=int, default=1000, help="idle sessions for the memory figure (default 1000)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-fs-") as tmp:
        s = Server(Path(tmp))
        s.srv("start")
        try:
            sid = s.new()
            state = s.mnt / "s" / sid / "state"
            (s.mnt / "s" / sid / "prompt").write_text("hello")
            while state.read_text() != "idle\n":
                (s.mnt / "s" / sid / "statewait").read_text()
            plain = Path(tmp) / "plain"
            plain.write_text("idle\n")
            cat_fuse = median_ms(lambda: subprocess.run(["cat", str(state)], stdout=subprocess.DEVNULL), args.n)
            cat_disk = median_ms(lambda: subprocess.run(["cat", str(plain)], stdout=subprocess.DEVNULL), args.n)
            py_fuse = median_ms(lambda: read_file(state), args.n)
            py_disk = median_ms(lambda: read_file(plain), args.n)
            print(
                f"cat s/<id>/state on the mount: median {cat_fuse:.3f} ms (cat of a disk file: {cat_disk:.3f} ms, "
                f"ratio {cat_fuse / cat_disk:.2f}); the mount's own cost {cat_fuse - cat_disk:.3f} ms"
            )
            print(
                f"open/read/close in Python: mount {py_fuse:.3f} ms, disk {py_disk:.3f} ms "
                f"(ratio {py_fuse / py_disk:.1f})"
            )
            ninep(s, sid, args.n)

            base = rss_kib(s.pid())
            t = time.perf_counter()
            for _ in range(args.sessions):
                s.new()
            made = time.perf_counter() - t
            live = rss_kib(s.pid())
            print(
                f"{args.sessions} idle sessions created in {made:.1f} s; server RSS {base} -> {live} KiB: "
                f"{(live - base) / args.sessions:.1f} KiB per live session"
            )
            s.srv("stop")
            s.srv("start")
            t = time.perf_counter()
            listed = len(os.listdir(s.mnt / "s"))
            listing = (time.perf_counter() - t) * 1000
            restored = rss_kib(s.pid())
            print(
                f"after a restart: {listed} sessions listed in {listing:.1f} ms; server RSS {restored} KiB "
                f"({(restored - base) / args.sessions:.1f} KiB per restored session vs the live server's base)"
            )
        finally:
            subprocess.run([*OLLIE, "srv", "stop"], env=s.env, capture_output=True)


def ninep(s: Server, sid: str, n: int) -> None:
    """The 9P half: bench/fs_9p.py's bench_9p, against this server's socket."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from fs_9p import bench_9p
    except ImportError as e:
        print(f"9P: skipped ({e})")
        return
    result = asyncio.run(bench_9p(f"unix!{s.root / 'ns' / 'ollie'}", f"s/{sid}/state", n))
    print("9P: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
