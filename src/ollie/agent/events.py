"""The event bus: everything a frontend sees of a session arrives here as an `Event`.

Each event goes to the subscribers and, rendered by `chatfmt`, to the session's chat log (the
model's reasoning too, though it never enters the history). The bus also holds the session's
state word (`idle`, `thinking`, `calling: <tool>`, …) and wakes whoever waits for a change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..chatfmt import ChatRenderer
from ..types import Event, valid_text
from .session import SessionStore

log = logging.getLogger("ollie.core")


class Bus:
    def __init__(self, store: SessionStore):
        self._store = store
        self._subscribers: list[Callable[[Event], None]] = []
        self._renderer = ChatRenderer(reasoning=True)
        self._changed: asyncio.Event | None = None  # made by the first waiter since the last change
        self._state = "idle"
        self.prompt_offset: int | None = None  # where in the chat log the last prompt starts

    def subscribe(self, handler: Callable[[Event], None]) -> Callable[[], None]:
        """Call `handler` with every event; returns the function that unsubscribes it."""
        self._subscribers.append(handler)
        return lambda: self._subscribers.remove(handler) if handler in self._subscribers else None

    def emit(self, ev: Event) -> None:
        """Send an event to the chat log and to every subscriber."""
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
