"""A hostile 9P client against the server.

Each test asserts the safe behaviour: one that fails has found a hole. The client is the same
uid on the Unix socket, or a TCP client with or without the token; it speaks raw frames
(python-9p's codec, or bytes), so it may pipeline, reuse tags, and not read its replies."""

import asyncio
import os
import socket
import sys
import time

import py9p
import pytest

import test_ninep_server
from ollie.vfs import ninep as P
from ollie.vfs import ninep_server
from ollie.vfs.namespace import File, Handle, Namespace, StaticDir
from ollie.vfs.ninep_client import Client, RemoteError
from ollie.vfs.ninep_server import (
    _REFUSALS,
    BAD_TOKENS,
    MAX_REQUESTS,
    MAX_TCP_CONNECTIONS,
    MAX_TCP_TOTAL,
    serve_tcp,
    serve_unix,
)
from test_ninep_limits import connect_from, until
from test_ninep_server import in_thread, raw_attach_wait, raw_connect

world = test_ninep_server.world  # the fixture: the same namespace as the server's own tests


def frame(msg) -> bytes:
    return py9p.encode_message(msg)


@pytest.fixture
async def tcp(world):
    srv = await serve_tcp(world.ns, port=0, token="s3cret")
    yield srv
    await srv.close()


@pytest.fixture
async def no_new_tasks():
    """Tasks the test leaves behind are cancelled (so a hole does not leak into other tests)."""
    before = asyncio.all_tasks()
    yield before
    leftover = asyncio.all_tasks() - before - {asyncio.current_task()}
    for task in leftover:
        task.cancel()
    if leftover:
        await asyncio.wait(leftover, timeout=5)


def only_connection(srv):
    (conn,) = srv._connections
    return conn


def open_big(s, size=8000):
    """Attach fid 0, open d/big as fid 1 (tags 1-3)."""
    for msg in (
        py9p.Tattach(fid=0, uname="me", tag=1),
        py9p.Twalk(fid=0, newfid=1, wname=("d", "big"), tag=2),
        py9p.Topen(fid=1, mode=0, tag=3),
    ):
        s.sendall(frame(msg))
    assert [type(py9p.read_message(s)) for _ in range(3)] == [py9p.Rattach, py9p.Rwalk, py9p.Ropen]


# (e) A Tversion must end every request of the old session ---------------------------------------


async def test_tversion_with_the_tag_of_a_blocked_read_still_cancels_that_read(world, no_new_tasks):
    """A Tversion reusing the tag of a blocked read: the read is cancelled all the same (its
    task was once replaced by the Tversion's under that tag, and then blocked on, its handle
    released under it, outliving the connection)."""
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: raw_attach_wait(s, tag=5))
        await asyncio.wait_for(world.wait.reading.wait(), 5)

        def version():
            s.sendall(frame(py9p.Tversion(msize=8192, version="9P2000", tag=5)))
            return py9p.read_message(s)

        assert isinstance(await in_thread(version), py9p.Rversion)
        assert world.wait.released.is_set()  # the open file was released...
        await asyncio.sleep(0.1)
        assert world.wait.cancelled == 1  # ...so the read on it must have ended
    await until(lambda: not world.srv._connections)
    leftover = asyncio.all_tasks() - no_new_tasks - {asyncio.current_task()}
    assert not leftover, f"tasks outlive the connection: {leftover}"


# (e) A handle made by an open must be released, whatever happened to its fid meanwhile ----------


class GateFile(File):
    """An open that waits (as `statewait`'s does while it wakes a sleeping session)."""

    def __init__(self):
        self.opening = asyncio.Event()
        self.gate = asyncio.Event()
        self.opened = 0
        self.released = 0

    async def open(self, mode):
        self.opening.set()
        await self.gate.wait()
        self.opened += 1
        return GateHandle(self)


class GateHandle(Handle):
    def __init__(self, f):
        self.f = f

    async def read(self, offset, count):
        return b""

    async def release(self):
        self.f.released += 1


@pytest.fixture
async def gated(tmp_path):
    f = GateFile()
    srv = await serve_unix(Namespace(StaticDir({"gate": f})), tmp_path / "ns" / "ollie")
    f.srv = srv
    f.sock = srv.address
    yield f
    await srv.close()


@pytest.mark.parametrize("ender", [py9p.Tclunk, py9p.Tremove])
async def test_a_fid_clunked_while_its_open_waits_leaks_no_handle(gated, ender):
    """A Tclunk (or Tremove) read while the fid's Topen waits for the store: the open, once
    done, finds its fid gone and releases the handle (it used to be left on a fid nobody held,
    released by nothing)."""
    s = await in_thread(lambda: raw_connect(gated.sock))
    with s:
        s.sendall(frame(py9p.Tattach(fid=0, uname="me", tag=1)))
        s.sendall(frame(py9p.Twalk(fid=0, newfid=1, wname=("gate",), tag=2)))
        assert [type(await in_thread(lambda: py9p.read_message(s))) for _ in range(2)] == [py9p.Rattach, py9p.Rwalk]
        s.sendall(frame(py9p.Topen(fid=1, mode=0, tag=3)))
        await asyncio.wait_for(gated.opening.wait(), 5)
        s.sendall(frame(ender(fid=1, tag=4)))
        await asyncio.sleep(0.05)
        gated.gate.set()
        replies = {}
        while len(replies) < 2:
            reply = await in_thread(lambda: py9p.read_message(s))
            replies[reply.tag] = reply
    await until(lambda: not gated.srv._connections)
    assert gated.opened == gated.released, f"{gated.opened} opened, {gated.released} released"


async def test_open_files_are_released_at_tversion_and_at_hang_up(world):
    """Held: every open disk file (a descriptor of the server's) is closed by a Tversion and by a
    hang-up, also when requests are in flight."""
    big = world.disk / "big"
    big.write_bytes(b"x" * 100)

    def held() -> int:
        """The server's descriptors of `big` (counted by what they are: other work of this process,
        a fork server's socket, a thread's file, may open and close descriptors meanwhile)."""
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == str(big)
            except OSError:
                continue  # closed since the listing
        return count

    def open_many(s, n, first_tag):
        s.sendall(frame(py9p.Tattach(fid=0, uname="me", tag=first_tag)))
        py9p.read_message(s)
        msgs = []
        for i in range(1, n + 1):
            msgs.append(frame(py9p.Twalk(fid=0, newfid=i, wname=("d", "big"), tag=first_tag + 2 * i)))
            msgs.append(frame(py9p.Topen(fid=i, mode=0, tag=first_tag + 2 * i + 1)))
        s.sendall(b"".join(msgs))
        return [py9p.read_message(s) for _ in range(2 * n)]

    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        replies = await in_thread(lambda: open_many(s, 50, 1))
        assert all(not isinstance(r, py9p.Rerror) for r in replies)
        assert held() == 50

        def version():
            s.sendall(frame(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF)))
            return py9p.read_message(s)

        assert isinstance(await in_thread(version), py9p.Rversion)
        assert held() == 0
        await in_thread(lambda: open_many(s, 50, 1))
        s.sendall(frame(py9p.Tread(fid=1, offset=0, count=10, tag=9999)))
    await until(lambda: not world.srv._connections)
    assert held() == 0


# (a) What one connection can make the server hold ---------------------------------------------


async def test_tflushes_do_not_let_a_connection_hold_more_than_max_requests(world):
    """Tflush is taken past MAX_REQUESTS; one whose oldtag is in flight nowhere is answered at
    once, without a task, so a socketful of them (256 KiB, ~29,000) holds no task while the
    client reads no replies."""
    (world.disk / "big").write_bytes(b"x" * 8000)
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: open_big(s))
        conn = only_connection(world.srv)
        s.sendall(b"".join(frame(py9p.Tread(fid=1, offset=0, count=8000, tag=60000 + i)) for i in range(60)))
        await asyncio.sleep(0.2)  # replies back up: reading has stopped
        flushes = b"".join(frame(py9p.Tflush(oldtag=0xFFFE, tag=t)) for t in range(50000))

        def flood():
            s.settimeout(1)
            try:
                s.sendall(flushes)  # as much as the socket takes
            except TimeoutError:
                pass

        def drain(k):
            for _ in range(k):
                py9p.read_message(s)

        await in_thread(flood)
        await in_thread(lambda: drain(60))
        held = 0
        for _ in range(6):
            await asyncio.sleep(0.1)
            held = max(held, len(conn.tasks))
            await in_thread(lambda: drain(3000))
    assert held <= MAX_REQUESTS, f"{held} requests in flight on one connection"


async def test_a_client_that_reads_no_replies_to_walks_and_stats_is_not_buffered(world):
    """Held: walks and stats are answered in data_received; when their replies pile up unread,
    reading stops there too, and another client is served meanwhile."""
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        s.sendall(frame(py9p.Tattach(fid=0, uname="me", tag=1)))
        await in_thread(lambda: py9p.read_message(s))
        stats = b"".join(frame(py9p.Tstat(fid=0, tag=i % 60000)) for i in range(100_000))
        walks = b"".join(frame(py9p.Twalk(fid=0, newfid=0, wname=("d", "notes"), tag=i % 60000)) for i in range(20_000))

        def flood():
            s.settimeout(2)
            try:
                s.sendall(stats + walks)
            except TimeoutError:
                pass

        await in_thread(flood)
        await asyncio.sleep(0.3)
        conn = only_connection(world.srv)
        assert conn.transport.get_write_buffer_size() < 256 * 1024
        assert len(conn.buffer) <= 256 * 1024 + 8192
        other = await Client.connect(f"unix!{world.sock}")
        try:
            assert await asyncio.wait_for(other.read_path("hello"), 2) == b"hello, world\n"
        finally:
            await other.close()


async def test_a_walk_of_more_than_maxwelem_names_is_refused(world):
    """Held: nwname is capped at 16, so one Twalk cannot make a walk of thousands of steps."""
    names = ["d", ".."] * 20
    body = (0).to_bytes(4, "little") + (1).to_bytes(4, "little") + len(names).to_bytes(2, "little")
    body += b"".join(len(n).to_bytes(2, "little") + n.encode() for n in names)
    raw = (4 + 1 + 2 + len(body)).to_bytes(4, "little") + bytes([P.Twalk.TYPE]) + (9).to_bytes(2, "little") + body

    def session():
        with raw_connect(world.sock) as s:
            s.sendall(frame(py9p.Tattach(fid=0, uname="me", tag=1)))
            py9p.read_message(s)
            s.sendall(raw)
            refused = py9p.read_message(s)
            s.sendall(frame(py9p.Tstat(fid=1, tag=10)))
            return refused, py9p.read_message(s)

    refused, after = await in_thread(session)
    assert isinstance(refused, py9p.Rerror) and "exceed the limit of 16" in refused.ename
    assert isinstance(after, py9p.Rerror) and "unknown fid 1" in after.ename


# (f) Pipelined requests keep their order -------------------------------------------------------


async def test_a_walk_pipelined_after_an_attach_waits_for_it_when_replies_back_up(world):
    """Pipelined Tattach then Twalk, with the replies backed up between them (an inline Rerror
    of a reused tag takes the write buffer over its high-water mark mid-read): the Tattach's task
    waits for the buffer to drain, and the Twalk, taken when it drains, still waits for the
    Tattach's handler (it was answered first, in line: "unknown fid 10")."""
    (world.disk / "big").write_bytes(b"x" * 8000)
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: open_big(s))
        conn = only_connection(world.srv)
        high = conn.transport.get_write_buffer_limits()[1]
        tag = 100
        while conn.transport.get_write_buffer_size() < high - 9000:  # the socket is full: replies wait
            s.sendall(frame(py9p.Tread(fid=1, offset=0, count=8000, tag=tag)))
            tag += 1
            await asyncio.sleep(0.02)
            assert tag < 1000
        assert conn.writable.is_set()
        rerror = len(P.encode(P.Rerror("tag 7 is already in use", tag=7)))
        n = (high - conn.transport.get_write_buffer_size()) // rerror + 8
        batch = frame(py9p.Tattach(fid=10, uname="me", tag=7))
        batch += frame(py9p.Tstat(fid=0, tag=7)) * n  # each answered at once: tag 7 is in use
        batch += frame(py9p.Twalk(fid=10, newfid=11, wname=("hello",), tag=8))
        s.sendall(batch)

        def collect():
            order = []
            while True:
                reply = py9p.read_message(s)
                if reply.tag in (7, 8) and not (isinstance(reply, py9p.Rerror) and "already in use" in reply.ename):
                    order.append(reply)
                if reply.tag == 8:
                    return order

        order = await in_thread(collect)
    assert [type(r) for r in order] == [py9p.Rattach, py9p.Rwalk], [
        getattr(r, "ename", type(r).__name__) for r in order
    ]


# (c) One connection cannot disturb another ----------------------------------------------------


async def test_a_hostile_connection_does_not_disturb_another_ones_blocked_read(world):
    """Held: garbage, reused tags, stray flushes and an impossible frame size end only the
    connection that sent them."""
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: raw_attach_wait(s, tag=5))
        await asyncio.wait_for(world.wait.reading.wait(), 5)

        def hostile():
            with raw_connect(world.sock) as h:
                h.sendall(frame(py9p.Tattach(fid=0, uname="me", tag=1)))
                py9p.read_message(h)
                h.sendall(frame(py9p.Tflush(oldtag=5, tag=2)))  # our tag 5: in flight nowhere
                assert isinstance(py9p.read_message(h), py9p.Rflush)
                h.sendall(b"\x09\x00\x00\x00\x6e\x01\x00\xff\xff")  # a truncated Twalk
                assert isinstance(py9p.read_message(h), py9p.Rerror)
                h.sendall(frame(py9p.Tversion(msize=100, version="9P2000", tag=0xFFFF)))
                assert isinstance(py9p.read_message(h), py9p.Rerror)
                h.sendall(b"\xff\xff\xff\xff" + b"\x00" * 100)
                assert h.recv(100) == b""

        await in_thread(hostile)
        s.sendall(frame(py9p.Tstat(fid=0, tag=6)))
        assert isinstance(await in_thread(lambda: py9p.read_message(s)), py9p.Rstat)
        assert world.wait.cancelled == 0  # the read of the other connection still waits


async def test_a_listing_with_a_name_that_is_not_utf8_fails_no_one(world):
    """A file whose name is not UTF-8 (sandboxed code writes m/ and pl/ directly; the mount
    serves such names as their bytes) is left out of the listing over 9P, which carries only
    UTF-8; the listing used to fail as a whole, for every 9P client."""
    os.close(os.open(os.path.join(os.fsencode(world.disk), b"bad\xff"), os.O_CREAT | os.O_WRONLY, 0o644))
    c = await Client.connect(f"unix!{world.sock}")
    try:
        names = [st.name for st in await c.list("d")]
    finally:
        await c.close()
    assert "notes" in names


# (d) The caps and the token ---------------------------------------------------------------------


async def test_refused_connections_serve_nothing_and_are_capped(tcp):
    """Held: a connection over the cap gets an Rerror for its first request and nothing else,
    even when it pipelines an attach with the right token and a walk; past the refusals, more
    connections are closed unanswered, and what is counted stays at the cap plus the refusals."""
    host, port = tcp.address
    clients = [await connect_from("127.0.0.1", host, port, "s3cret") for _ in range(MAX_TCP_CONNECTIONS)]
    try:

        def over():
            socks, replies = [], []
            for _ in range(_REFUSALS + 8):
                s = socket.create_connection((host, port), timeout=5)
                socks.append(s)
                s.sendall(
                    frame(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF))
                    + frame(py9p.Tattach(fid=0, uname="me", aname="s3cret", tag=1))
                    + frame(py9p.Twalk(fid=0, newfid=1, wname=("hello",), tag=2))
                )
            for s in socks:
                got = []
                try:
                    while True:
                        got.append(py9p.read_message(s))
                except (EOFError, OSError, ValueError):
                    pass
                s.close()
                replies.append(got)
            return replies

        replies = await in_thread(over)
        assert all(len(r) <= 1 and all(isinstance(m, py9p.Rerror) for m in r) for r in replies)
        assert len(tcp._connections) <= MAX_TCP_CONNECTIONS + _REFUSALS
        assert await clients[0].read_path("hello") == b"hello, world\n"
    finally:
        for c in clients:
            await c.close()


async def test_bad_tokens_in_flight_at_once_are_checked_in_turn(tcp, monkeypatch):
    """Attaches pipelined on many connections at once: each connection's are checked one at a
    time, a wrong one's wait before the next, so each gets BAD_TOKENS looks at the token, no more."""
    monkeypatch.setattr(ninep_server, "BAD_TOKEN_DELAY", 0.1)
    host, port = tcp.address

    def guess():
        socks = [socket.create_connection((host, port), timeout=5) for _ in range(MAX_TCP_CONNECTIONS)]
        out = []
        try:
            for s in socks:
                s.sendall(
                    frame(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF))
                    + b"".join(frame(py9p.Tattach(fid=f, uname="me", aname=f"g{f}", tag=f)) for f in range(20))
                )
            for s in socks:
                assert isinstance(py9p.read_message(s), py9p.Rversion)
                replies = []
                try:
                    while True:
                        replies.append(py9p.read_message(s))
                except (EOFError, OSError, ValueError):  # closed after BAD_TOKENS
                    pass
                out.append([m.ename for m in replies])
        finally:
            for s in socks:
                s.close()
        return out

    for errors in await in_thread(guess):
        assert len(errors) == BAD_TOKENS and all("permission denied" in e for e in errors), errors


async def test_connections_from_many_loopback_addresses_share_the_cap(tcp):
    """The same for the connection cap: one local process cannot take MAX_TCP_CONNECTIONS per
    loopback address until the server runs out of descriptors."""
    host, port = tcp.address
    clients = []
    try:
        for i in range(MAX_TCP_CONNECTIONS):
            clients.append(await connect_from(f"127.0.0.{10 + i}", host, port, "s3cret"))
        with pytest.raises(RemoteError, match="too many connections"):
            clients.append(await connect_from("127.0.0.200", host, port, "s3cret"))
    finally:
        for c in clients:
            await c.close()


# (g) No local process locks the token holder out of TCP (issue 24, class 7) ---------------------
#
# Any local process can connect to the TCP port, and all of loopback is one client to the caps. These
# used to lock the token holder out: 16 connections that never send a Tversion (they filled
# loopback's slots, then 16 refusals more), and 6 wrong tokens (they throttled all of loopback, the
# right token included, for 10 s and doubling).


def silent(host, port, n) -> list[socket.socket]:
    """n connections from loopback addresses (all of loopback is one client) that send nothing."""
    socks = []
    try:
        for i in range(n):
            s = socket.socket()
            socks.append(s)
            s.settimeout(10)
            s.bind((f"127.0.1.{1 + i % 250}", 0))
            s.connect((host, port))
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def settled(host, port) -> socket.socket:
    """A connection that sends a Tversion and waits for its answer, or for its close: the server
    accepts in order, so once it has either, it has taken (or refused) every connection made before."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(frame(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF)))
    try:
        py9p.read_message(s)
    except (EOFError, OSError, ValueError):
        pass
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server has closed s (without waiting, nor reading what it sent)."""
    timeout = s.gettimeout()
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        s.settimeout(timeout)


async def test_silent_connections_do_not_lock_the_token_holder_out(tcp):
    """Connections that never send a byte are pending, not attached: they do not count against
    loopback's 16, so the token holder attaches while more than 2 x 16 of them are open."""
    host, port = tcp.address
    socks = await in_thread(lambda: silent(host, port, 2 * MAX_TCP_CONNECTIONS + 8))
    socks.append(await in_thread(lambda: settled(host, port)))
    try:
        holder = await asyncio.wait_for(connect_from("127.0.0.1", host, port, "s3cret"), 10)
        try:
            assert await holder.read_path("hello") == b"hello, world\n"
        finally:
            await holder.close()
        assert not closed_by_server(socks[-2])  # nothing needed their slots
    finally:
        for s in socks:
            s.close()


async def test_silent_connections_in_every_slot_are_evicted_for_the_token_holder(tcp):
    """More silent connections than the server takes in all: each new connection evicts the oldest
    pending one rather than be refused, the server holds no more than its cap, and the token holder
    gets in."""
    host, port = tcp.address
    socks = await in_thread(lambda: silent(host, port, MAX_TCP_TOTAL + 8))
    socks.append(await in_thread(lambda: settled(host, port)))
    try:
        holder = await asyncio.wait_for(connect_from("127.0.0.1", host, port, "s3cret"), 10)
        try:
            assert await holder.read_path("hello") == b"hello, world\n"
        finally:
            await holder.close()
        await until(lambda: all(closed_by_server(s) for s in socks[:10]))  # the oldest went first
        assert not closed_by_server(socks[-2])
        assert len(tcp._connections) <= MAX_TCP_TOTAL + 1  # (+1: the holder's, until its hang-up is seen)
    finally:
        for s in socks:
            s.close()


CHURN = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
socks = []
while True:  # until killed
    s = socket.socket()
    try:
        s.connect((host, port))
    except OSError:
        s.close()
        continue
    socks.append(s)
    if len(socks) > 512:  # bound our descriptors: the server has let the oldest go long since
        socks.pop(0).close()
"""


async def test_a_process_opening_connection_after_connection_does_not_lock_the_token_holder_out(tcp):
    """Another process on the machine opens silent connections without end, so the server evicts
    one for each: the token holder still gets in, every time."""
    host, port = tcp.address
    churn = await asyncio.create_subprocess_exec(sys.executable, "-c", CHURN, host, str(port))
    try:
        await until(lambda: len(tcp._connections) >= 2 * MAX_TCP_CONNECTIONS)
        await asyncio.sleep(0.5)
        for _ in range(5):
            holder = await asyncio.wait_for(connect_from("127.0.0.1", host, port, "s3cret"), 10)
            try:
                assert await holder.read_path("hello") == b"hello, world\n"
            finally:
                await holder.close()
        assert churn.returncode is None
    finally:
        churn.kill()
        await churn.wait()


async def test_a_connection_that_does_not_attach_is_closed_after_the_deadline(world, monkeypatch):
    """A TCP connection not attached ATTACH_TIMEOUT after its accept is closed: silent, after a
    Tversion, or after a wrong token. An attached one is kept."""
    monkeypatch.setattr(ninep_server, "ATTACH_TIMEOUT", 1.0, raising=False)
    monkeypatch.setattr(ninep_server, "BAD_TOKEN_DELAY", 0.1, raising=False)
    srv = await serve_tcp(world.ns, port=0, token="s3cret")
    host, port = srv.address
    holder = await connect_from("127.0.0.1", host, port, "s3cret")

    def watch():
        start = time.monotonic()
        quiet = socket.create_connection((host, port), timeout=6)
        versioned = socket.create_connection((host, port), timeout=6)
        wrong = socket.create_connection((host, port), timeout=6)
        for s in (versioned, wrong):
            s.sendall(frame(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF)))
            assert isinstance(py9p.read_message(s), py9p.Rversion)
        wrong.sendall(frame(py9p.Tattach(fid=0, uname="me", aname="guess", tag=1)))
        assert isinstance(py9p.read_message(wrong), py9p.Rerror)
        closed_after = []
        for s in (quiet, versioned, wrong):
            with s:
                try:
                    assert s.recv(100) == b""
                except ConnectionResetError:
                    pass
                closed_after.append(time.monotonic() - start)
        return closed_after

    try:
        closed_after = await in_thread(watch)
        assert all(0.9 <= t < 1.0 + 4 for t in closed_after), closed_after
        assert await holder.read_path("hello") == b"hello, world\n"  # attached: kept past the deadline
    finally:
        await holder.close()
        await srv.close()


async def test_wrong_tokens_from_loopback_do_not_lock_the_token_holder_out(tcp, monkeypatch):
    """Processes on loopback guessing the token, many at once and without end, slow themselves
    alone: the token holder's attaches, from loopback too, get in meanwhile."""
    monkeypatch.setattr(ninep_server, "BAD_TOKEN_DELAY", 0.2, raising=False)
    host, port = tcp.address
    refused: list[str] = []

    async def guesser(i):
        for n in range(1_000_000):
            try:
                c = await connect_from(f"127.0.2.{1 + i}", host, port, f"guess-{i}-{n}")
            except RemoteError as e:
                refused.append(e.ename)
            else:
                await c.close()
                raise AssertionError(f"guess-{i}-{n} got in")

    guessers = [asyncio.create_task(guesser(i)) for i in range(4)]
    try:
        await until(lambda: len(refused) >= 12, timeout=10)  # past the 5 that used to throttle all of loopback
        for _ in range(3):
            holder = await asyncio.wait_for(connect_from("127.0.0.1", host, port, "s3cret"), 10)
            try:
                assert await holder.read_path("hello") == b"hello, world\n"
            finally:
                await holder.close()
        assert not any(g.done() for g in guessers)  # still guessing
        assert all("permission denied" in e for e in refused)
    finally:
        for g in guessers:
            g.cancel()
        await asyncio.gather(*guessers, return_exceptions=True)
