"""The 9P2000 server, driven by python-9p (plan9port's codec, a client no one here wrote), by raw
frames, and by our own client. The namespace is built from the real stores plus a file whose read
blocks until cancelled."""

import asyncio
import contextlib
import errno
import gc
import os
import socket
import stat
import warnings
from pathlib import Path

import py9p
import pytest

from ollie.config import socket_path
from ollie.fs.session_files import WaitHandle as SessionWaitHandle
from ollie.tui.client import ChatReader
from ollie.tui.client import Namespace as TerminalNamespace
from ollie.types import ConfigError
from ollie.vfs import ninep as P
from ollie.vfs.namespace import File, FsError, Handle, Namespace, OpenMode, StaticDir
from ollie.vfs.ninep_client import Client, RemoteError, parse_address
from ollie.vfs.ninep_server import serve_tcp, serve_unix
from ollie.vfs.stores import CtlFile, DiskDir, OnCloseFile, TextFile
from task_helpers import tasks_made, word_and_slow


class WaitFile(File):
    """`statewait` in miniature: a read that blocks until its task is cancelled."""

    def __init__(self):
        self.reading = asyncio.Event()
        self.cancelled = 0
        self.released = asyncio.Event()

    async def open(self, mode):
        return WaitHandle(self)


class WaitHandle(Handle):
    def __init__(self, f):
        self.f = f

    async def read(self, offset, count):
        self.f.reading.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.f.cancelled += 1
            raise

    async def release(self):
        self.f.released.set()


class World:
    def __init__(self, tmp_path: Path):
        self.disk = tmp_path / "d"
        self.disk.mkdir()
        (self.disk / "notes").write_text("first line\n")
        self.submitted: list[str] = []
        self.wait = WaitFile()
        self.ns = Namespace(
            StaticDir(
                {
                    "hello": TextFile(lambda: "hello, world\n"),
                    "d": DiskDir(self.disk),
                    "prompt": OnCloseFile(lambda: "", self.submit, limit=1 << 20),
                    "ctl": CtlFile(self.command),
                    "wait": self.wait,
                }
            )
        )

    async def submit(self, text):
        self.submitted.append(text)

    async def command(self, line):
        if line != "ping":
            raise FsError(22, f"unknown command {line!r}")
        return "pong"


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    w.sock = tmp_path / "ns" / "ollie"
    w.srv = await serve_unix(w.ns, w.sock)
    yield w
    await w.srv.close()


def py9p_client(w, **kw) -> py9p.Client:
    c = py9p.Client.connect_unix(str(w.sock), msize=8192)
    c.negotiate()
    c.attach(0, **kw)
    return c


async def in_thread(fn):
    """python-9p is a blocking client; the server runs on this loop."""
    return await asyncio.wait_for(asyncio.to_thread(fn), 10)


def test_socket_path(monkeypatch):
    monkeypatch.setenv("NAMESPACE", "/run/ns")
    assert socket_path() == Path("/run/ns/ollie")
    monkeypatch.delenv("NAMESPACE")
    monkeypatch.setenv("USER", "glenda")
    monkeypatch.setenv("DISPLAY", ":1.0")
    assert socket_path() == Path("/tmp/ns.glenda.:1/ollie")
    monkeypatch.delenv("DISPLAY")
    assert socket_path() == Path("/tmp/ns.glenda.:0/ollie")


async def test_socket_is_private_and_removed_on_close(tmp_path):
    d = tmp_path / "ns"
    d.mkdir(mode=0o755)
    srv = await serve_unix(Namespace(StaticDir()), d / "ollie")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / "ollie").st_mode) == 0o600
    with pytest.raises(OSError, match="already listening"):
        await serve_unix(Namespace(StaticDir()), d / "ollie")
    await srv.close()
    assert not (d / "ollie").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
async def test_a_socket_directory_of_another_user_is_refused(tmp_path):
    """Under a shared /tmp, whoever makes /tmp/ns.$USER.$DISPLAY first owns it and what is in it."""
    d = tmp_path / "theirs"
    d.mkdir()
    d.chmod(0o777)
    os.chown(d, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534, not to you"):
        await serve_unix(Namespace(StaticDir()), d / "ollie")
    assert os.listdir(d) == [] and stat.S_IMODE(os.stat(d).st_mode) == 0o777


async def test_stale_socket_is_replaced(tmp_path):
    path = tmp_path / "ollie"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens
    srv = await serve_unix(Namespace(StaticDir()), path)
    c = await Client.connect(f"unix!{path}")
    assert [s.name for s in await c.list("/")] == []
    await c.close()
    await srv.close()


async def test_read_walk_stat_and_list_with_python_9p(world):
    def session():
        with py9p_client(world) as c:
            assert len(c.walk(0, 1, "d/notes")) == 2
            c.open(1, py9p.OREAD)
            assert c.read(1, 100, 0) == b"first line\n"
            assert c.read(1, 100, 6) == b"line\n"
            st = c.stat(1)
            assert (st.name, st.length, st.mode & 0o777) == ("notes", 11, 0o644)
            c.clunk(1)
            c.walk(0, 2, "hello")
            c.open(2)
            assert c.read(2) == b"hello, world\n"
            c.clunk(2)
            c.walk(0, 3, "")
            c.open(3)
            entries = []
            offset = 0
            while chunk := c.read(3, 8192, offset):
                offset += len(chunk)
                while chunk:
                    n = int.from_bytes(chunk[:2], "little") + 2
                    entries.append(py9p.decode_dir(chunk[:n]))
                    chunk = chunk[n:]
            c.clunk(3)
            return {e.name: e for e in entries}, c.stat(0)

    entries, root = await in_thread(session)
    assert list(entries) == ["hello", "d", "prompt", "ctl", "wait"]
    assert entries["d"].mode & py9p.DMDIR and entries["d"].qid.type & py9p.QTDIR
    assert not entries["hello"].mode & py9p.DMDIR
    assert root.name == "/" and root.mode & py9p.DMDIR


async def test_a_walk_gives_each_element_the_qid_its_listing_and_stat_give(world):
    def session():
        with py9p_client(world) as c:
            qids = c.walk(0, 1, "d/notes")
            assert [q.type & py9p.QTDIR for q in qids] == [py9p.QTDIR, 0]
            assert c.stat(1).qid == qids[1]
            c.walk(0, 2, "d")
            c.open(2)
            listed = py9p.decode_dir(c.read(2, 8192, 0))
            assert listed.name == "notes" and listed.qid.path == qids[1].path
            assert c.walk(0, 3, "d/../hello")[2] == c.walk(0, 4, "hello")[0]  # ".." mid-walk
            assert len(c.walk(0, 5, "hello/x")) == 1  # through a file: a partial walk, nothing made
            with pytest.raises(py9p.RemoteError, match="unknown fid 5"):
                c.stat(5)

    await in_thread(session)


async def test_create_write_rename_remove_with_python_9p(world):
    def session():
        with py9p_client(world) as c:
            c.walk(0, 1, "d")
            c.create(1, "new.txt", 0o640, py9p.OWRITE)
            assert c.write(1, b"written over 9P\n", 0) == 16
            c.clunk(1)
            assert (world.disk / "new.txt").read_text() == "written over 9P\n"
            c.walk(0, 2, "d/new.txt")
            st = c.stat(2)  # rename: the same entry with a new name (python-9p cannot send "don't touch")
            c.wstat(
                2,
                py9p.Dir(
                    st.type,
                    st.dev,
                    st.qid,
                    st.mode,
                    st.atime,
                    st.mtime,
                    st.length,
                    "moved.txt",
                    st.uid,
                    st.gid,
                    st.muid,
                ),
            )
            assert c.stat(2).name == "moved.txt"  # the fid follows the rename
            assert sorted(os.listdir(world.disk)) == ["moved.txt", "notes"]
            c.remove(2)
            assert sorted(os.listdir(world.disk)) == ["notes"]
            with pytest.raises(py9p.RemoteError, match="unknown fid 2"):
                c.stat(2)  # remove clunks the fid, even though it succeeded

    await in_thread(session)


async def test_prompt_submits_at_clunk_and_bad_ctl_fails_the_write(world):
    def session():
        with py9p_client(world) as c:
            c.walk(0, 1, "prompt")
            c.open(1, py9p.OWRITE | py9p.OTRUNC)
            c.write(1, b"do the ", 0)
            c.write(1, b"thing\n", 7)
            assert world.submitted == []  # nothing until the close
            c.clunk(1)
            c.walk(0, 2, "ctl")
            c.open(2, py9p.ORDWR)
            c.write(2, b"ping\n", 0)
            assert c.read(2, 100, 0) == b"pong\n"
            with pytest.raises(py9p.RemoteError, match="unknown command 'bogus'"):
                c.write(2, b"bogus\n", 5)
            c.clunk(2)

    await in_thread(session)
    assert world.submitted == ["do the thing\n"]


async def test_errors_are_replies_not_crashes(world):
    def session():
        with py9p_client(world) as c:
            with pytest.raises(py9p.RemoteError, match="unknown fid 42"):
                c.stat(42)
            with pytest.raises(py9p.RemoteError, match="unknown fid 42"):
                c.clunk(42)
            with pytest.raises(py9p.RemoteError, match="nothere: no such file"):
                c.walk(0, 1, "nothere")
            assert len(c.walk(0, 1, "d/nothere/x")) == 1  # a partial walk: newfid is not made
            with pytest.raises(py9p.RemoteError, match="unknown fid 1"):
                c.stat(1)
            c.walk(0, 5, "")
            with pytest.raises(py9p.RemoteError, match="fid 5 is already in use"):
                c.walk(0, 5, "hello")
            c.walk(0, 1, "hello")
            with pytest.raises(py9p.RemoteError, match="not open"):
                c.read(1, 10, 0)
            with pytest.raises(py9p.RemoteError, match="read-only"):
                c.open(1, py9p.OWRITE)
            c.walk(0, 2, "d")
            with pytest.raises(py9p.RemoteError, match="not a valid file name"):
                c.create(2, "a/b", 0o644, py9p.OWRITE)
            with pytest.raises(py9p.RemoteError, match="is a directory"):
                c.open(2, py9p.OWRITE)
            assert c.walk(2, 3, "..")[0].type & py9p.QTDIR
            assert c.stat(3).name == "/"
            return c.read(1, 5, 0) if c.open(1) else None

    assert await in_thread(session) == b"hello"


def raw_connect(path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(path))
    s.sendall(py9p.encode_message(py9p.Tversion(msize=8192, version="9P2000")))
    assert isinstance(py9p.read_message(s), py9p.Rversion)
    return s


def raw_attach_wait(s, tag):
    s.sendall(py9p.encode_message(py9p.Tattach(fid=0, uname="me", tag=1)))
    s.sendall(py9p.encode_message(py9p.Twalk(fid=0, newfid=1, wname=("wait",), tag=2)))
    s.sendall(py9p.encode_message(py9p.Topen(fid=1, mode=0, tag=3)))
    assert [type(py9p.read_message(s)) for _ in range(3)] == [py9p.Rattach, py9p.Rwalk, py9p.Ropen]
    s.sendall(py9p.encode_message(py9p.Tread(fid=1, offset=0, count=100, tag=tag)))


async def test_tflush_cancels_a_blocked_read(world):
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: raw_attach_wait(s, tag=77))
        await asyncio.wait_for(world.wait.reading.wait(), 5)
        s.sendall(py9p.encode_message(py9p.Tflush(oldtag=77, tag=78)))
        s.sendall(py9p.encode_message(py9p.Tstat(fid=0, tag=79)))
        replies = [await in_thread(lambda: py9p.read_message(s)) for _ in range(2)]
    assert sorted((type(r).__name__, r.tag) for r in replies) == [("Rflush", 78), ("Rstat", 79)]  # no Rread
    assert world.wait.cancelled == 1


async def test_vanished_client_leaves_no_task(world):
    before = asyncio.all_tasks()
    s = await in_thread(lambda: raw_connect(world.sock))
    await in_thread(lambda: raw_attach_wait(s, tag=5))
    await asyncio.wait_for(world.wait.reading.wait(), 5)
    s.close()  # hang up while the read is blocked
    await asyncio.wait_for(world.wait.released.wait(), 5)
    leftover = asyncio.all_tasks() - before
    done, pending = await asyncio.wait(leftover, timeout=5) if leftover else (set(), set())
    assert not pending
    assert world.wait.cancelled == 1


async def test_a_client_that_reads_no_replies_is_not_buffered_without_bound(world):
    """Requests keep coming, replies are never read: the server must stop serving that client
    rather than hold every reply (here 2,000 reads of 8 KiB, 16 MiB) in memory."""
    (world.disk / "big").write_bytes(b"x" * 8000)
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:

        def flood():
            for msg in (
                py9p.Tattach(fid=0, uname="me", tag=1),
                py9p.Twalk(fid=0, newfid=1, wname=("d", "big"), tag=2),
                py9p.Topen(fid=1, mode=0, tag=3),
            ):
                s.sendall(py9p.encode_message(msg))
            reads = b"".join(
                py9p.encode_message(py9p.Tread(fid=1, offset=0, count=8000, tag=10 + i)) for i in range(2000)
            )
            s.settimeout(2)
            try:
                s.sendall(reads)
            except TimeoutError:
                pass  # the server stopped reading: what we want

        await in_thread(flood)
        await asyncio.sleep(0.3)
        (connection,) = world.srv._connections
        assert connection.transport.get_write_buffer_size() < 256 * 1024


async def test_oversized_and_malformed_frames(world):
    def session():
        with raw_connect(world.sock) as s:
            s.sendall(b"\x0a\x00\x00\x00\x78\x09\x00\x01\x02")  # Tclunk, fid one byte short
            s.sendall(b"\x00")
            bad = py9p.read_message(s)
            assert isinstance(bad, py9p.Rerror) and bad.tag == 9 and "malformed" in bad.ename
            s.sendall(b"\x07\x00\x00\x00\x6a\x03\x00")  # type 106 (Terror) does not exist
            assert "unknown message type 106" in py9p.read_message(s).ename
            s.sendall((100_000).to_bytes(4, "little") + b"\x76" * 60)  # beyond msize: the server hangs up
            assert s.recv(100) == b""
        with py9p_client(world) as c:  # and goes on serving everyone else
            c.walk(0, 1, "hello")
            return c.stat(1).name

    assert await in_thread(session) == "hello"


async def test_requests_before_version_are_refused(world):
    def session():
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(world.sock))
            s.sendall(py9p.encode_message(py9p.Tattach(fid=0, uname="me", tag=1)))
            return py9p.read_message(s)

    assert "Tversion must come first" in (await in_thread(session)).ename


async def test_tcp_requires_the_token(world):
    with pytest.raises(ValueError, match="requires a token"):
        await serve_tcp(world.ns, port=0, token="")
    srv = await serve_tcp(world.ns, port=0, token="s3cret")
    host, port = srv.address
    assert host == "127.0.0.1"
    try:

        def session():
            with py9p.Client.connect_tcp(host, port) as c:
                c.negotiate()
                with pytest.raises(py9p.RemoteError, match="permission denied"):
                    c.attach(0)
                with pytest.raises(py9p.RemoteError, match="permission denied"):
                    c.attach(0, aname="wrong")
                with pytest.raises(py9p.RemoteError, match="unknown fid 0"):
                    c.stat(0)
                c.attach(0, aname="s3cret")
                return c.stat(0).name

        assert await in_thread(session) == "/"
        with pytest.raises(RemoteError, match="permission denied"):
            await Client.connect(f"tcp!{host}!{port}")
        c = await Client.connect(f"{host}:{port}", token="s3cret")
        assert await c.read_path("hello") == b"hello, world\n"
        await c.close()
    finally:
        await srv.close()


async def test_our_client_multiplexes_and_flushes_on_cancel(world):
    c = await Client.connect(f"unix!{world.sock}")
    try:
        fid = await c.walk("wait")
        await c.open(fid)
        blocked = asyncio.create_task(c.read(fid, 0, 100))
        await asyncio.wait_for(world.wait.reading.wait(), 5)
        # other requests go on while one is blocked
        results = await asyncio.gather(*(c.read_path("hello") for _ in range(20)))
        assert results == [b"hello, world\n"] * 20
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await asyncio.wait_for(asyncio.gather(*c._flushes), 5)
        assert world.wait.cancelled == 1
        await c.clunk(fid)
        await asyncio.wait_for(world.wait.released.wait(), 5)
    finally:
        await c.close()


async def test_our_client_walks_again_after_a_walk_cancelled_in_flight(world):
    """A walk cancelled once sent may have been done by the server (it walks as the frame comes,
    before the flush): its fid is clunked before it is used again, so later walks (a terminal
    UI's reads of the session switched to, say) do not fail with "fid in use"."""
    c = await Client.connect(f"unix!{world.sock}")
    try:
        walking = asyncio.create_task(c.walk("hello"))
        await asyncio.sleep(0)  # the Twalk is sent; the server has not answered yet
        walking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await walking
        for _ in range(3):
            assert await c.read_path("hello") == b"hello, world\n"
        fid = await c.walk("hello")
        closing = asyncio.create_task(c.clunk(fid))  # a clunk abandoned in flight: the same
        await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await asyncio.wait_for(asyncio.gather(*c._flushes), 5)
        assert await c.read_path("hello") == b"hello, world\n"
        assert sorted(c._free_fids) == sorted(set(c._free_fids))  # none freed twice
    finally:
        await c.close()


class Refusing(StaticDir):
    """A directory that, once `refusing`, says no to every name (a server that refuses this user)."""

    refusing = False

    def lookup(self, name: str) -> File | StaticDir:
        if self.refusing:
            raise FsError(errno.EACCES, f"{name}: permission denied")
        return super().lookup(name)


async def test_an_rerror_says_its_errno_and_a_chat_reader_waits_only_for_a_missing_file(tmp_path):
    """The client reads an errno from an Rerror's words. A terminal's chat reader takes a chat
    that is not there yet for "nothing yet", and raises anything else (its connection is then
    started again), rather than show an empty screen for good."""
    root = Refusing({})
    sock = tmp_path / "ollie"
    srv = await serve_unix(Namespace(root), sock)
    c = await Client.connect(f"unix!{sock}")
    try:
        with pytest.raises(RemoteError) as missing:
            await c.walk("nothing")
        assert missing.value.errno == errno.ENOENT
        reader = ChatReader(TerminalNamespace(c, f"unix!{sock}", local=True), "y")
        assert await reader.read_new() == ""  # s/y/chat: not there yet
        root.refusing = True
        with pytest.raises(RemoteError) as refused:
            await reader.read_new()
        assert refused.value.errno == errno.EACCES
    finally:
        await c.close()
        await srv.close()


async def test_our_client_create_write_rename_remove(world):
    c = await Client.connect(f"unix!{world.sock}")
    try:
        d = await c.walk("d")
        await c.create(d, "big", 0o600, P.ORDWR)
        data = os.urandom(200_000)  # several msize-bounded writes and reads
        assert await c.write(d, 0, data) == len(data)
        assert await c.read_all(d) == data
        await c.clunk(d)
        await c.rename("d/big", "bigger")
        assert [s.name for s in await c.list("d")] == ["bigger", "notes"]
        assert (await c.stat_path("d/bigger")).length == len(data)
        f = await c.walk("d/bigger")
        await c.wstat(f, P.Stat.unchanged(length=10))
        await c.remove(f)
        assert [s.name for s in await c.list("d")] == ["notes"]
        with pytest.raises(RemoteError, match="cannot change mode"):
            f = await c.walk("d/notes")
            try:
                await c.wstat(f, P.Stat.unchanged(mode=0o777))
            finally:
                await c.clunk(f)
        with pytest.raises(RemoteError, match="no such file"):
            await c.walk("d/notes/deeper")
    finally:
        await c.close()


async def test_version_resets_the_connection(world):
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: raw_attach_wait(s, tag=8))
        await asyncio.wait_for(world.wait.reading.wait(), 5)

        def session():
            s.sendall(py9p.encode_message(py9p.Tversion(msize=1 << 20, version="9P2000.u", tag=0xFFFF)))
            reply = py9p.read_message(s)
            s.sendall(py9p.encode_message(py9p.Tstat(fid=0, tag=1)))  # fids went with the old session
            return reply, py9p.read_message(s)

        version, after = await in_thread(session)
    assert (version.msize, version.version) == (65536, "9P2000")
    assert "unknown fid 0" in after.ename
    assert world.wait.cancelled == 1 and world.wait.released.is_set()


@pytest.mark.parametrize(
    "addr, want",
    [
        ("unix!/tmp/x", ("unix", "/tmp/x", 0)),
        ("tcp!127.0.0.1!564", ("tcp", "127.0.0.1", 564)),
        ("localhost:5640", ("tcp", "localhost", 5640)),
        ("[::1]:9", ("tcp", "::1", 9)),
        ("/tmp/s", ("unix", "/tmp/s", 0)),
    ],
)
def test_parse_address(addr, want):
    assert parse_address(addr) == want


@pytest.mark.parametrize("addr", ["tcp!h", "tcp!h!x", "h:99999", "nothing", "unix!", "udp!h!1"])
def test_parse_address_refuses(addr):
    with pytest.raises(ValueError):
        parse_address(addr)


async def test_an_awaited_text_never_read_is_dropped_at_release_without_running():
    """A read that learns the text must be awaited, then is interrupted before its task awaits
    it: the release drops the getter's coroutine (no 'never awaited' warning, no late call)."""
    calls: list[int] = []
    handle = await word_and_slow(calls).open("slow", OpenMode.READ)
    assert handle.read_now(0, 100) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await handle.release()
        del handle
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert calls == []


async def test_a_text_at_hand_is_opened_and_read_without_a_task_and_an_awaited_one_by_a_task(tmp_path):
    """Over 9P as on the mount: Topen and Tread of a file whose text is at hand are answered as the
    frames come (a task would wait behind all the loop has to do); a text that must be awaited is
    read by a task, its getter called once."""
    calls: list[int] = []
    srv = await serve_unix(word_and_slow(calls), tmp_path / "ns" / "ollie")
    client = await Client.connect(f"unix!{srv.address}")
    try:
        with tasks_made(asyncio.get_running_loop()) as served:
            assert await client.read_path("word") == b"word\n"
            assert "_Connection._serve" in served  # the Tclunk: a handle's release may wait
            served.clear()
            fid = await client.walk("word")
            await client.open(fid)
            assert await client.read(fid, 0, 100) == b"word\n"
            assert "_Connection._serve" not in served
            assert await client.read_path("slow") == b"slow\n"
            assert "_Connection._serve" in served and calls == [1]
            await client.clunk(fid)
    finally:
        await client.close()
        await srv.close()


class Turns:
    """A session's `state` and `statewait` in miniature; reading `state` starts a turn just after
    (the race of a prompt typed as a terminal starts following its session)."""

    def __init__(self):
        self.state = "idle"
        self.changed = asyncio.Event()

    def read_state(self) -> str:
        now, self.state = self.state, "thinking"
        self.changed.set()
        return now + "\n"

    async def wait(self, seen: str, timeout: float) -> str:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.state == seen:
                    self.changed.clear()
                    await self.changed.wait()
        return self.state


class StateWait(File):
    def __init__(self, turns: Turns):
        self.turns = turns

    async def open(self, mode):
        return SessionWaitHandle(self.turns.state, self.turns.wait)


async def test_the_terminal_sees_a_turn_that_starts_between_its_read_of_state_and_its_wait(tmp_path):
    """It once read `state`, then opened `statewait`: a turn started in between was where the
    wait began, so "thinking" was never shown (until the wait's 5 s ran out, the turn often over)."""
    turns = Turns()
    root = StaticDir(
        {"s": StaticDir({"x": StaticDir({"state": TextFile(turns.read_state), "statewait": StateWait(turns)})})}
    )
    sock = tmp_path / "ollie"
    srv = await serve_unix(Namespace(root), sock)
    c = await Client.connect(f"unix!{sock}")
    states = TerminalNamespace(c, f"unix!{sock}", local=True).wait_state("x")
    try:
        async with asyncio.timeout(2):  # the wait's own timeout is 4 to 5 s
            assert [await anext(states), await anext(states)] == ["idle", "thinking"]
    finally:
        await states.aclose()
        await c.close()
        await srv.close()
