"""The web page's cost and latency, in one run (issue 27), each against a baseline of the same run:

1. from the model's first token to its appearance in the page (a session's page, open in a real
   headless Chromium), against the same for the terminal UI (`ollie` in a tmux pane, its screen
   read with capture-pane every ~2 ms: its figures include up to that much polling delay). The
   model is a fake Ollama server streaming at a model's pace (6 characters each 20 ms); the first
   token is a marker unique to the round, and its time is taken just before the server writes it.
   The page's time is taken in the page (a MutationObserver on the chat, performance.now() on the
   same clock);
2. the server's CPU while idle with 1,000 sessions listed and 10 pages open (10 tabs of the
   sessions' table, each showing the 1,000 rows and holding its WebSocket open), against the
   same server idle with no page open; and how long a tab takes to show the 1,000 rows.

    .venv/bin/python bench/web.py [-n 20] [--sessions 1000] [--pages 10] [--idle 30]

Needs Debian's chromium and chromium-driver, selenium, and tmux (./setup.sh --test).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fs_helpers import FsServer  # noqa: E402
from tui_helpers import Tmux  # noqa: E402
from wire import Reply, WireServer  # noqa: E402
from wire import ollama as ow  # noqa: E402

PIECE, PACE = 6, 0.02
print = functools.partial(print, flush=True)  # noqa: A001 (its lines as they come, even to a file)
SENT: dict[str, float] = {}  # marker -> when the fake model wrote it (time.time())
_lock = threading.Lock()
_count = iter(range(1_000_000))


class Timed:
    """A streamed body whose first piece's send time is recorded (the pacing done here, so the
    time is taken after the wait and right before the write)."""

    def __init__(self, pieces: list[bytes], marker: str):
        self.pieces, self.marker = pieces, marker

    def __iter__(self):
        for j, piece in enumerate(self.pieces):
            time.sleep(PACE)
            if j == 0:
                SENT[self.marker] = time.time()
            yield piece


def paced_model(server: WireServer) -> None:
    def chat(req: object) -> Reply:
        with _lock:
            i = next(_count)
        marker = f"MK{i:04d}"
        text = f"{marker} and then an answer of a few words, streamed at a model's pace, **bold** and `code`."
        lines = [ow.chat_line(content=text[j : j + PIECE]) for j in range(0, len(text), PIECE)]
        reply = ow.chat([*lines, ow.done_line()])
        reply.chunks = Timed(reply.chunks, marker)  # type: ignore[assignment]
        return reply

    server.route(ow.TAGS, lambda req: ow.tags(["paced"]))
    server.route(ow.SHOW, lambda req: ow.show(32768))
    server.route(ow.CHAT, chat)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-proxy-server"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


OBSERVE = """
window.__seen = {};
const chat = document.getElementById('chat');
new MutationObserver(() => {
  const t = chat.lastChild ? chat.lastChild.textContent : '';
  const m = /MK\\d{4}/.exec(t);
  if (m && !window.__seen[m[0]]) window.__seen[m[0]] = performance.timeOrigin + performance.now();
}).observe(chat, {childList: true, subtree: true, characterData: true});
"""


def wait(check, timeout: float = 30, what: str = ""):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.005)
    return value


def page_times(srv: FsServer, driver, base: str, n: int) -> list[float]:
    sid = srv.new_session(agent="paced")
    driver.get(f"{base}#/s/{sid}")
    wait(lambda: driver.find_element("id", "state").text == "idle", what="the session page")
    driver.execute_script(OBSERVE)
    times = []
    for i in range(n):
        (srv.mnt / "s" / sid / "prompt").write_text(f"round {i}")
        done = {m for m, _ in times}

        def fresh(done=done):
            return [e for e in driver.execute_script("return Object.entries(window.__seen)") if e[0] not in done]

        seen = wait(fresh, what=f"round {i} in the page")
        marker, at = seen[0]
        times.append((marker, at / 1000 - SENT[marker]))
        srv.wait_idle(sid, timeout=30)
    return [t for _, t in times]


def tui_times(srv: FsServer, root: Path, n: int) -> list[float]:
    t = Tmux(root, srv.env, width=100, height=30)
    times = []
    try:
        t.ollie("--new", "--agent", "paced", cwd=srv.work)
        t.wait_for(" idle ", timeout=30)
        for i in range(n):
            t.type(f"round {i}")
            t.keys("Enter")
            start = time.monotonic()
            while True:
                screen = t.screen()
                found = [m for m in SENT if m in screen and m not in {x for x, _ in times}]
                if found:
                    times.append((found[0], time.time() - SENT[found[0]]))
                    break
                if time.monotonic() - start > 30:
                    raise SystemExit(f"round {i}: nothing on the TUI's screen:\n{screen}")
            t.wait_for(" idle ", timeout=30)
    finally:
        t.close()
    return [x for _, x in times]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def stored_sessions(srv: FsServer, n: int) -> None:
    """`n` sessions on disk, as a server left them: the next server restores them, asleep."""
    from ollie.agent.session import SessionMeta, new_session_id

    root = srv.data / "sessions"
    for i in range(n):
        sid = new_session_id()
        d = root / sid
        d.mkdir(parents=True)
        meta = SessionMeta(id=sid, agent="default", backend="scripted", model="x", cwd=str(srv.work))
        meta.first_prompt = f"prompt {i}"
        (d / "meta.json").write_text(json.dumps(asdict(meta)))
        (d / "chat").write_text(f"user: prompt {i}\nassistant: answer {i}\n\n")


def show(name: str, values: list[float], unit: str = "ms", scale: float = 1000) -> float:
    xs = sorted(v * scale for v in values)
    p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
    med = statistics.median(xs)
    print(
        f"{name:<44} median {med:8.2f} {unit}   min {xs[0]:8.2f}   p90 {p90:8.2f}   max {xs[-1]:8.2f}   (n={len(xs)})"
    )
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20, help="rounds of first token -> screen, for each frontend")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--pages", type=int, default=10)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of each idle CPU measure")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ollie-bench-web-") as tmp, WireServer() as model:
        root = Path(tmp)
        paced_model(model)
        srv = FsServer(root / "srv")
        srv.env["OLLIE_OLLAMA_URL"] = model.url
        (srv.cfg / "agents" / "paced.json").write_text(json.dumps({"backend": "ollama", "model": "paced"}))
        stored_sessions(srv, args.sessions)
        out = srv.ollie("srv", "start", "--web", "127.0.0.1:0", check=False, timeout=120)
        if out.returncode:
            raise SystemExit(out.stderr + srv.log())
        url = (srv.root / "ns" / "ollie.web").read_text().strip()
        base = url.split("?")[0]
        driver = browser()
        try:
            driver.get(url)
            print(f"1. first token -> visible ({args.n} rounds each; a paced fake Ollama model)")
            web = show("   web page (pushed over a WebSocket)", page_times(srv, driver, base, args.n))
            tui = show("   terminal UI (tmux, as bench/tui.py)", tui_times(srv, root, args.n))
            print(f"   ratio web / TUI: {web / tui:.2f}x", flush=True)

            print(f"2. idle server, {args.sessions} sessions listed")
            pid = srv.pid()
            time.sleep(2)
            base_cpu = idle_cpu(pid, args.idle)
            print(f"   no page open:        {base_cpu * 100:6.3f} % of a core over {args.idle:.0f} s")
            shown = []
            for k in range(args.pages):
                if k:
                    driver.switch_to.new_window("tab")
                start = time.perf_counter()
                driver.get(f"{base}#/")
                wait(
                    lambda: len(driver.find_elements("css selector", "#sessions tbody tr")) >= args.sessions,
                    timeout=60,
                    what="the table's rows",
                )
                shown.append(time.perf_counter() - start)
            show(f"   a tab showing the {args.sessions} rows (load to last row)", shown)
            time.sleep(2)
            pages_cpu = idle_cpu(pid, args.idle)
            print(f"   {args.pages} pages open:        {pages_cpu * 100:6.3f} % of a core over {args.idle:.0f} s")
            diff = (pages_cpu - base_cpu) * args.idle
            print(
                f"   what the {args.pages} open pages cost: {diff * 1000:.1f} ms of CPU in {args.idle:.0f} s "
                f"(ratio to no page: {pages_cpu / base_cpu if base_cpu else float('inf'):.2f}x)"
            )
        finally:
            driver.quit()
            srv.stop()


if __name__ == "__main__":
    main()
