"""The memory_recall tool script over many memories, against `grep -rilF` over the same files.

    .venv/bin/python bench/memory_recall.py [--memories N] [--runs N] [--query Q] [--dir DIR]
                                            [--python PATH] [--tools DIR] [--stage]

Makes N memory files (default 10,000) in memory_remember's format, written directly rather than
by N processes, with a few planted words the query finds; then times, as processes, median of the
runs, interleaved: `python3 -c pass` (the interpreter's start), `memory_recall QUERY` and
`grep -rilF QUERY DIR`, printing memory_recall as a ratio against grep. Then the time inside the
script: its main() called in this process (no interpreter start, no imports), the process less
the interpreter's start (imports and compiling the script included), and the floor no scan can go
under (listing the directory and one stat a file, which memory_recall does at every call to keep
the index in step with the files). Also the first call, which builds the index, and a call after
one file changed. With --stage, the same recall and grep as execute_code stages in the sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.util
import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import ollie

DEFAULT_TOOLS = Path(ollie.__file__).parent / "defaults" / "tools"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time memory_recall over many memories against grep -rilF over the same files.",
    )
    parser.add_argument("--memories", type=int, default=10_000, help="memory files (default 10000)")
    parser.add_argument("--runs", type=int, default=20, help="timed calls of each kind, interleaved (default 20)")
    parser.add_argument(
        "--query", default="sandbox policy", help="what to recall and grep for (default 'sandbox policy')"
    )
    parser.add_argument(
        "--dir", type=Path, help="keep the memories in DIR (made if empty, reused otherwise); default a temporary one"
    )
    parser.add_argument(
        "--python", default=sys.executable, help=f"the interpreter that runs the script (default {sys.executable})"
    )
    parser.add_argument(
        "--tools", type=Path, default=DEFAULT_TOOLS, help=f"where memory_recall is (default {DEFAULT_TOOLS})"
    )
    parser.add_argument("--stage", action="store_true", help="also time both as execute_code stages in the sandbox")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.memories < 1:
        parser.error("--runs and --memories must be at least 1")
    if not (args.tools / "memory_recall").is_file():
        parser.error(f"no memory_recall in {args.tools}")
    if shutil.which("grep") is None:
        parser.error("grep is not installed")
    return args


def make_memories(directory: Path, n: int) -> None:
    """`n` memories as memory_remember writes them: pseudo-words, and "sandbox" and "policy"
    planted in a few titles, tags and bodies (1-3% of the memories each)."""
    rng = random.Random(12)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(5000)]
    filler = "the a of to and in is it for on with as that this be by are from".split()
    for i in range(n):
        title = [rng.choice(vocab) for _ in range(rng.randint(3, 7))]
        if rng.random() < 0.005:
            title += ["sandbox", "policy"]
        tags = [rng.choice(vocab[:200]) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.01:
            tags.append("sandbox")
        body = [rng.choice(vocab) if rng.random() < 0.6 else rng.choice(filler) for _ in range(rng.randint(30, 150))]
        for word in ("sandbox", "policy"):
            if rng.random() < 0.02:
                body.insert(rng.randrange(len(body)), word)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1_700_000_000 + 60 * i))
        name = f"{stamp}--{'-'.join(title)[:60].strip('-')}__{'-'.join(tags)}.md"
        (directory / name).write_text(f"# {' '.join(title)}\ntags: {', '.join(tags)}\n\n{' '.join(body)}\n")


def load_script(path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("memory_recall", str(path))
    spec = importlib.util.spec_from_loader("memory_recall", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def in_process(module: ModuleType, query: str) -> float:
    """Seconds of one main() of the script, its output kept from the terminal."""
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BytesIO())
    try:
        t = time.perf_counter()
        module.main([query])
        return time.perf_counter() - t
    finally:
        sys.stdout = saved


def scan_floor(directory: Path) -> float:
    """Seconds to list the directory and stat each file: what keeping in step costs at least."""
    t = time.perf_counter()
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            os.stat(name, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def run(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t
    if done.returncode not in (0, 1):  # grep's 1 is "no match"
        raise SystemExit(f"{cmd[0]} failed: {done.stderr.decode(errors='replace')}")
    return elapsed


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def stages(args: argparse.Namespace, data: Path) -> dict[str, float]:
    """Median ms of memory_recall and grep as execute_code stages, the memory in `data`/memory."""
    from stages import time_calls

    from ollie.tools import CallContext

    os.environ["OLLIE_DATA_PATH"] = str(data)  # execute_code's $OLLIE_MEMORY_DIR is $OLLIE_DATA_PATH/memory
    with tempfile.TemporaryDirectory() as cwd:
        ctx = CallContext(cwd=cwd, session_id="bench", tmpdir=cwd, env={"OLLIE_TOOLS_PATH": str(args.tools)})
        calls: dict[str, list[dict[str, Any]]] = {
            "grep -rilF stage": [{"code": f'grep -rilF -- {shell_quote(args.query)} "$OLLIE_MEMORY_DIR" | wc -l'}],
            "memory_recall stage": [{"tool": "memory_recall", "args": [args.query]}],
        }
        samples = await time_calls(cwd, ctx, calls, args.runs)
    return {name: median_ms(s) for name, s in samples.items()}


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch)
        memory = args.dir or data / "memory"
        memory.mkdir(parents=True, exist_ok=True)
        if not any(memory.glob("*.md")):
            t = time.perf_counter()
            make_memories(memory, args.memories)
            print(f"made {args.memories} memories in {memory} in {time.perf_counter() - t:.1f} s")
        count = sum(1 for _ in memory.glob("*.md"))
        size = sum(p.stat().st_size for p in memory.glob("*.md")) / 2**20
        env = {**os.environ, "OLLIE_MEMORY_DIR": str(memory)}
        script = str(args.tools / "memory_recall")
        recall = [args.python, script, args.query]
        first = run(recall, env) * 1000
        calls = {
            "python3 -c pass": [args.python, "-c", "pass"],
            "memory_recall": recall,
            "grep -rilF": ["grep", "-rilF", "--", args.query, str(memory)],
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for cmd in calls.values():  # warm the caches
            run(cmd, env)
        for _ in range(args.runs):  # interleaved, so all see the same machine load
            for name, cmd in calls.items():
                samples[name].append(run(cmd, env))
        ms = {name: median_ms(s) for name, s in samples.items()}

        os.environ["OLLIE_MEMORY_DIR"] = str(memory)
        module = load_script(args.tools / "memory_recall")
        in_process(module, args.query)
        own = median_ms([in_process(module, args.query) for _ in range(args.runs)])
        floor = median_ms([scan_floor(memory) for _ in range(args.runs)])
        victim = sorted(memory.glob("*.md"))[count // 2]
        changed = []
        for i in range(max(3, args.runs // 4)):
            victim.write_text(victim.read_text() + f"edit {i}\n")
            changed.append(in_process(module, args.query))
        in_process(module, args.query)
        staged = asyncio.run(stages(args, data)) if args.stage and args.dir is None else None

    print(f"{count} memories ({size:.1f} MiB), query {args.query!r}; median of {args.runs} calls of each")
    print(f"  first memory_recall (builds the index) {first:8.2f} ms")
    print("as processes:")
    for name, value in ms.items():
        print(f"  {name:24} {value:8.2f} ms")
    print(f"  memory_recall / grep -rilF       {ms['memory_recall'] / ms['grep -rilF']:5.2f}x")
    print("inside memory_recall (no interpreter start-up):")
    print(f"  main() in-process, after imports {own:8.2f} ms  (target: under 20 ms)")
    print(f"  the process less python3's start {ms['memory_recall'] - ms['python3 -c pass']:8.2f} ms  (imports too)")
    print(f"  of which the scan's floor        {floor:8.2f} ms  (list the directory, one stat a file)")
    print(f"  main() after one file changed    {median_ms(changed):8.2f} ms  (that file indexed again)")
    if staged:
        print("as execute_code stages (in the sandbox):")
        for name, value in staged.items():
            print(f"  {name:24} {value:8.2f} ms")
        print(f"  memory_recall / grep -rilF       {staged['memory_recall stage'] / staged['grep -rilF stage']:5.2f}x")
    elif args.stage:
        print("(--stage needs the memories in a temporary directory: leave out --dir)")


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]))
