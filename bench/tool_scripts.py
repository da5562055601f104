"""The file_read tool script through execute_code, against a `cat` stage of the same file measured
in the same run.

    .venv/bin/python bench/tool_scripts.py [--runs N] [--lines N] [--width N] [--slice OFFSET LIMIT]
                                           [--tools DIR]

Every call is one execute_code stage in the session's jail. Printed: the median time of a `cat FILE`
stage (the baseline), of a `python3 -c pass` stage (the interpreter's start, which file_read pays
and cat does not) and of a `file_read FILE` stage, each as a ratio against the baseline; and the
time file_read itself takes, its stage less the interpreter's. With --slice, file_read shows LIMIT
lines from OFFSET and the baseline is `sed -n` printing the same lines (each reads the whole file:
file_read to count its lines and hash it), so a big file can be timed without printing it whole.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from stages import time_calls

import ollie
from ollie.tools import CallContext

DEFAULT_TOOLS = Path(ollie.__file__).parent / "defaults" / "tools"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time a file_read stage through execute_code against a cat stage of the same file.",
    )
    parser.add_argument("--runs", type=int, default=30, help="calls of each kind, interleaved (default 30)")
    parser.add_argument(
        "--lines", type=int, default=2000, help="lines in the file read (default 2000, what file_read shows at most)"
    )
    parser.add_argument("--width", type=int, default=80, help="characters a line (default 80)")
    parser.add_argument(
        "--tools", type=Path, default=DEFAULT_TOOLS, help=f"the directory holding file_read (default {DEFAULT_TOOLS})"
    )
    parser.add_argument(
        "--slice", nargs=2, type=int, metavar=("OFFSET", "LIMIT"), help="read LIMIT lines from OFFSET (1-based)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.lines < 1 or args.width < 1:
        parser.error("--runs, --lines and --width must be at least 1")
    if not (args.tools / "file_read").is_file():
        parser.error(f"no file_read in {args.tools}")
    return args


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        path = Path(cwd, "data.txt")
        line = ("0123456789" * (args.width // 10 + 1))[: args.width]
        path.write_text("".join(f"{i} {line}\n" for i in range(args.lines)))
        kib = path.stat().st_size / 1024
        env = {"OLLIE_TOOLS_PATH": str(args.tools)}
        ctx = CallContext(cwd=cwd, session_id="bench", tmpdir=cwd, env=env)
        if args.slice:
            first, count = args.slice
            baseline, read = f"sed -n {first},{first + count - 1}p", [str(first), str(count)]
        else:
            baseline, read = "cat", []
        calls = {
            baseline: [{"code": f"{baseline} data.txt"}],
            "python3 -c pass": [{"code": "pass", "language": "python3"}],
            "file_read": [{"tool": "file_read", "args": ["data.txt", *read]}],
        }
        samples = await time_calls(cwd, ctx, calls, args.runs)
    ms = {name: statistics.median(s) * 1000 for name, s in samples.items()}
    base = ms[baseline]
    print(f"a {args.lines}-line file ({kib:.0f} KiB); one stage through execute_code, median of {args.runs} calls")
    for name, value in ms.items():
        print(f"  {name + ' stage':24} {value:7.2f} ms  {value / base:5.2f}x {baseline.split()[0]}")
    own = ms["file_read"] - ms["python3 -c pass"]
    print(f"  file_read's own work     {own:7.2f} ms  (its stage less python3's start)")


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
