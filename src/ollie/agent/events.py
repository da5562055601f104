"""The event bus: everything a frontend sees of a session arrives here as an `Event`.

Each event goes to the subscribers and, rendered by `chatfmt`, to the session's chat log (the
model's reasoning too, though it never enters the history). The bus also holds the session's
state word (`idle`, `thinking`, `calling: <tool>`, …) and wakes whoever waits for a change.

The model's text streams in pieces of a few characters, tens a second in each of hundreds of
sessions. A piece that comes after none for `STREAM_EVERY` seconds (an answer's first) is sent at
once; the pieces that follow it within that time are held (`stream`) and sent on as one event, to
the chat log and the subscribers together, at most `STREAM_EVERY` seconds later, or at once when
any other event comes (so the order stays, and whoever waits for the turn's end has read it all).
One timer a loop sends every bus's held text.

While no one follows a session's text as it comes (no subscriber that shows it, and no reader of
its chat in the last FOLLOW_LINGER seconds: a script that waits for the turn's end), the HTTP
stream gathers an answer for up to UNFOLLOWED_HOLD seconds before the loop takes it
(`stream_hold`): a few wakeups an answer instead of twenty a second. Its first piece and its end
still come at once, and the chat log has the text at most that much later.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Literal

from ..chatfmt import ChatRenderer
from ..types import Event, EventKind, valid_text
from .session import SessionStore

log = logging.getLogger("ollie.core")

STREAM_EVERY = 0.05  # seconds a piece of streamed text is held at most (20 updates a second)
UNFOLLOWED_HOLD = 1.0  # seconds an answer gathers in its stream while no one follows the text
FOLLOW_LINGER = 60.0  # seconds a look at the chat counts as following it (pollers look again sooner)
STREAMED = ("assistant", "reasoning")  # the kinds of event whose pieces are held and sent as one


class Bus:
    def __init__(self, store: SessionStore):
        self._store = store
        self._subscribers: list[Callable[[Event], None]] = []
        self._renderer = ChatRenderer(reasoning=True)
        self._changed: asyncio.Event | None = None  # made by the first waiter since the last change
        self._state = "idle"
        self.prompt_offset: int | None = None  # where in the chat log the last prompt starts
        self._held_kind: EventKind | Literal[""] = ""  # the kind of the text held (one of STREAMED)
        self._held: list[str] = []
        self._streamed_at = -STREAM_EVERY  # when streamed text was last sent (time.monotonic)
        self._followers = 0  # subscribers that show the text as it comes
        self._looked_at = -FOLLOW_LINGER  # when a reader last looked at the chat (time.monotonic)

    def subscribe(self, handler: Callable[[Event], None], follows: bool = True) -> Callable[[], None]:
        """Call `handler` with every event; returns the function that unsubscribes it. A handler
        that `follows` shows the model's text as it comes (see `stream_hold`); one that only
        watches for other events (a state, an error) does not."""
        self._subscribers.append(handler)
        self._followers += follows

        def unsubscribe() -> None:
            if handler in self._subscribers:
                self._subscribers.remove(handler)
                self._followers -= follows

        return unsubscribe

    def looked(self) -> None:
        """A reader looked at the chat log (opened or read it): for FOLLOW_LINGER seconds the
        text streams as it comes."""
        self._looked_at = time.monotonic()

    def followed(self) -> bool:
        """Someone follows the text as it comes: a subscriber that shows it, or a recent look."""
        return bool(self._followers) or time.monotonic() - self._looked_at < FOLLOW_LINGER

    def stream_hold(self) -> float:
        """Seconds the model's stream may gather before the loop takes it: STREAM_EVERY while
        anyone follows the text, UNFOLLOWED_HOLD while no one does."""
        return STREAM_EVERY if self.followed() else UNFOLLOWED_HOLD

    def stream(self, kind: EventKind, text: str) -> None:
        """A piece of the model's text (`kind` "assistant" or "reasoning"), held until it is sent
        with the pieces after it: by the loop's timer, by another event, or by `flush`."""
        if kind != self._held_kind:
            self.flush()
            flusher = _Flusher.of_running_loop()
            now = time.monotonic()
            if flusher is None or now - self._streamed_at >= STREAM_EVERY:  # the first in a while: at once
                self._streamed_at = now
                self._send(Event(kind, text))
                return
            self._held_kind = kind
            flusher.hold(self)
        self._held.append(text)

    def flush(self) -> None:
        """Send the text held now, as one event."""
        if self._held_kind:
            kind, self._held_kind = self._held_kind, ""
            text, self._held = "".join(self._held), []
            self._streamed_at = time.monotonic()
            self._send(Event(kind, text))

    def emit(self, ev: Event) -> None:
        """Send an event to the chat log and to every subscriber (after the text held)."""
        if ev.kind in STREAMED and not ev.data and not ev.name:
            self.stream(ev.kind, ev.text)
            return
        self.flush()
        self._send(ev)

    def _send(self, ev: Event) -> None:
        ev.text = valid_text(ev.text)  # whatever it quotes (a server's error, a prompt) must be writable
        if text := self._renderer.render(ev):
            if ev.kind == "user":
                self.prompt_offset = self._store.chat_size() + self._renderer.line_start
            self._store.append_chat(text)
        for handler in tuple(self._subscribers):
            try:
                handler(ev)
            except Exception:  # a broken frontend must not break the loop
                log.exception("event handler failed")
        if ev.kind in ("usage", "done", "state"):
            self.notify()

    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.emit(Event("state", state))

    def notify(self) -> None:
        """Wake whoever waits for a change (nothing to do, most often: no one waits)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self) -> None:
        """Return at the next change."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()


class _Flusher:
    """The one timer of a loop that sends every bus's held text (a timer a bus would cost as much
    as the writes it saves)."""

    _of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Flusher] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buses: dict[Bus, None] = {}
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of_running_loop(cls) -> _Flusher | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        flusher = cls._of.get(loop)
        if flusher is None:
            flusher = cls._of[loop] = cls(loop)
        return flusher

    def hold(self, bus: Bus) -> None:
        self._buses[bus] = None
        if self._timer is None:
            self._timer = self._loop.call_later(STREAM_EVERY, self._flush)

    def _flush(self) -> None:
        self._timer = None
        buses, self._buses = self._buses, {}
        for bus in buses:
            try:
                bus.flush()
            except Exception:  # one session's chat log (a full disk) must not keep the others' text
                log.exception("sending held text failed")
