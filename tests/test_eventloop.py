"""`ollie srv`'s event loop (ollie.eventloop): a busy loop's wakeups gather, and lose nothing."""

import asyncio
import os
import random
import socket
import threading

from ollie import eventloop


def test_a_busy_loop_that_gathers_its_wakeups_loses_no_event_and_answers_its_urgent_descriptor():
    # 200 connections, a thread writing 20,000 numbered messages to them in a random order (the
    # loop busy, its wakeups gathered), and meanwhile a descriptor marked urgent (the mount's, in
    # `ollie srv`) written to and answered: every message arrives, in its connection's order;
    # the urgent descriptor's every write is read; descriptors closed and their numbers reused
    # (urgent ones among them) keep working.
    pairs = [socket.socketpair() for _ in range(200)]
    urgent_r, urgent_w = os.pipe()
    order = [i % len(pairs) for i in range(20_000)]
    random.Random(31).shuffle(order)

    def write() -> None:
        sent = [0] * len(pairs)
        for n, i in enumerate(order):
            pairs[i][1].sendall(b"%d\n" % sent[i])
            sent[i] += 1
            if n % 500 == 0:
                os.write(urgent_w, b"u")

    async def main() -> tuple[list[list[int]], int, bytes]:
        loop = asyncio.get_running_loop()
        selector, waits = eventloop._SELECTORS[loop], []
        urgent_set = selector._urgent_set

        class Counted:  # the gathering waits, counted: the test is about them
            def poll(self, timeout: float) -> list:
                waits.append(timeout)
                return urgent_set.poll(timeout)

            def __getattr__(self, name: str):
                return getattr(urgent_set, name)

        selector._urgent_set = Counted()  # type: ignore[assignment]
        eventloop.urgent(loop, urgent_r)
        urgent_reads = bytearray()
        loop.add_reader(urgent_r, lambda: urgent_reads.extend(os.read(urgent_r, 4096)))

        async def read(sock: socket.socket, count: int) -> list[int]:
            reader, writer = await asyncio.open_connection(sock=sock)
            got = [int(await reader.readline()) for _ in range(count)]
            writer.close()
            return got

        readers = [asyncio.ensure_future(read(a, order.count(i))) for i, (a, _) in enumerate(pairs)]
        writer_thread = threading.Thread(target=write)
        writer_thread.start()
        got = await asyncio.wait_for(asyncio.gather(*readers), 60)
        writer_thread.join()
        while len(urgent_reads) < len(range(0, len(order), 500)):
            await asyncio.sleep(0.01)
        loop.remove_reader(urgent_r)
        # numbers reused: a new urgent pipe and new connections, some on the closed ones' numbers
        again_r, again_w = os.pipe()
        eventloop.urgent(loop, again_r)
        came = loop.create_future()
        loop.add_reader(again_r, lambda: came.done() or came.set_result(os.read(again_r, 10)))
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a)
        b.sendall(b"after\n")
        os.write(again_w, b"x")
        line = await asyncio.wait_for(reader.readline(), 10)
        assert await asyncio.wait_for(came, 10) == b"x"
        loop.remove_reader(again_r)
        writer.close()
        for fd in (again_r, again_w):
            os.close(fd)
        b.close()
        assert waits and max(waits) <= eventloop.GATHER, "the busy loop gathered its wakeups"
        return got, len(urgent_reads), line

    try:
        with asyncio.Runner(loop_factory=eventloop.new_loop) as runner:
            got, urgent_count, line = runner.run(main())
    finally:
        for _, b in pairs:
            b.close()
        os.close(urgent_r)
        os.close(urgent_w)
    assert [len(g) for g in got] == [order.count(i) for i in range(len(pairs))]
    assert all(g == list(range(len(g))) for g in got)
    assert urgent_count == len(range(0, len(order), 500))
    assert line == b"after\n"
