"""What one 9P client can make the server hold is capped (fids, requests in flight, connections,
bytes written to control and prompt files, bad tokens), each with an error that says which limit,
and the server goes on serving everyone else."""

import asyncio
import os

import py9p
import pytest

import test_ninep_server
from ollie.fs import ninep as P
from ollie.fs import ninep_server
from ollie.fs.ninep_client import Client, RemoteError
from ollie.fs.ninep_server import (
    ATTACH_FAILURES,
    FRAMES_PER_TURN,
    MAX_FIDS,
    MAX_REQUESTS,
    MAX_TCP_CONNECTIONS,
    MAX_UNIX_CONNECTIONS,
    client_of,
    serve_tcp,
)
from ollie.fs.stores import LINE_MAX
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
        await until(lambda: world.srv._per_client[me] < MAX_UNIX_CONNECTIONS)  # it has seen the hang-up
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


async def test_bad_tokens_are_throttled_per_address(tcp):
    host, port = tcp.address
    attempts = 20

    def guess():
        errors = []
        with py9p.Client.connect_tcp(host, port) as c:
            c.negotiate()
            for fid in range(attempts):
                try:
                    c.attach(fid, aname=f"guess{fid}")
                except py9p.RemoteError as e:
                    errors.append(str(e))
            try:  # while throttled, even the right token is not looked at
                c.attach(attempts, aname="s3cret")
            except py9p.RemoteError as e:
                errors.append(str(e))
        return errors

    errors = await in_thread(guess)
    assert len(errors) == attempts + 1
    assert sum("permission denied" in e for e in errors) == ATTACH_FAILURES
    assert sum("too many failed attaches from loopback" in e for e in errors) == attempts + 1 - ATTACH_FAILURES
    with pytest.raises(RemoteError, match="too many failed attaches"):  # a new connection does not reset it
        await connect_from("127.0.0.1", host, port, "s3cret")
    tcp.throttle.succeeded("loopback")  # (as after the delay) another client is not held up
    tcp.throttle.failed("192.0.2.7")
    tcp.throttle.check("192.0.2.7")
    c = await connect_from("127.0.0.2", host, port, "s3cret")
    assert await c.read_path("hello") == b"hello, world\n"
    await c.close()


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
        assert await c.read(ctl, 0, 100) == b"pong\n"
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
