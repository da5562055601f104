"""What a session's files show, read from one of two sources: an awake session's live `Core`, or an
asleep one's metadata and files on disk (reading it wakes nothing).

`Session` (sessions.py) holds one `SessionReading`, `Asleep` until it wakes and `Awake` from then
on, and asks it: each question is answered once for each source, here.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..agent.checkpoints import Checkpoints
from ..agent.context import DEFAULT_WINDOW
from ..agent.session import SessionMeta, SessionStore, sessions_dir
from ..agent.state import last_reply, session_cost
from ..chatfmt import last_prompt_offset
from ..types import ContextSize, Cost, GenerationParams, Message, OllieError, Usage

if TYPE_CHECKING:
    from ..agent import Core


class SessionReading(Protocol):
    """What the files ask of a session, and where its metadata is saved when the file server
    changes it (its parent, what its sub-agents spent)."""

    @property
    def meta(self) -> SessionMeta: ...
    @property
    def id(self) -> str: ...
    @property
    def chat_path(self) -> Path: ...
    @property
    def state(self) -> str: ...
    @property
    def reply(self) -> str: ...
    @property
    def last_prompt(self) -> str: ...
    @property
    def plan(self) -> str: ...
    def usage(self) -> Usage: ...
    def cost(self) -> Cost: ...
    def context_size(self) -> ContextSize: ...
    def system_prompt(self) -> str: ...
    def env(self) -> dict[str, str]: ...
    def messages(self) -> list[Message]: ...
    def settings(self) -> dict[str, Any]:
        """backend, model, agent, cwd and the generation parameters (a GenerationParams)."""
        ...

    def prompt_offset(self) -> int:
        """Where the last prompt starts in the chat log."""
        ...

    def checkpoints(self) -> Checkpoints: ...
    def save_meta(self) -> None: ...


class Awake:
    """A session read from its live Core."""

    def __init__(self, core: Core):
        self.core = core

    @property
    def meta(self) -> SessionMeta:
        return self.core.session.meta

    @property
    def id(self) -> str:
        return self.core.session_id

    @property
    def chat_path(self) -> Path:
        return self.core.session.chat_path

    @property
    def state(self) -> str:
        return self.core.state

    @property
    def reply(self) -> str:
        return self.core.reply

    @property
    def last_prompt(self) -> str:
        return _last_prompt(self.core.session.messages)

    @property
    def plan(self) -> str:
        return self.core.session.plan

    def usage(self) -> Usage:
        return self.core.usage()

    def cost(self) -> Cost:
        return self.core.cost()

    def context_size(self) -> ContextSize:
        return self.core.ctxsz()

    def system_prompt(self) -> str:
        return self.core.system_prompt()

    def env(self) -> dict[str, str]:
        return self.core.session.env

    def messages(self) -> list[Message]:
        return self.core.session.messages

    def settings(self) -> dict[str, Any]:
        c = self.core
        return {
            "backend": c.backend.name,
            "model": c.backend.model,
            "agent": c.agent.name,
            "cwd": c.session.cwd,
            "params": c.session.params,
        }

    def prompt_offset(self) -> int:
        """This run's last prompt; before the first, the one the chat log ends with."""
        offset = self.core.prompt_offset
        return offset if offset is not None else _prompt_offset_in(self.chat_path)

    def checkpoints(self) -> Checkpoints:
        return self.core.checkpoints or _stored_checkpoints(self.id)

    def save_meta(self) -> None:
        self.core.session.save()


class Asleep:
    """A session read from what is stored of it: its metadata (kept in memory) and its files. Its
    history is read when asked for; a corrupt one reads as empty (waking reports it, not `ls`)."""

    def __init__(self, meta: SessionMeta):
        self.meta = meta

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def chat_path(self) -> Path:
        return sessions_dir() / self.id / "chat"

    @property
    def state(self) -> str:
        return "idle"

    @property
    def reply(self) -> str:
        return self._history_end[0]

    @property
    def last_prompt(self) -> str:
        return self._history_end[1]

    @cached_property
    def _history_end(self) -> tuple[str, str]:
        """The reply and the last prompt, read once: a restart must not empty `reply` (scripts poll
        its size)."""
        messages = self.messages()
        return last_reply(messages), _last_prompt(messages)

    @property
    def plan(self) -> str:
        return SessionStore(self.id).load_plan()

    def usage(self) -> Usage:
        return Usage(**self.meta.usage)

    def cost(self) -> Cost:
        return session_cost(self.meta, self.usage(), self.meta.model)

    def context_size(self) -> ContextSize:
        estimate, window = self.meta.context_size or (0, DEFAULT_WINDOW)
        return ContextSize(estimate, window)

    def system_prompt(self) -> str:
        return self.meta.system_prompt

    def env(self) -> dict[str, str]:
        return dict(self.meta.env)

    def messages(self) -> list[Message]:
        try:
            return SessionStore(self.id).load_history()
        except OllieError:
            return []

    def settings(self) -> dict[str, Any]:
        m, params = self.meta, GenerationParams()
        params.restore(m.params)
        return {"backend": m.backend, "model": m.model, "agent": m.agent, "cwd": m.cwd, "params": params}

    def prompt_offset(self) -> int:
        return _prompt_offset_in(self.chat_path)

    def checkpoints(self) -> Checkpoints:
        return _stored_checkpoints(self.id)

    def save_meta(self) -> None:
        SessionStore(self.id).save_meta(self.meta)


def _last_prompt(messages: list[Message]) -> str:
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


def _stored_checkpoints(sid: str) -> Checkpoints:
    """A session's checkpoints read from its store, to list (they take nothing back)."""
    return Checkpoints(lambda: SessionStore(sid).dir / "checkpoints.jsonl", lambda _: None)


def _prompt_offset_in(chat: Path) -> int:
    try:
        return last_prompt_offset(chat.read_bytes())
    except FileNotFoundError:
        return 0
