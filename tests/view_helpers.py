"""The harness of the view tests: a server's Sessions and Jobs in this process, whose sessions'
jails mount their views (served here), and stages run in them."""

from __future__ import annotations

import json
import shlex
import threading
from pathlib import Path

import pytest

from ollie.fs import view
from ollie.fs.jobs import Jobs
from ollie.fs.sessions import Session, Sessions


class Harness:
    def __init__(self, root: Path, work: Path, cfg: Path):
        self.root, self.work, self.cfg = root, work, cfg
        self.sessions = Sessions(default_cwd=str(work))
        self.jobs = Jobs(self.sessions)
        self.sessions.view = lambda session, fd: view.serve(self.sessions, self.jobs, session, fd)

    def agent(self, name: str, **extra: object) -> None:
        script = self.cfg / f"{name}.script.json"
        script.write_text(json.dumps({"rules": [{"match": ".", "text": f"{name} says ok"}]}))
        config = {"backend": "scripted", "model": str(script), "prompt": f"You are {name}.", **extra}
        (self.cfg / "agents" / f"{name}.json").write_text(json.dumps(config))

    async def new(self, **spec: str) -> Session:
        return await self.sessions.new({"cwd": str(self.work), **spec})

    async def sh(self, session: Session, code: str) -> tuple[bool, str]:
        """Run `code` as one execute_code stage of `session`: (succeeded, output)."""
        core = await session.wake()
        server = core.dispatcher.get_server("execute")
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, core.call_context())
        return not result.is_error, result.text()

    async def ok(self, session: Session, code: str) -> str:
        succeeded, out = await self.sh(session, code)
        assert succeeded, out
        return out

    async def fails(self, session: Session, code: str) -> str:
        succeeded, out = await self.sh(session, code)
        assert not succeeded, out
        return out


@pytest.fixture
async def h(ollie_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLIE", str(tmp_path / "mnt"))
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    cfg = ollie_dirs / "cfg"
    (cfg / "agents").mkdir(exist_ok=True)
    harness = Harness(tmp_path, work, cfg)
    harness.agent("default")
    try:
        yield harness
    finally:
        await harness.jobs.close()
        await harness.sessions.close()


def views() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ollie-view-")]


async def start_child(h: Harness, parent: Session, spec: str) -> Session:
    before = {s.id for s in h.sessions.all()}
    await h.ok(parent, f"echo {shlex.quote('new ' + spec)} > $OLLIE/ctl")
    (new,) = [s for s in h.sessions.all() if s.id not in before]
    return new
