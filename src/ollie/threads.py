"""A blocking call in a thread of its own, for a wait that may last (a file lock another process
holds, a cluster that does not answer). The loop's default pool is for short work: waits that
hold its threads starve everything else in the process that uses it (a jail's start, a snapshot)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def in_own_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """`fn()` run in a daemon thread named `name`; its result or exception in the future (of the
    running loop). Cancelling the future does not stop `fn`: it ends on its own, unheard."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    def run() -> None:
        result, error = None, None
        try:
            result = fn()
        except BaseException as e:  # handed to whoever waits
            error = e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
