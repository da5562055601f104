"""The event loop `ollie srv` runs (`new_loop`): asyncio's, on a selector that gathers wakeups
while the loop is busy.

A model's answer streams in events a few ms apart, each its own TCP segment, and each wakes the
loop; so does each jail's answer and each stage's exit. 500 agents make some 25,000 wakeups a
second, most of them a round of the loop for one or two descriptors. While the loop is busy (it
woke less than GATHER seconds before), a wakeup by none of the descriptors a user waits on
(`urgent`: the mount's requests, work handed over by another thread) waits up to GATHER seconds
more, on those alone, and takes whatever came meanwhile in the same round: the way a network
card moderates its interrupts. What waits (a streamed event, most of them held for their reader
anyway; a jail's answer) comes at most that much later; an idle loop never waits.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import time
import weakref
from typing import Any

GATHER = 0.001  # seconds a busy loop's wakeup waits for more
GATHER_BELOW = 16  # descriptors ready at once that are a batch already: no wait


class GatheringSelector(selectors.EpollSelector):
    """An epoll selector whose wakeups, while they come less than GATHER seconds apart, wait up to
    GATHER seconds for more unless an `urgent` descriptor is among them (or comes meanwhile: the
    wait is on those alone, in an epoll set of their own)."""

    def __init__(self) -> None:
        super().__init__()
        self._urgent_set = select.epoll()
        self._urgent: set[int] = set()
        self._woke = 0.0

    def urgent(self, fd: int) -> None:
        """Never make a wakeup by `fd` (readable) wait; until it is unregistered."""
        if fd not in self._urgent:
            self._urgent.add(fd)
            self._urgent_set.register(fd, select.EPOLLIN)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = super().unregister(fileobj)
        if key.fd in self._urgent:  # its number, reused, is another descriptor
            self._urgent.discard(key.fd)
            try:
                self._urgent_set.unregister(key.fd)
            except OSError:  # closed already
                pass
        return key

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        now = time.monotonic()
        busy, self._woke = now - self._woke < GATHER, now
        if not busy or timeout == 0 or not ready or len(ready) >= GATHER_BELOW:
            return ready
        urgent = self._urgent
        for key, _ in ready:
            if key.fd in urgent:
                return ready
        self._urgent_set.poll(GATHER if timeout is None or timeout < 0 else min(GATHER, timeout))
        return super().select(0) or ready

    def close(self) -> None:
        self._urgent_set.close()
        super().close()


_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GatheringSelector] = weakref.WeakKeyDictionary()


def new_loop() -> asyncio.AbstractEventLoop:
    """An event loop on a GatheringSelector (`asyncio.Runner(loop_factory=new_loop)`), whose own
    wakeup by another thread (`call_soon_threadsafe`, an executor's result) is urgent."""
    selector = GatheringSelector()
    loop = asyncio.SelectorEventLoop(selector)
    own = getattr(loop, "_ssock", None)  # asyncio's self-pipe (a private name: without it, it may wait)
    if own is not None:
        selector.urgent(own.fileno())
    _SELECTORS[loop] = selector
    return loop


def urgent(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Never make a wakeup of `loop` by `fd` wait (a file system's requests); nothing on a loop
    `new_loop` did not make."""
    selector = _SELECTORS.get(loop)
    if selector is not None:
        selector.urgent(fd)
