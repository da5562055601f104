"""Extensions: what a program adds to each of its sessions, known to the core by this protocol only.

The loop calls every extension after a tool round (`after_tools`), and each tool call runs with
what the extensions add to its env (`stage_env`). An extension is built with its Core, from a
`SessionHandle`: what it may see and change of its session. Ollie's plans (`ollie.plans.Plans`)
are one, which `open_session` installs; the core knows nothing of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..types import Event

if TYPE_CHECKING:
    from ..tools import Dispatcher
    from .state import SessionState


class Extension(Protocol):
    def stage_env(self) -> dict[str, str]:
        """Variables for the env of each of the session's tool calls (a key its code signs with)."""
        ...

    async def after_tools(self, dispatcher: Dispatcher) -> None:
        """After each tool round, its results committed. `dispatcher` is the agent's tool servers
        as they are now (an agent switch replaces them). Raises nothing but cancellation: what goes
        wrong is the extension's to tell the user, as an event."""
        ...


class SessionHandle:
    """What an extension is given of its session: its id and store directory (both change when the
    session is renamed), its plan (which the file server shows as s/<id>/plan), and its events."""

    def __init__(self, state: SessionState, emit: Callable[[Event], None]):
        self._state = state
        self._emit = emit

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def store_dir(self) -> Path:
        """Where the extension may keep files of its own (the sandbox hides it from tool calls)."""
        return self._state.store.dir

    @property
    def plan(self) -> str:
        return self._state.plan

    def set_plan(self, text: str) -> None:
        self._state.set_plan(text)

    def emit(self, event: Event) -> None:
        """Tell the session's frontends (an info event: what went wrong, what was done)."""
        self._emit(event)


ExtensionFactory = Callable[[SessionHandle], Extension]  # an extension for each new Core
