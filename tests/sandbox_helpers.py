"""Fixtures and helpers of the sandbox tests: a fake $HOME with secrets, and a call runner."""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ollie.tools import CallContext, execute

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- s3cr3t"
API_KEY = "sk-test-0123456789-do-not-leak"
POLICIES = ("default", "unix", "wide", "net", "open", "bad", "small")  # the policies the tests write


def _may_take_a_childs_descriptor() -> bool:
    """What the native init's probe asks of the kernel before it supervises connect(2)
    (`probe_supervision` in jailinit.c): may a process take a descriptor of its child's
    (pidfd_getfd)? Yama's ptrace_scope 3 forbids it (2 as well, asked out here, where the init
    holds no capability: the tests that need it then skip)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        os.read(read, 1)  # until the parent has looked
        os._exit(0)
    try:
        pidfd = os.pidfd_open(pid)
        taken = ctypes.CDLL(None, use_errno=True).syscall(438, pidfd, read, 0)  # pidfd_getfd, every arch's 438
        os.close(pidfd)
        if taken >= 0:
            os.close(taken)
        return taken >= 0
    except OSError:
        return False
    finally:
        os.close(read)
        os.close(write)
        os.waitpid(pid, 0)


# The jails' PID 1 is the native init (jailinit.c), which supervises connect(2): programs of a jail
# may then make Unix sockets. With OLLIE_JAIL_INIT=python (.ci/run's second pass), without a C
# compiler to build the init, or where the kernel lets no process take its child's descriptors,
# they may not.
UNIX_SOCKETS = (
    os.environ.get("OLLIE_JAIL_INIT", "native") != "python"
    and bool(shutil.which("cc", path="/usr/bin:/bin"))
    and _may_take_a_childs_descriptor()
)
NO_UNIX_SOCKETS = "a jail's programs make no Unix socket here: its PID 1 stays Python, or no pidfd_getfd"


@pytest.fixture
def home(ollie_dirs, monkeypatch):
    """A fake $HOME holding an SSH key and the ollie env file (API keys); like a real home, not
    under /tmp (which a jail hides whole)."""
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ollie-test-home-"))
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    cfg = home / ".config" / "ollie"
    (cfg / "tools").mkdir(parents=True)
    (cfg / "env").write_text(f"OPENAI_API_KEY={API_KEY}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLIE_CFG_PATH", str(cfg))
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(cfg / "tools"))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    yield home
    shutil.rmtree(home)


@pytest.fixture
async def run(home, tmp_path):
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=str(tmpdir), policies=POLICIES)

    async def call(code: str, language: str = "bash", **extra):
        arguments = {"steps": [{"code": code, "language": language}], **extra}
        return await server.call_tool("execute_code", arguments, ctx)

    call.server, call.ctx = server, ctx  # type: ignore[attr-defined]  (for calls of another shape)
    yield call
    await server.close()


def write_policy(name: str | None, text: str) -> Path:
    cfg = Path(os.environ["OLLIE_CFG_PATH"])
    path = cfg / "sandbox.yaml" if name is None else cfg / "sandbox" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
