"""A real file server for tests: `ollie srv start` on a temporary mount, with temporary ollie
directories and HOME (so `~/mnt/ollie` in the seed's scripts is this mount), scripted agents, and a
teardown that always unmounts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OLLIE = [sys.executable, "-c", "import sys; from ollie.cli import main; sys.exit(main())"]


class FsServer:
    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.mnt = self.home / "mnt" / "ollie"
        self.cfg = root / "cfg"
        self.data = root / "data"
        self.work = root / "work"
        for d in (self.home, self.cfg / "agents", self.cfg / "tools", self.data, self.work, root / "ns"):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLIE", "OPENAI", "ANTHROPIC"))}
        self.env.update(
            HOME=str(self.home),
            OLLIE=str(self.mnt),
            OLLIE_CFG_PATH=str(self.cfg),
            OLLIE_DATA_PATH=str(self.data),
            OLLIE_TMP_PATH=str(root / "tmp"),
            OLLIE_TOOLS_PATH=str(self.cfg / "tools"),
            NAMESPACE=str(root / "ns"),
            PYTHONPATH=str(ROOT / "src"),
        )
        self.agent("default", [{"match": ".", "text": "ok"}])

    def agent(self, name: str, rules: list[dict] | None = None, turns: list[dict] | None = None, **extra) -> None:
        """An agent config whose scripted backend answers by `rules` ({"match": regex, "text": …}),
        or plays `turns` in order (each session of the agent from the first)."""
        script = self.cfg / f"{name}.script.json"
        script.write_text(json.dumps({"rules": rules} if rules is not None else turns))
        cfg = {"backend": "scripted", "model": str(script), "prompt": f"You are the {name}.\n", **extra}
        (self.cfg / "agents" / f"{name}.json").write_text(json.dumps(cfg))

    def ollie(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*OLLIE, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def start(self) -> None:
        out = self.ollie("srv", "start", check=False)
        assert out.returncode == 0, out.stderr + self.log()
        assert os.path.ismount(self.mnt)

    def stop(self) -> None:
        self.ollie("srv", "stop", check=False)
        self.unmount()

    def pid(self) -> int:
        return int((self.root / "ns" / "ollie.pid").read_text().split()[0])

    def kill9(self) -> None:
        """Kill the server the hard way: no clean-up runs (the mount is left broken)."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.02)
        self.unmount()

    def unmount(self) -> None:
        """Unmount whatever state the server is in; a hung connection is aborted first (fusectl)."""
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] == str(self.mnt):
                abort = Path(f"/sys/fs/fuse/connections/{fields[2].split(':')[1]}/abort")
                if abort.exists():
                    abort.write_text("1")
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)

    def log(self) -> str:
        try:
            return (self.root / "ns" / "ollie.log").read_text()
        except FileNotFoundError:
            return ""

    def sh(self, script: str, check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        """Run a shell script in the mount's root."""
        out = subprocess.run(
            ["sh", "-c", script], cwd=self.mnt, env=self.env, capture_output=True, text=True, timeout=timeout, **kw
        )
        if check and out.returncode != 0:
            raise AssertionError(f"sh exit {out.returncode}: {out.stderr}\n{script}")
        return out

    def new_session(self, **spec: str) -> str:
        """Create a session through the root ctl and return its id (read back on the same open file)."""
        spec.setdefault("cwd", str(self.work))
        with open(self.mnt / "ctl", "r+") as f:
            f.write("new " + " ".join(f"{k}={v}" for k, v in spec.items()) + "\n")
            f.flush()
            f.seek(0)
            return f.read().strip()

    def wait_idle(self, sid: str, timeout: float = 10) -> None:
        state = self.mnt / "s" / sid / "state"
        deadline = time.monotonic() + timeout
        while state.read_text().strip() != "idle":
            assert time.monotonic() < deadline, f"session {sid} still {state.read_text()!r}"
            (self.mnt / "s" / sid / "statewait").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def fs_server(tmp_path_factory):
    srv = FsServer(tmp_path_factory.mktemp("fs"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
