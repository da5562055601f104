"""The terminal frontend's latency, in one run:

1. from Enter to the first streamed characters of the answer on the screen, against `ollie run` on
   the same script (from starting the command to the answer's first characters on its stdout: what
   a user of `ollie run` waits for each prompt);
2. key to echo: from a key typed to its character in the input line, while a turn streams a long
   answer into the conversation, against the same while idle (the ratio is the figure). The
   scripted backend streams a whole answer at once, so these turns come from a fake Ollama server
   that streams at a model's pace (6 characters each 20 ms), markdown and all;
3. the first frame: from starting `ollie` (the server running) to its first full frame on the
   screen, the status line and the input line drawn (bench/startup.py prints it too, against
   `python -c pass`).

    .venv/bin/python bench/tui.py [-n 20] [--echo 100] [--frames 10]

The TUI runs in a tmux pane (its screen read with capture-pane, every ~2 ms: the figures include
up to that much polling delay, the same for both sides of a ratio) against `ollie srv` on a
temporary mount, with a scripted agent whose answers stream in small chunks; the first chunk is a
marker unique to the round. An echo counts as "while streaming" only when the status line still
shows the turn running on the screen that shows the echo.
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

from startup import bytecode_as_installed  # noqa: E402

from fs_helpers import OLLIE, FsServer  # noqa: E402
from tui_helpers import Tmux  # noqa: E402
from wire import Reply, WireServer  # noqa: E402
from wire import ollama as ow  # noqa: E402


def marker(i: int) -> str:
    return f"Q{i:03d}"


def turns(n: int) -> list[dict]:
    return [{"text": f"{marker(i)} is the answer, streamed in pieces.", "chunk": 4} for i in range(n)]


LETTERS = "abcdefghijklmnopqrstuvwxyz"
LONG_LINES = 60  # lines of a streamed answer during which keys are typed
PIECE, PACE = 6, 0.02  # it streams in pieces of 6 characters, one each 20 ms (~75 tokens/s)


def paced_model(server: WireServer) -> None:
    """An Ollama server whose answers stream at a model's pace (the scripted backend streams all
    at once): answer i starts with S<i> and ends with E<i>."""
    count = iter(range(1_000_000))

    def chat(req: object) -> Reply:
        i = next(count)
        body = "".join(f"line {k} of a long answer, with `code` and **bold** in it\n" for k in range(LONG_LINES))
        text = f"S{i:03d} {body}E{i:03d}"
        lines = [ow.chat_line(content=text[j : j + PIECE]) for j in range(0, len(text), PIECE)]
        return ow.chat([*lines, ow.done_line()], delay=PACE)

    server.route(ow.TAGS, lambda req: ow.tags(["paced"]))
    server.route(ow.SHOW, lambda req: ow.show(32768))
    server.route(ow.CHAT, chat)


def tui_times(t: Tmux, n: int) -> list[float]:
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


def echo(t: Tmux, typed: str) -> tuple[float, str]:
    """Type one more character; (seconds until the input line shows it, the screen then)."""
    char = LETTERS[len(typed) % 26]
    start = time.perf_counter()
    t.type(char)
    while True:
        screen = t.screen()
        if t.row(-1, screen).rstrip().endswith(typed + char):
            return time.perf_counter() - start, screen
        if time.perf_counter() - start > 10:
            raise SystemExit(f"the key {char!r} never showed:\n{screen}")


def clear_input(t: Tmux) -> None:
    t.keys("C-u")
    while t.row(-1).strip() != ">":
        time.sleep(0.01)


def echo_times(t: Tmux, samples: int, rounds: int) -> tuple[list[float], list[float]]:
    """Key-to-echo times: `samples` while idle, then as many while the long turns stream."""
    idle: list[float] = []
    typed = ""
    while len(idle) < samples:
        seconds, _ = echo(t, typed)
        typed += LETTERS[len(typed) % 26]
        idle.append(seconds)
        if len(typed) >= 40:
            clear_input(t)
            typed = ""
        time.sleep(0.02)
    clear_input(t)
    busy: list[float] = []
    for i in range(rounds):
        if len(busy) >= samples:
            break
        t.type(f"long {i}")
        t.keys("Enter")
        t.wait_for(f"S{i:03d}", timeout=30)  # the answer streams
        typed = ""
        while len(busy) < samples:
            seconds, screen = echo(t, typed)
            typed += LETTERS[len(typed) % 26]
            if t.row(-2, screen).startswith(" idle"):
                break  # the turn had ended: this one does not count
            busy.append(seconds)
            if len(typed) >= 40:
                clear_input(t)
                typed = ""
        t.wait_for(" idle ", timeout=60)
        clear_input(t)
    return idle, busy


def first_frame_times(srv: FsServer, root: Path, n: int) -> list[float]:
    """Seconds from starting `ollie --new` to its first full frame: a shell in the pane waits for
    Enter and then execs ollie, so that starting tmux is not counted (sending the key is, ~2 ms).
    One start more than `n`, the first, untimed, may write the bytecode."""
    times = []
    for _ in range(n + 1):
        t = Tmux(root, srv.env, width=100, height=30)
        try:
            t.start(["sh", "-c", 'read go && exec "$@"', "sh", *OLLIE, "--new", "--agent", "bench"], srv.work)
            time.sleep(0.2)  # the shell is at its `read`
            start = time.perf_counter()
            t.keys("Enter")
            while not (t.row(-2, screen := t.screen()).startswith(" idle") and t.row(-1, screen).strip() == ">"):
                if time.perf_counter() - start > 30:
                    raise SystemExit(f"no first frame:\n{screen}")
            times.append(time.perf_counter() - start)
        finally:
            t.close()
    return times[1:]


def first_frames(n: int) -> list[float]:
    """`first_frame_times` against a server of its own, for bench/startup.py."""
    with tempfile.TemporaryDirectory(prefix="ollie-bench-frame-") as tmp:
        srv = FsServer(Path(tmp) / "srv")
        srv.agent("bench", turns=turns(1))
        srv.start()
        try:
            return first_frame_times(srv, Path(tmp), n)
        finally:
            srv.stop()


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


def show(name: str, times: list[float]) -> float:
    ms = sorted(t * 1000 for t in times)
    if not ms:
        print(f"{name:<38} no samples")
        return float("nan")
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    print(
        f"{name:<38} median {statistics.median(ms):7.1f} ms   min {ms[0]:7.1f}   p90 {p90:7.1f}"
        f"   max {ms[-1]:7.1f}   (n={len(ms)})"
    )
    return statistics.median(ms)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20, help="rounds of Enter -> first characters")
    ap.add_argument("--echo", type=int, default=100, help="key-to-echo samples, idle and while streaming each")
    ap.add_argument("--frames", type=int, default=10, help="starts of `ollie` to its first full frame")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-tui-") as tmp, WireServer() as model:
        root = Path(tmp)
        bytecode_as_installed(root / "pycache")
        paced_model(model)
        srv = FsServer(root / "srv")
        srv.env["OLLIE_OLLAMA_URL"] = model.url
        srv.agent("bench", turns=turns(args.n))
        (srv.cfg / "agents" / "paced.json").write_text(json.dumps({"backend": "ollama", "model": "paced"}))
        srv.start()
        t = Tmux(root, srv.env, width=100, height=30)
        try:
            t.ollie("--agent", "bench", cwd=srv.work)
            t.wait_for(" idle ", timeout=30)
            tui = tui_times(t, args.n)
            t.close()
            t.ollie("--new", "--agent", "paced", cwd=srv.work)
            t.wait_for(" idle ", timeout=30)
            idle, busy = echo_times(t, args.echo, rounds=20)
            t.close()
            run = run_times(srv, root / "one.json", args.n)
            frames = first_frame_times(srv, root, args.frames)
        finally:
            t.close()
            srv.stop()
    a = show("ollie (TUI): Enter -> first chars", tui)
    b = show("ollie run: start -> first chars", run)
    print(f"{'':<38} TUI - run: {a - b:+.1f} ms (target: within 20 ms)")
    i = show("key -> echo, idle", idle)
    s = show("key -> echo, while a turn streams", busy)
    print(f"{'':<38} streaming / idle: {s / i:.2f}x")
    show("ollie (TUI): start -> first frame", frames)


if __name__ == "__main__":
    main()
