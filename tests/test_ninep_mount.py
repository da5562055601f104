"""`ollie mount ADDR MNT`: the real namespace, served over 9P by this test, mounted through our 9P
client and FUSE by a real `ollie mount` process, used with ordinary shell tools."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from ollie import config
from ollie.fs import tree
from ollie.fs.sessions import Sessions
from ollie.vfs.ninep_server import serve_tcp, serve_unix

pytestmark = pytest.mark.skipif(
    not shutil.which("fusermount3") or not os.path.exists("/dev/fuse"), reason="needs FUSE (fusermount3, /dev/fuse)"
)

OLLIE = [sys.executable, "-c", "import sys; from ollie.cli import main; sys.exit(main())"]


@pytest.fixture
async def served(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"match": ".*", "text": "LGTM"}]}))
    agents = config.agents_path()[0]
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "reviewer.json").write_text(json.dumps({"backend": "scripted", "model": str(script)}))
    sessions = Sessions(default_cwd=str(tmp_path))
    ns = tree.build(sessions)
    unix = await serve_unix(ns, tmp_path / "ns" / "ollie")
    tcp = await serve_tcp(ns, port=0, token="let-me-in")
    yield unix, tcp
    await unix.close()
    await tcp.close()
    await sessions.close()


class MountProcess:
    def __init__(self, proc, mnt):
        self.proc, self.mnt = proc, mnt

    async def stop(self):
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)


@pytest.fixture
async def mounts():
    started = []

    async def start(addr, mnt, env=None, expect_ready=True, args=()):
        proc = await asyncio.create_subprocess_exec(
            *OLLIE, "mount", addr, str(mnt), *args, stderr=subprocess.PIPE, env={**os.environ, **(env or {})}
        )
        m = MountProcess(proc, mnt)
        started.append(m)
        lines = []
        while line := (await asyncio.wait_for(proc.stderr.readline(), 20)).decode():
            lines.append(line)
            if "mounted on" in line:
                return m
        assert not expect_ready, "".join(lines)
        m.stderr = "".join(lines)
        await proc.wait()
        return m

    yield start
    for m in started:
        await m.stop()


async def sh(cmd, cwd, timeout=20):
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def ok(cmd, cwd):
    rc, out, err = await sh(cmd, cwd)
    assert rc == 0, f"{cmd}: {err}"
    return out


async def test_shell_tools_and_a_session_through_a_remote_mount(served, mounts, tmp_path):
    unix, _ = served
    mnt = tmp_path / "mnt"
    await mounts(f"unix!{unix.address}", mnt)

    assert (await ok("ls", mnt)).split() == [
        "a",
        "b",
        "backends",
        "ctl",
        "help",
        "m",
        "p",
        "pl",
        "s",
        "sk",
        "t",
        "tmp",
        "tr",
        "u",
    ]
    assert await ok("cat help", mnt) == tree.HELP
    await ok("echo hello > tmp/note && echo more >> tmp/note", mnt)
    assert await ok("cat tmp/note", mnt) == "hello\nmore\n"
    assert (config.tmp_path() / "scratch" / "note").read_text() == "hello\nmore\n"
    await ok("mv tmp/note tmp/kept && rm tmp/kept", mnt)
    assert await ok("ls tmp", mnt) == ""

    # editors: `sed -i` renames a temporary file over a config; vim truncates the file it opened (a
    # wstat of an open fid), then writes less than was there
    agent = config.agents_path()[0] / "reviewer.json"
    await ok("""sed -i 's/}/, "maxSteps": 7}/' a/reviewer.json""", mnt)
    assert json.loads(agent.read_text())["maxSteps"] == 7
    shorter = json.dumps({"backend": "scripted", "model": str(tmp_path / "script.json")})
    await ok(
        f'{sys.executable} -c \'import os, sys; fd = os.open("a/reviewer.json", os.O_WRONLY); '
        f"os.ftruncate(fd, 0); os.write(fd, sys.argv[1].encode()); os.close(fd)' '{shorter}'",
        mnt,
    )
    assert agent.read_text() == shorter

    # a session, driven the way IDEAS.md does: root ctl, ls s/, prompt, reply
    await ok("echo 'new agent=reviewer' > ctl", mnt)
    sid = (await ok("ls s", mnt)).split()[-1]
    await ok(f"echo 'please review' > s/{sid}/prompt", mnt)
    reply = await ok(
        f"for i in 1 2 3 4 5; do grep -q LGTM s/{sid}/reply && break; "
        f"timeout 5 cat s/{sid}/statewait >/dev/null; done; cat s/{sid}/reply",
        mnt,
    )
    assert reply.strip() == "LGTM"
    assert "user: please review\nassistant: LGTM\n" in await ok(f"cat s/{sid}/chat", mnt)

    # a write that cannot be honoured fails at the writer, with the server's reason behind it
    rc, _, err = await sh(f"echo bogus > s/{sid}/ctl", mnt)
    assert rc != 0 and "Invalid argument" in err
    rc, _, err = await sh("echo 'new name=a/b' > ctl", mnt)
    assert rc != 0
    rc, _, err = await sh(f"head -c 100000 /dev/zero | tr '\\0' x > s/{sid}/ctl", mnt)
    assert rc != 0 and "File too large" in err  # the server's cap (its Rerror) as an errno

    # a reader blocked in statewait can be killed (Tflush), and the mount lives on
    reader = await asyncio.create_subprocess_exec("cat", str(mnt / "s" / sid / "statewait"), stdout=subprocess.PIPE)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader.wait()), 0.5)  # it is blocked
    reader.kill()
    await asyncio.wait_for(reader.wait(), 5)
    assert await ok(f"cat s/{sid}/reply", mnt) == "LGTM"
    await ok(f"mv s/{sid} s/reviewed", mnt)  # a rename is a Twstat
    assert await ok("cat s/reviewed/reply", mnt) == "LGTM"
    await ok("rm -r s/reviewed", mnt)
    assert await ok("ls s", mnt) == ""


async def test_tcp_mount_needs_the_token(served, mounts, tmp_path):
    _, tcp = served
    host, port = tcp.address
    refused = await mounts(f"tcp!{host}!{port}", tmp_path / "no", env={"OLLIE_9P_TOKEN": "wrong"}, expect_ready=False)
    assert refused.proc.returncode == 1 and "permission denied" in refused.stderr
    assert not os.path.ismount(tmp_path / "no")
    await mounts(f"{host}:{port}", tmp_path / "yes", env={"OLLIE_9P_TOKEN": "let-me-in"})
    assert await ok("cat backends", tmp_path / "yes") == tree.backends_text()


async def test_the_token_comes_from_a_file_never_the_command_line(served, mounts, tmp_path):
    """Every user can read every process's command line (ps)."""
    _, tcp = served
    host, port = tcp.address
    on_cmdline = await mounts(f"{host}:{port}", tmp_path / "no", args=("--token", "let-me-in"), expect_ready=False)
    assert on_cmdline.proc.returncode != 0 and not os.path.ismount(tmp_path / "no")
    assert "--token-file PATH" in on_cmdline.stderr and "$OLLIE_9P_TOKEN" in on_cmdline.stderr
    token = tmp_path / "token"
    token.write_text("let-me-in\n")
    await mounts(
        f"{host}:{port}", tmp_path / "yes", env={"OLLIE_9P_TOKEN": "wrong"}, args=("--token-file", str(token))
    )  # the file wins
    assert await ok("cat backends", tmp_path / "yes") == tree.backends_text()


async def test_mount_ends_when_the_server_goes(served, mounts, tmp_path):
    unix, _ = served
    m = await mounts(f"unix!{unix.address}", tmp_path / "mnt")
    await unix.close()
    assert await asyncio.wait_for(m.proc.wait(), 10) == 1
    assert "connection to the server lost" in (await m.proc.stderr.read()).decode()
    assert not os.path.ismount(tmp_path / "mnt")
