"""For tests of what a server answers at once and what by a task: the tasks a loop makes, and a
namespace of a text at hand beside one that must be awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from ollie.vfs.namespace import Namespace, StaticDir
from ollie.vfs.stores import TextFile


@contextlib.contextmanager
def tasks_made(loop: asyncio.AbstractEventLoop) -> Iterator[list[str]]:
    """The qualified names of the coroutines `loop` runs as tasks meanwhile."""
    made: list[str] = []

    def counting(loop: asyncio.AbstractEventLoop, coro, context=None) -> asyncio.Task:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, context=context)

    loop.set_task_factory(counting)
    try:
        yield made
    finally:
        loop.set_task_factory(None)


def word_and_slow(calls: list[int]) -> Namespace:
    """`word` (text at hand) and `slow` (text awaited; each call of its getter noted in `calls`)."""

    async def slow() -> str:
        calls.append(1)
        await asyncio.sleep(0.01)
        return "slow\n"

    return Namespace(StaticDir({"word": TextFile(lambda: "word\n"), "slow": TextFile(slow)}))
