"""How long an HTTP backend's stream gathers an answer before its reader takes it: the agent loop's
say (`stream_hold`), else the transport's own (`_http.STREAM_HOLD`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# How long a streamed answer may gather before its reader takes it (None: the transport's own).
_STREAM_HOLD: ContextVar[Callable[[], float] | None] = ContextVar("ollie_stream_hold", default=None)


@contextmanager
def stream_hold(seconds: Callable[[], float]) -> Iterator[None]:
    """Within it, the HTTP backends' streams wait up to `seconds()` (asked at each wait) for
    more of an answer before their reader takes what came: its first piece and its end still
    come at once. The agent loop waits long while no one follows a session's text, so that an
    answer nobody watches costs a few wakeups, not twenty a second."""
    token = _STREAM_HOLD.set(seconds)
    try:
        yield
    finally:
        _STREAM_HOLD.reset(token)


def held_for(default: float) -> float:
    """The hold `stream_hold` set, else `default`."""
    seconds = _STREAM_HOLD.get()
    return default if seconds is None else seconds()
