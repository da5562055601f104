"""What one streamed chunk of an answer costs the server: its CPU per chunk, through everything a
chunk meets (the HTTP client, the OpenAI-compatible backend, the loop, the event bus, the chat
log, the file server's subscribers).

    .venv/bin/python bench/stream.py [-n 8] [--chunks 2000] [--delay 2] [--readers 0]

Runs `ollie srv` (bench/fs.py) against the OpenAI-wire mock (bench/wire.py) answering with text
alone, each answer taking `--delay` seconds in `--chunks` events, each event its own write (so its
own read on the server: the worst case, which batching what one read brings cannot help). `-n`
sessions answer at once, turn after turn: the server's CPU for turns of `--chunks` events less
that for turns of 20 events, over the difference in events, is the cost of one chunk (what a
turn costs anyway cancels out). `--readers` sessions also have a reader blocked on their chat
(`tail -f`-like: a read at the end of the file, over the mount), who waits for each chunk; the
others have none. Printed: the server's CPU per chunk (best of `--rounds`) and per turn. Nothing is
read meanwhile but the sessions' `state` at the end of each turn, once.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from sys import path as sys_path

sys_path.insert(0, str(Path(__file__).resolve().parent))
from agents import cpu_of, new  # noqa: E402
from fs import Server  # noqa: E402

from wire import WireServer  # noqa: E402


def turn_cpu(s: Server, sids: list[str]) -> float:
    """Server CPU seconds of one turn of every session (all prompted at once)."""
    for sid in sids:
        while (s.mnt / "s" / sid / "state").read_text() != "idle\n":
            time.sleep(0.05)
    before = cpu_of(s.pid())
    for sid in sids:
        (s.mnt / "s" / sid / "prompt").write_text("go")
    time.sleep(0.5)
    for sid in sids:
        while (s.mnt / "s" / sid / "state").read_text() != "idle\n":
            (s.mnt / "s" / sid / "statewait").read_text()
    return cpu_of(s.pid()) - before


def follow(path: Path, stop: threading.Event) -> None:
    """Read `path` as `tail -f` does over the mount: a read at its end waits for what comes."""
    with open(path, "rb", buffering=0) as f:
        f.seek(0, os.SEEK_END)
        while not stop.is_set():
            f.read(65536)


def run(n: int, chunks: int, delay: float, readers: int, rounds: int) -> None:
    results = {}
    for count in (20, chunks):
        with WireServer(0, delay=delay, chunks=count) as port, tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            s = Server(Path(tmp))
            cfg = {"backend": "openai", "model": "bench", "prompt": "You are a benchmark.\n"}
            (s.root / "cfg" / "agents" / "default.json").write_text(json.dumps(cfg))
            s.env.update(OLLIE_OPENAI_URL=f"http://127.0.0.1:{port}", OLLIE_OPENAI_KEY="k", OLLIE_CHECKPOINTS="off")
            s.srv("start")
            stop = threading.Event()
            try:
                sids = [new(s) for _ in range(n)]
                turn_cpu(s, sids)  # the first turn makes what later turns reuse
                for sid in sids[:readers]:
                    threading.Thread(target=follow, args=(s.mnt / "s" / sid / "chat", stop), daemon=True).start()
                results[count] = min(turn_cpu(s, sids) for _ in range(rounds)) / n
            finally:
                stop.set()
                s.srv("stop")
    per_chunk = (results[chunks] - results[20]) / (chunks - 20)
    print(
        f"{n} sessions ({readers} followed), answers of {delay:g} s: server CPU per turn {results[20] * 1000:.2f} ms "
        f"(20 chunks), {results[chunks] * 1000:.2f} ms ({chunks} chunks); per chunk {per_chunk * 1e6:.1f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=8, help="sessions answering at once (default 8)")
    ap.add_argument("--chunks", type=int, default=2000, help="events an answer streams in (default 2000)")
    ap.add_argument("--delay", type=float, default=2.0, help="seconds an answer takes (default 2)")
    ap.add_argument("--readers", type=int, default=0, help="sessions whose chat a reader follows (default 0)")
    ap.add_argument("--rounds", type=int, default=3, help="turns measured, the best kept (default 3)")
    args = ap.parse_args()
    print(f"uptime before: {os.popen('uptime').read().strip()}")
    run(args.n, args.chunks, args.delay, args.readers, args.rounds)
    print(f"uptime after: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
