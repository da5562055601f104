"""The full-screen terminal UI: the conversation above, a status line, the input below.

Three tasks follow the session while the app runs, all on the file interface: one reads
`statewait` (a blocking read: no polling while idle), one reads what `chat` gained (every 50 ms
while a turn runs, and after each of our writes; otherwise when the state changes, or each second
for what others write), and a ticker redraws the spinner. A lost connection is retried each second;
the session is the server's, so a restarted server gives it back and the chat goes on where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Iterable
from typing import Any

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion, get_common_complete_suffix
from prompt_toolkit.data_structures import Point
from prompt_toolkit.document import Document
from prompt_toolkit.filters import has_focus
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import Float, FloatContainer, HSplit, Layout, Window
from prompt_toolkit.layout.controls import FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.menus import CompletionsMenu
from prompt_toolkit.styles import Style
from prompt_toolkit.widgets import TextArea

from .. import config
from ..chatfmt import visible
from . import render
from .client import ChatReader, Connection, Namespace, RemoteError, Unreachable
from .model import Conversation
from .shell import attachment, run_shell

SPINNER = "|/-\\"
BUSY_POLL = 0.05  # seconds between reads of `chat` while a turn runs
IDLE_POLL = 1.0  # ... while idle (what other writers add: a command's output)
AFTER_WRITE = 2.0  # seconds of busy polling after one of our writes (a command's output comes at once)
DOUBLE_CTRL_C = 1.0  # a second Ctrl-C within this many seconds exits

LOCAL_COMMANDS = {
    "sessions": "list the server's sessions",
    "switch": "switch to another session: /switch ID",
    "new": "start a new session (of this agent, backend and model) in the directory ollie was started for",
    "drop": "forget the output of the last !cmd instead of sending it with the next prompt",
    "quit": "leave (the session stays; `ollie` resumes it)",
}


class TuiCompleter(Completer):
    def __init__(self, app: TuiApp):
        self.app = app

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        text = document.text_before_cursor
        if text.startswith("/") and "\n" not in text:
            name, space, arg = text[1:].partition(" ")
            if not space:
                for cmd in sorted(set(self.app.commands) | set(LOCAL_COMMANDS)):
                    if cmd.startswith(name):
                        yield Completion(cmd, -len(name), display_meta=LOCAL_COMMANDS.get(cmd, ""))
                return
            yield from self._words(self.app.choices(name), arg)
            return
        word = text.split()[-1] if text and not text[-1].isspace() else ""
        if word.startswith("@"):
            yield from self._paths(word[1:])

    @staticmethod
    def _words(words: list[str], arg: str) -> Iterable[Completion]:
        for w in words:
            if w.startswith(arg):
                yield Completion(w, -len(arg))

    def _paths(self, partial: str) -> Iterable[Completion]:
        base = self.app.cwd if self.app.ns.is_local or os.path.isdir(self.app.cwd) else ""
        if not base:
            return
        head, _, tail = partial.rpartition("/")
        directory = os.path.join(base, head) if head else base
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return
        for n in names:
            if n.startswith(tail) and (tail.startswith(".") or not n.startswith(".")):
                slash = "/" if os.path.isdir(os.path.join(directory, n)) else ""
                yield Completion(n + slash, -len(tail))


class TuiApp:
    def __init__(self, conn: Connection, ns: Namespace, sid: str, history: History | None = None, home: str = ""):
        self.conn, self.ns, self.sid = conn, ns, sid
        self.home = home  # the directory `ollie` was started for: /new starts a session there
        self.agent = ""  # the session's agent (from cfg): /new starts a session of it
        self.backend = ""  # ... and its backend (from cfg), given to /new's session too
        self.conv = Conversation()
        self.renderer = render.Renderer()
        self.reader = ChatReader(ns, sid)
        self.state, self.state_since = "idle", time.monotonic()
        self.info: dict[str, str] = {}  # from cfg, plus ctx and cost
        self.cwd = ""
        self.commands: list[str] = []
        self.lists: dict[str, list[str]] = {}
        self.expanded = False
        self.top: int | None = None  # the first line shown when scrolled back; None follows the end
        self._anchor_top = True  # the cursor that steers the window's scrolling marks its top line
        self.attached: str | None = None  # a !cmd's output, sent with the next prompt
        self.pending: list[str] = []  # notes shown once the chat so far is read
        self.flash, self.flash_until = "", 0.0
        self.lost = ""  # why the connection is down, while it is
        self._kick = asyncio.Event()
        self._restart = asyncio.Event()
        self._kicked_at = 0.0
        self._ctrl_c_at = 0.0
        self._lines = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._shell: asyncio.Future[tuple[int, str]] | None = None  # a !cmd running

        self.completer = TuiCompleter(self)
        self.input = TextArea(
            multiline=True,
            height=Dimension(min=1, max=8),
            dont_extend_height=True,
            prompt="> ",
            wrap_lines=True,
            history=history or InMemoryHistory(),
            completer=self.completer,
            complete_while_typing=True,
        )
        self.output = Window(
            FormattedTextControl(self._output_fragments, get_cursor_position=self._output_cursor, focusable=False),
            wrap_lines=True,
            always_hide_cursor=True,
        )
        status = Window(FormattedTextControl(self._status_fragments), height=1, style="class:status")
        self.app: Application[None] = Application(
            layout=Layout(
                FloatContainer(
                    HSplit([self.output, status, self.input]),
                    floats=[Float(xcursor=True, ycursor=True, content=CompletionsMenu(max_height=8, scroll_offset=1))],
                ),
                focused_element=self.input,
            ),
            key_bindings=self._bindings(),
            style=Style.from_dict(render.STYLE),
            full_screen=True,
            mouse_support=False,
        )

    # ---- drawing ----------------------------------------------------------------------------------------
    def _output_fragments(self) -> StyleAndTextTuples:
        frags = self.renderer.render(self.conv.view(), self.expanded)
        self._lines = sum(t.count("\n") for _, t in frags)
        return frags  # type: ignore[return-value]

    def _output_cursor(self) -> Point:
        """The window scrolls to keep this (invisible) cursor in view: at the end to follow the
        conversation; scrolled back, at the top line wanted (paging up) or the bottom one (down)."""
        if self.top is None:
            return Point(0, self._lines)
        return Point(0, self.top if self._anchor_top else self.top + self._height() - 1)

    def _status_fragments(self) -> StyleAndTextTuples:
        now = time.monotonic()
        if self.lost:
            return [("class:status.error", f" connection lost ({self.lost}): reconnecting...")]
        if self.state == "idle":
            left = [("class:status", " idle")]
        else:
            spin = SPINNER[int(now * 8) % len(SPINNER)]
            elapsed = now - self.state_since
            secs = f" {elapsed:.0f}s" if elapsed >= 2 else ""
            left = [("class:spinner", f" {spin} "), ("class:status.busy", self.state + secs)]
        model = self.info.get("model", "")
        parts = [model if len(model) <= 30 else "..." + model[-27:]]
        if ctx := self.info.get("ctx"):
            parts.append(f"ctx {ctx}")
        if cost := self.info.get("cost"):
            parts.append(cost)
        if self.attached is not None:
            parts.append("+!output")
        if self.top is not None:
            parts.append(f"line {self.top + 1}/{self._lines} PgDn")
        right = self.flash if now < self.flash_until else self.sid
        text = " | ".join(p for p in parts if p)
        return [*left, ("class:status", f" | {text} | {right} ")]

    def invalidate(self) -> None:
        self.app.invalidate()

    def note(self, text: str, kind: str = "note") -> None:
        self.conv.add_local(kind, visible(text))
        self.top = None
        self.invalidate()

    def say(self, text: str, seconds: float = 2.0) -> None:
        """A short message in the status line."""
        self.flash, self.flash_until = text, time.monotonic() + seconds
        self.invalidate()

    # ---- keys -------------------------------------------------------------------------------------------
    def _bindings(self) -> KeyBindings:
        kb = KeyBindings()
        focus = has_focus(self.input)

        @kb.add("enter", filter=focus)
        def _(event: KeyPressEvent) -> None:
            buf = self.input.buffer
            if buf.complete_state:  # what the menu chose is in the line already
                chosen = buf.complete_state.current_completion is not None
                buf.complete_state = None
                if chosen and not buf.text.lstrip().startswith("/"):
                    return  # a file named mid-prompt: the prompt goes on; a /command runs at once
            text = buf.text
            if not text.strip():
                return
            buf.reset(append_to_history=True)
            self.top = None  # what is sent, and its answer, are at the end: follow it again
            self.spawn(self.submit(text))

        @kb.add("tab", filter=focus)
        def _(event: KeyPressEvent) -> None:
            self.tab(self.input.buffer)

        @kb.add("c-j", filter=focus)
        @kb.add("escape", "enter", filter=focus)
        def _(event: KeyPressEvent) -> None:
            self.input.buffer.insert_text("\n")

        @kb.add("c-c")
        def _(event: KeyPressEvent) -> None:
            self.ctrl_c()

        @kb.add("c-d", filter=focus)
        def _(event: KeyPressEvent) -> None:
            if not self.input.buffer.text:
                event.app.exit()
            else:
                self.input.buffer.delete()

        kb.add("pageup")(lambda event: self.page(-1))
        kb.add("pagedown")(lambda event: self.page(1))

        @kb.add("c-o")
        def _(event: KeyPressEvent) -> None:
            self.expanded = not self.expanded

        return kb

    def tab(self, buf: Buffer) -> None:
        """The menu's next entry when it is open; else what is typed completed now (prompt_toolkit's
        own Tab asks for completions in the background, and loses its insertion when the ones for
        the last key typed are still to come: keys typed ahead, or over ssh, arrive together)."""
        if buf.complete_state and buf.complete_state.completions:
            buf.complete_next()
            return
        completions = list(self.completer.get_completions(buf.document, CompleteEvent(completion_requested=True)))
        if len(completions) == 1:
            buf.apply_completion(completions[0])
        elif completions:
            buf.insert_text(get_common_complete_suffix(buf.document, completions))
            buf.start_completion()

    def ctrl_c(self) -> None:
        """Interrupt the turn; clear the input when idle; a second one within a second leaves."""
        now = time.monotonic()
        if now - self._ctrl_c_at < DOUBLE_CTRL_C:
            self.app.exit()
            return
        self._ctrl_c_at = now
        if self._shell is not None:  # the user's own !cmd, which the session knows nothing of
            self._shell.cancel()
            self.say("interrupted (Ctrl-C again to leave)")
        elif self.state != "idle":
            self.spawn(self.interrupt())
            self.say("interrupting (Ctrl-C again to leave)")
        elif self.input.buffer.text:
            self.input.buffer.reset()
        else:
            self.say("Ctrl-C again to leave (the session stays)")

    def page(self, direction: int) -> None:
        """Scroll a page back (-1) or on (1); on past the end follows the conversation again."""
        if direction < 0:
            top = self._lines - self._height() if self.top is None else self.top
            self.top, self._anchor_top = max(top - self._page(), 0), True
        elif self.top is not None:
            self.top, self._anchor_top = self.top + self._page(), False
            if self.top + self._height() >= self._lines:
                self.top = None

    def _height(self) -> int:
        info = self.output.render_info
        return info.window_height if info else 20

    def _page(self) -> int:
        return max(self._height() - 2, 1)

    # ---- acting -----------------------------------------------------------------------------------------
    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            self.note(f"{type(e).__name__}: {e}", "error")

    def kick(self) -> None:
        """Read `chat` often for a while: one of our writes is being acted on."""
        self._kicked_at = time.monotonic()
        self._kick.set()

    async def write(self, name: str, text: str) -> bool:
        try:
            await self.ns.write(f"s/{self.sid}/{name}", text)
        except (RemoteError, OSError) as e:
            self.note(f"{name}: {e}", "error")  # the server puts refusals in the chat too
            return False
        finally:
            self.kick()
        return True

    async def interrupt(self) -> None:
        await self.write("ctl", "stop\n")

    async def submit(self, text: str) -> None:
        stripped = text.strip()
        if stripped.startswith("!"):
            await self.shell(stripped[1:].strip())
            return
        if stripped.startswith("/"):
            name, _, arg = stripped[1:].partition(" ")
            if name in LOCAL_COMMANDS:
                await self.local_command(name, arg.strip())
                return
            if name == "help":
                self.note("\n".join(f"/{n:<8} {h}" for n, h in LOCAL_COMMANDS.items()))
            await self.write("prompt", stripped)
            return
        if self.attached is not None:
            text = f"{self.attached}\n\n{text}"
            self.attached = None
        busy = self.state != "idle"
        if await self.write("prompt", text) and busy:
            self.say("queued: it runs after this turn", 4)

    async def shell(self, cmd: str) -> None:
        if not cmd:
            self.note("give a command: !ls", "error")
            return
        if not os.path.isdir(self.cwd):
            self.note(f"!cmd runs here, but the session's directory {self.cwd} is not on this machine", "error")
            return
        env = await self._session_env()
        block = self.conv.add_local("shell", "(running)", head=cmd)
        self.invalidate()
        self._shell = asyncio.ensure_future(run_shell(cmd, self.cwd, env))
        try:
            code, out = await self._shell
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # we are cancelled (leaving), not only the command
                raise
            code, out = 130, "(interrupted)"
        finally:
            self._shell = None
        block.lines = visible(out).split("\n") if out else []
        if code:
            block.lines.append(f"(exit status {code})")
        self.attached = attachment(cmd, code, out)
        self.conv.version += 1
        self.say("the output goes with your next prompt (/drop to keep it back)", 4)

    async def _session_env(self) -> dict[str, str]:
        env = dict(os.environ)
        with contextlib.suppress(RemoteError):
            for line in (await self.ns.read(f"s/{self.sid}/env")).splitlines():
                key, sep, value = line.partition("=")
                if sep and key:
                    env[key] = value
        return env

    async def local_command(self, name: str, arg: str) -> None:
        if name == "quit":
            self.app.exit()
        elif name == "drop":
            self.say("dropped" if self.attached is not None else "nothing to drop")
            self.attached = None
        elif name == "sessions":
            lines = [
                f"{'*' if s.id == self.sid else ' '} {s.id}  {s.state:<9} {s.cwd}" for s in await self.ns.sessions()
            ]
            self.note("\n".join(lines) or "(no sessions)")
        elif name == "switch":
            await self.switch(arg)
        elif name == "new":
            await self.new_session()

    async def new_session(self) -> None:
        """A session like this one: its agent, backend and model (a `/backend` or `/model` given
        here, or `--backend` and `--model` at the start, carry over), in the directory `ollie` was
        started for."""
        model = self.info.get("model") if self.backend else None  # a model means nothing without its backend
        spec = {"cwd": self.home or self.cwd, "agent": self.agent, "backend": self.backend, "model": model}
        try:
            sid = await self.ns.new_session(**spec)
        except RemoteError as e:  # the model or backend went away since: this session stays
            self.note(f"/new: {e.message}", "error")
            return
        await self.switch(sid)

    async def switch(self, sid: str) -> None:
        if not sid or not await self.ns.exists(f"s/{sid}"):
            self.note(f"no session {sid!r} (see /sessions)", "error")
            return
        self.sid = sid
        self.conv = Conversation()
        self.renderer = render.Renderer()  # its cache is by block number, which starts again
        self.reader = ChatReader(self.ns, sid)
        self.attached = None
        self._restart.set()

    # ---- following the session --------------------------------------------------------------------------
    async def refresh_info(self) -> None:
        """Model, cwd, context and cost, from `cfg`, `ctxsz` and `cost`."""
        cfg = dict(line.partition("=")[::2] for line in (await self.ns.read(f"s/{self.sid}/cfg")).splitlines())
        self.cwd = cfg.get("cwd", self.cwd)
        self.agent = cfg.get("agent", self.agent)
        self.backend = cfg.get("backend", self.backend)
        self.info["model"] = cfg.get("model", "")
        ctx = await self.ns.read(f"s/{self.sid}/ctxsz")
        if "(" in ctx:
            self.info["ctx"] = ctx[ctx.rfind("(") + 1 :].split(")")[0]
        for line in (await self.ns.read(f"s/{self.sid}/cost")).splitlines():
            if line.startswith("costSession="):
                self.info["cost"] = line.partition("=")[2].rstrip("0").rstrip(".") or "$0"
        self.invalidate()

    async def load_lists(self) -> None:
        """What completion offers: the commands `ctl` lists, agents, backends, sessions."""
        text = await self.ns.read(f"s/{self.sid}/ctl")
        self.commands = [w.strip() for w in text.replace("\n", ",").split(",") if w.strip()]
        self.lists["agent"] = [n.removesuffix(".json") for n in await self.ns.names("a") if n.endswith(".json")]
        self.lists["backend"] = [ln.strip(" *") for ln in (await self.ns.read("backends")).splitlines() if ln.strip()]
        self.lists["switch"] = [s.id for s in await self.ns.sessions()]

    def choices(self, command: str) -> list[str]:
        if command == "model" and "model" not in self.lists:
            self.lists["model"] = []
            self.spawn(self._load_models())
        return self.lists.get(command, [])

    async def _load_models(self) -> None:
        with contextlib.suppress(RemoteError):
            self.lists["model"] = (await self.ns.read(f"s/{self.sid}/models")).split()

    async def _watch_state(self) -> None:
        async for state in self.ns.wait_state(self.sid):
            if state != self.state:
                self.state, self.state_since = state, time.monotonic()
                self._kick.set()
                if state == "idle":
                    await self.refresh_info()
                self.invalidate()

    async def _follow_chat(self) -> None:
        reader, conv = self.reader, self.conv  # a read that ends after a /switch is not the new session's
        while True:
            text = await reader.read_new()
            if text:
                conv.feed(text)
                self.invalidate()
                continue
            while self.pending:  # notes for the start, below the conversation so far
                self.note(self.pending.pop(0))
            busy = self.state != "idle" or time.monotonic() - self._kicked_at < AFTER_WRITE
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), BUSY_POLL if busy else IDLE_POLL)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.125 if self.state != "idle" or self.lost else 0.5)
            self.invalidate()

    async def _follow(self) -> None:
        """Follow the session; reconnect when the connection is lost; start over on a switch."""
        while True:
            self._restart = asyncio.Event()
            await self.refresh_info()
            with contextlib.suppress(RemoteError):
                await self.load_lists()
            tasks = [asyncio.ensure_future(c) for c in (self._watch_state(), self._follow_chat())]
            lost = asyncio.ensure_future(self.ns.wait_lost())
            restart = asyncio.ensure_future(self._restart.wait())
            done, _ = await asyncio.wait([*tasks, lost, restart], return_when=asyncio.FIRST_COMPLETED)
            for t in [*tasks, lost, restart]:
                t.cancel()
            await asyncio.gather(*tasks, lost, restart, return_exceptions=True)
            if restart in done:
                continue
            failed = [t.exception() for t in tasks if t in done and not t.cancelled()]
            if failed and failed[0] is not None and not isinstance(failed[0], RemoteError | OSError):
                raise failed[0]
            await self._reconnect(str(failed[0]) if failed and failed[0] else "server gone")

    async def _reconnect(self, why: str) -> None:
        self.lost = why
        self.invalidate()
        with contextlib.suppress(Exception):
            await self.ns.close()
        while True:
            await asyncio.sleep(1.0)
            try:
                ns = await self.conn.connect(start=False)
            except (Unreachable, RemoteError, OSError):
                continue
            if await ns.exists(f"s/{self.sid}"):
                break
            await ns.close()
        self.ns, self.lost = ns, ""
        self.reader.ns = ns
        self.invalidate()

    async def run(self) -> None:
        follow = asyncio.ensure_future(self._follow())
        tick = asyncio.ensure_future(self._tick())
        follow.add_done_callback(lambda t: None if t.cancelled() or not t.exception() else self.app.exit())
        try:
            await self.app.run_async()
        finally:
            for t in (follow, tick, *self._tasks):
                t.cancel()
            await asyncio.gather(follow, tick, *self._tasks, return_exceptions=True)
        if follow.done() and not follow.cancelled() and follow.exception():
            raise follow.exception()  # type: ignore[misc]


def history_for(cwd: str) -> History:
    """The input history of this directory, kept under $OLLIE_DATA_PATH/tui-history."""

    try:
        d = config.private_dir(config.data_path() / "tui-history")
    except (OSError, Exception):
        return InMemoryHistory()
    return FileHistory(str(d / hashlib.sha256(cwd.encode()).hexdigest()[:20]))
