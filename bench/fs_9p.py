"""The 9P half of bench/fs.py: latency of reading s/<id>/state over 9P (target: median <= 2 ms).

    .venv/bin/python bench/fs_9p.py [-n 2000]

runs a server (the real namespace) in a child process, creates one session with the scripted backend,
and times `cat s/<id>/state` as a 9P client does it: walk, open, read to EOF, clunk. The baseline,
measured in the same run, is one bare round trip (Tstat of the attached root).
`bench_9p(addr, path)` is what bench/fs.py calls against its own server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ollie.vfs import ninep as P
from ollie.vfs.ninep_client import Client

SERVER = """
import asyncio, sys
from ollie.fs import tree
from ollie.fs.sessions import Sessions
from ollie.vfs.ninep_server import serve_unix

async def main():
    srv = await serve_unix(tree.build(Sessions()), sys.argv[1])
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent goes
    await srv.close()

asyncio.run(main())
"""


async def _times(op, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await op()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def bench_9p(addr: str, path: str, n: int = 1000, token: str = "") -> dict[str, float]:
    """Median and p90 (ms) of reading `path` whole over 9P, against a bare round trip."""
    c = await Client.connect(addr, token=token)
    try:
        await c.read_path(path)  # warm up
        rtt = await _times(lambda: c.stat(c.root), n)
        cat = await _times(lambda: c.read_path(path), n)
    finally:
        await c.close()
    med, base = statistics.median(cat), statistics.median(rtt)
    return {
        "median_ms": med,
        "p90_ms": statistics.quantiles(cat, n=10)[-1],
        "rtt_median_ms": base,
        "ratio_vs_rtt": med / base,
    }


async def _new_session(addr: str, script: Path) -> str:
    c = await Client.connect(addr)
    try:
        fid = await c.walk("ctl")
        await c.open(fid, P.OWRITE)
        await c.write(fid, 0, f"new backend=scripted model={script}\n".encode())
        await c.clunk(fid)
        return [st.name for st in await c.list("s")][-1]
    finally:
        await c.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2000, help="reads timed, and as many bare round trips (default 2000)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-9p-") as tmp:
        root = Path(tmp)
        env = {
            **os.environ,
            "OLLIE_CFG_PATH": str(root / "cfg"),
            "OLLIE_DATA_PATH": str(root / "data"),
            "OLLIE_TMP_PATH": str(root / "tmp"),
        }
        script = root / "script.json"
        script.write_text(json.dumps({"rules": [{"match": ".*", "text": "ok"}]}))
        sock = root / "ns" / "ollie"
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SERVER,
            str(sock),
            env=env,
            cwd=tmp,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert (await server.stdout.readline()).strip() == b"ready"
            addr = f"unix!{sock}"
            sid = await _new_session(addr, script)
            r = await bench_9p(addr, f"s/{sid}/state", args.n)
        finally:
            server.stdin.close()
            await server.wait()
    print(f"9P cat s/<id>/state: median {r['median_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms (n={args.n}; target <= 2 ms)")
    print(
        f"baseline, one bare 9P round trip: median {r['rtt_median_ms']:.3f} ms; "
        f"cat/round trip = {r['ratio_vs_rtt']:.1f}x (a cat is 5 round trips)"
    )


if __name__ == "__main__":
    asyncio.run(main())
