"""The terminal frontend under test: `ollie` running in a tmux pane of a private tmux server,
driven with send-keys and read with capture-pane."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from fs_helpers import OLLIE


class Tmux:
    """A tmux server of its own (its socket in a temporary directory), one window running a
    command; `close` kills the server and everything in it."""

    def __init__(self, root: Path, env: dict[str, str], width: int = 100, height: int = 30):
        self.socket = str(root / "tmux.sock")
        self.env = {**env, "TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        self.width, self.height = width, height
        self.started = False

    def tmux(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["tmux", "-S", self.socket, *args], env=self.env, capture_output=True, text=True, timeout=10
        )
        if check and out.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {out.stderr}")
        return out.stdout

    def start(self, argv: list[str], cwd: Path) -> None:
        """Run `argv` in the pane; the pane stays after it exits (so its last words can be read)."""
        cmd = " ".join(shlex.quote(a) for a in argv)
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", str(self.width), "-y", str(self.height),
                  "-c", str(cwd), "-s", "t", f"{cmd}; echo '[exited '$?']'; sleep 600")  # fmt: skip
        self.started = True
        self.tmux("set-option", "-g", "remain-on-exit", "on", check=False)

    def ollie(self, *args: str, cwd: Path) -> None:
        self.start([*OLLIE, *args], cwd)

    def keys(self, *keys: str) -> None:
        """tmux key names (Enter, C-c, C-j, M-Enter) and literal text, sent in order."""
        for k in keys:
            self.tmux("send-keys", "-t", "t", k)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "t", "-l", text)

    def paste(self, text: str) -> None:
        """Paste `text` the way a terminal does with bracketed paste (when the app asked for it)."""
        self.tmux("set-buffer", "--", text)
        self.tmux("paste-buffer", "-p", "-t", "t")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def row(self, n: int, screen: str | None = None) -> str:
        """Row `n` of the screen (negative: from the bottom; -1 is the UI's input line)."""
        rows = (self.screen() if screen is None else screen).split("\n")[: self.height]
        rows += [""] * (self.height - len(rows))
        return rows[n]

    def wait_for(self, text: str, timeout: float = 15, gone: bool = False) -> str:
        """The screen once `text` is on it (or, with `gone`, once it is not)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if (text in screen) != gone:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{'still' if gone else 'never'} saw {text!r} on the screen:\n{screen}")
            time.sleep(0.05)

    def close(self) -> None:
        if self.started:
            self.tmux("kill-server", check=False)
            self.started = False
            deadline = time.monotonic() + 5  # the server is gone when its socket is: a new one may start
            while Path(self.socket).exists() and time.monotonic() < deadline:
                time.sleep(0.02)
