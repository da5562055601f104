"""What one 9P client can make the server hold is capped (fids, requests in flight, connections,
bytes written to control and prompt files), each with an error that says which limit, and the server
goes on serving everyone else; wrong tokens slow down whoever sends them."""

import asyncio
import os
import socket
import threading
import time

import py9p
import pytest

import test_ninep_server
from ollie.vfs import ninep as P
from ollie.vfs import ninep_server
from ollie.vfs.ninep_client import Client, RemoteError
from ollie.vfs.ninep_server import (
    BAD_TOKEN_DELAY,
    BAD_TOKENS,
    FRAMES_PER_TURN,
    MAX_FIDS,
    MAX_REQUESTS,
    MAX_TCP_CONNECTIONS,
    MAX_UNIX_CONNECTIONS,
    client_of,
    serve_tcp,
)
from ollie.vfs.stores import LINE_MAX
from test_ninep_server import in_thread, raw_attach_wait, raw_connect

world = test_ninep_server.world  # the fixture: these tests serve the same namespace


async def until(predicate, timeout=5):
    async def poll():
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def connect_from(source: str, host: str, port: int, token: str) -> Client:
    """Our client over TCP from a chosen loopback address (the caps count per address)."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    client = Client(reader, writer)
    try:
        await client.start(token)
    except BaseException:
        await client.close()
        raise
    return client


@pytest.fixture
async def tcp(world):
    srv = await serve_tcp(world.ns, port=0, token="s3cret")
    yield srv
    await srv.close()


async def test_too_many_fids_fail_and_the_server_serves_on(world):
    c = await Client.connect(f"unix!{world.sock}")
    other = await Client.connect(f"unix!{world.sock}")
    try:
        fids = [await c.walk("hello") for _ in range(MAX_FIDS - 1)]  # the attached root is the first
        with pytest.raises(RemoteError, match=f"too many fids: at most {MAX_FIDS} per connection"):
            await c.walk("hello")
        assert await other.read_path("hello") == b"hello, world\n"
        await c.clunk(fids.pop())
        assert await c.read_path("hello") == b"hello, world\n"
    finally:
        await c.close()
        await other.close()


async def test_too_many_requests_in_flight_are_refused_but_tflush_is_taken(world):
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        await in_thread(lambda: raw_attach_wait(s, tag=60000))  # one read blocked in `wait`

        def flood():
            blocked = b"".join(
                py9p.encode_message(py9p.Tread(fid=1, offset=0, count=10, tag=t)) for t in range(MAX_REQUESTS - 1)
            )
            s.sendall(blocked + py9p.encode_message(py9p.Tread(fid=1, offset=0, count=10, tag=60001)))
            refused = py9p.read_message(s)
            s.sendall(py9p.encode_message(py9p.Tflush(oldtag=0, tag=60002)))
            return refused, py9p.read_message(s)

        refused, flushed = await in_thread(flood)
    assert isinstance(refused, py9p.Rerror) and refused.tag == 60001
    assert f"too many requests in flight: at most {MAX_REQUESTS}" in refused.ename
    assert isinstance(flushed, py9p.Rflush) and flushed.tag == 60002


async def test_too_many_connections_from_one_uid(world):
    me = f"uid {os.geteuid()}"
    clients = [await Client.connect(f"unix!{world.sock}") for _ in range(MAX_UNIX_CONNECTIONS)]
    try:
        with pytest.raises(RemoteError, match=f"too many connections from {me}: at most {MAX_UNIX_CONNECTIONS}"):
            await Client.connect(f"unix!{world.sock}")
        assert await clients[0].read_path("hello") == b"hello, world\n"
        await clients.pop().close()
        await until(lambda: world.srv._attached[me] < MAX_UNIX_CONNECTIONS)  # it has seen the hang-up
        clients.append(await Client.connect(f"unix!{world.sock}"))
        assert await clients[-1].read_path("hello") == b"hello, world\n"
    finally:
        for c in clients:
            await c.close()


async def test_too_many_connections_from_one_address(tcp, world):
    host, port = tcp.address
    clients = [await connect_from("127.0.0.1", host, port, "s3cret") for _ in range(MAX_TCP_CONNECTIONS)]
    try:
        with pytest.raises(RemoteError, match=f"too many connections from loopback: at most {MAX_TCP_CONNECTIONS}"):
            await connect_from("127.0.0.1", host, port, "s3cret")
        local = await Client.connect(f"unix!{world.sock}")  # the Unix socket's clients are not held up
        clients.append(local)
        assert await local.read_path("hello") == b"hello, world\n"
    finally:
        for c in clients:
            await c.close()


async def test_tcp_connections_are_capped_in_all(world, monkeypatch):
    monkeypatch.setattr(ninep_server, "MAX_TCP_TOTAL", 3)  # below the per-address cap, to reach it here
    srv = await serve_tcp(world.ns, port=0, token="s3cret")
    host, port = srv.address
    clients = [await connect_from("127.0.0.1", host, port, "s3cret") for _ in range(3)]
    try:
        with pytest.raises(RemoteError, match="too many connections: at most 3 in all"):
            await connect_from("127.0.0.1", host, port, "s3cret")
        await clients.pop().close()
        await until(lambda: len(srv._connections) < 3)
        clients.append(await connect_from("127.0.0.1", host, port, "s3cret"))
    finally:
        for c in clients:
            await c.close()
        await srv.close()


def test_a_tcp_client_is_its_address_but_all_of_loopback_is_one_and_an_ipv6_64_is_one():
    assert client_of("192.0.2.7") == "192.0.2.7"
    assert client_of("192.0.2.8") != client_of("192.0.2.7")
    assert client_of("127.0.0.1") == client_of("127.0.0.2") == client_of("127.9.9.9") == "loopback"
    assert client_of("::1") == client_of("::ffff:127.0.0.1") == "loopback"
    assert client_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_of("2001:db8:1:2::5") == client_of("2001:db8:1:2:ffff::1") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::5") != client_of("2001:db8:1:2::5")


async def test_too_many_attaches_from_one_address_at_once_are_refused_at_the_attach(tcp):
    """Connections are counted against an address's cap when they attach: of more connections than
    the cap attaching at once, those past it have their Tattach refused, saying why, and are closed."""
    host, port = tcp.address
    n = MAX_TCP_CONNECTIONS + 4

    def attach_all():
        socks = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
        for s in socks:
            s.sendall(py9p.encode_message(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF)))
        for s in socks:
            assert isinstance(py9p.read_message(s), py9p.Rversion)
        for s in socks:  # every one has been counted pending by now: the cap is met at the attach
            s.sendall(py9p.encode_message(py9p.Tattach(fid=0, uname="me", aname="s3cret", tag=1)))
        return socks, [py9p.read_message(s) for s in socks]

    socks, replies = await in_thread(attach_all)
    try:
        assert sum(isinstance(r, py9p.Rattach) for r in replies) == MAX_TCP_CONNECTIONS
        refused = [r.ename for r in replies if isinstance(r, py9p.Rerror)]
        assert len(refused) == 4
        assert all(f"too many connections from loopback: at most {MAX_TCP_CONNECTIONS}" in e for e in refused)
        assert tcp._attached["loopback"] == MAX_TCP_CONNECTIONS
        await until(lambda: len(tcp._connections) == MAX_TCP_CONNECTIONS)  # the refused ones are closed
    finally:
        for s in socks:
            s.close()


async def test_wrong_tokens_slow_their_sender_and_end_its_connection(tcp):
    """Each wrong token is answered after BAD_TOKEN_DELAY, one after another (attaches pipelined on
    the connection are checked in turn), and after BAD_TOKENS the connection is closed: the right
    token pipelined after them is never looked at. Another connection is not held up by them."""
    host, port = tcp.address
    guesses = BAD_TOKENS + 2
    sent = threading.Event()

    def guess():
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(py9p.encode_message(py9p.Tversion(msize=8192, version="9P2000", tag=0xFFFF)))
            assert isinstance(py9p.read_message(s), py9p.Rversion)
            attaches = [py9p.Tattach(fid=f, uname="me", aname=f"guess{f}", tag=f) for f in range(guesses)]
            attaches.append(py9p.Tattach(fid=99, uname="me", aname="s3cret", tag=99))
            start = time.monotonic()
            s.sendall(b"".join(py9p.encode_message(m) for m in attaches))
            sent.set()
            replies = []
            try:
                while True:
                    replies.append((py9p.read_message(s), time.monotonic() - start))
            except (EOFError, OSError, ValueError):  # closed
                pass
            return replies

    sender = asyncio.create_task(in_thread(guess))
    await until(sent.is_set)
    c = await connect_from("127.0.0.1", host, port, "s3cret")  # while the sender is being slowed
    assert not sender.done()
    assert await c.read_path("hello") == b"hello, world\n"
    await c.close()
    replies = await sender
    assert [type(r) for r, _ in replies] == [py9p.Rerror] * BAD_TOKENS
    assert all("permission denied" in r.ename for r, _ in replies)
    for i, (_, after) in enumerate(replies, 1):
        assert after >= i * BAD_TOKEN_DELAY * 0.9, f"wrong token {i} answered after {after:.2f} s"


async def test_long_control_lines_and_large_prompts_are_refused(world):
    c = await Client.connect(f"unix!{world.sock}")
    try:
        ctl = await c.walk("ctl")
        await c.open(ctl, P.ORDWR)
        await c.write(ctl, 0, b"p" * (LINE_MAX - 10))  # a line may come in many writes
        with pytest.raises(RemoteError, match="line too long: control lines are at most 64 KiB"):
            await c.write(ctl, 0, b"p" * 20 + b"\nping\n")
        with pytest.raises(RemoteError, match="line too long"):  # the refused line's tail is no command
            await c.write(ctl, 0, b"ping\n")
        await c.clunk(ctl)

        ctl = await c.walk("ctl")  # a fresh open is served as ever, and a line at the cap is taken
        await c.open(ctl, P.ORDWR)
        with pytest.raises(RemoteError, match="unknown command 'xxxx"):
            await c.write(ctl, 0, b"x" * LINE_MAX + b"\n")
        await c.write(ctl, 0, b"ping\n")
        answers = await c.read(ctl, 0, 100)  # why the line was refused, then the ping's answer
        assert answers.startswith(b"error: unknown command 'xxxx"), answers
        await c.clunk(ctl)

        prompt = await c.walk("prompt")
        await c.open(prompt, P.OWRITE)
        chunk = b"w" * c.iounit
        offset = 0
        with pytest.raises(RemoteError, match="too large: this file takes at most 1 MiB"):
            while offset <= 1 << 20:
                offset += await c.write(prompt, offset, chunk)
        await c.clunk(prompt)
        assert world.submitted == []  # a prompt cut at the cap is not submitted
    finally:
        await c.close()


async def test_a_burst_of_requests_is_taken_a_turn_at_a_time_so_it_cannot_hold_the_loop(world):
    """A client's burst of quick requests (here 1,000 walks, answered without tasks) is dispatched
    FRAMES_PER_TURN at a time, the rest after the loop's other callbacks: another client's request
    read meanwhile waits for one turn, not for the whole burst."""
    s = await in_thread(lambda: raw_connect(world.sock))
    with s:
        s.sendall(py9p.encode_message(py9p.Tattach(fid=0, uname="me", tag=1)))
        assert isinstance(await in_thread(lambda: py9p.read_message(s)), py9p.Rattach)
        (connection,) = world.srv._connections
        burst = b"".join(P.encode(P.Twalk(0, 0, [], tag=i)) for i in range(1000))
        s.setblocking(False)
        got = bytearray()

        def replies() -> int:
            try:
                while chunk := s.recv(1 << 20):
                    got.extend(chunk)
            except BlockingIOError:
                pass
            return len(got) // len(P.encode(P.Rwalk([])))

        connection.data_received(burst)  # as the socket would deliver it, in one piece
        assert replies() == FRAMES_PER_TURN
        await asyncio.sleep(0)
        assert replies() == 2 * FRAMES_PER_TURN
        await until(lambda: replies() == 1000)
