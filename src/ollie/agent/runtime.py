"""What a turn works with: the session's state, its event bus, the backend, the agent (its config,
tool servers and system prompt), its hooks and the context window. `Core` owns one and swaps its
backend and agent; the loop (`loop.py`) and compaction (`compaction.py`) only use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cost import cost_of, unknown_notice
from ..tools import CallContext
from ..types import BackendError, Event, Message, Usage
from .context import Window
from .events import Bus
from .hooks import Hooks
from .knowledge import Knowledge, gather
from .state import SessionState

if TYPE_CHECKING:
    from ..backends import Backend
    from .checkpoints import Checkpoints
    from .env import AgentEnv
    from .extensions import Extension

_UNKNOWN = Knowledge("")  # what the model is told of a project before it is gathered


@dataclass
class Runtime:
    state: SessionState
    bus: Bus
    backend: Backend
    env: AgentEnv
    hooks: Hooks
    window: Window
    tmpdir: Path  # the session's scratch directory (whole tool results are kept there)
    inject: str | None = None  # a message for the running turn, delivered with the next tool result
    extensions: list[Extension] = field(default_factory=list)  # called after each tool round (the plans)
    checkpoints: Checkpoints | None = None  # what each turn changed in the cwd, for /undo

    _knowledge: tuple[str, AgentEnv, Knowledge] | None = None  # for which cwd and agent
    # Traces (ollie.telemetry): what this session's turns are children of (a parent session's tool
    # call), and the context of this session's tool call running now, for its sub-agents.
    trace_parent: Callable[[], Any] | None = None
    trace_tool: Any = None
    _unsaid: list[str] = field(default_factory=list)
    _unpriced: set[tuple[str, str]] = field(default_factory=set)  # (backend, model) said to have no price

    def system_prompt(self) -> str:
        """The agent's system prompt, what it knows of the project (`knowledge`), and what its
        agentSpawn hooks said, marked as theirs."""
        prompt = self.env.system_prompt
        if known := self.knowledge().text:
            prompt = f"{prompt.rstrip()}\n\n{known}"
        if primer := self.state.primer:
            prompt = f"{prompt.rstrip()}\n\n[From the agent's agentSpawn hooks:]\n{primer}"
        return prompt

    def knowledge(self) -> Knowledge:
        """What the project tells the model, as `say_notices` last gathered it."""
        return self._knowledge[2] if self._knowledge is not None else _UNKNOWN

    async def say_notices(self) -> None:
        """Gather what the project tells the model again for another cwd or agent (a session's
        start, a turn's), in a thread: its files lie where code writes, and a link there can lead
        into ollie's own mount, which this loop serves. Then emit, once, what that had to say."""
        cwd, env = self.state.cwd, self.env
        if self._knowledge is None or self._knowledge[0] != cwd or self._knowledge[1] is not env:
            known = await asyncio.to_thread(gather, env.config, cwd)
            self._knowledge = (cwd, env, known)
            self._unsaid = list(known.notices)
        for notice in self._unsaid:
            self.bus.emit(Event("info", notice))
        self._unsaid = []

    def commit(self, messages: list[Message]) -> None:
        """Completed messages: into the history, onto disk, into the window's count."""
        self.state.commit(messages)
        self.window.added(messages)

    def replace_history(self, messages: list[Message]) -> None:
        self.state.replace_history(messages)
        self.window.reset()

    def count_usage(self, usage: Usage) -> None:
        """Count a request's tokens and cost into the session's (summary requests too)."""
        if bad := usage.not_numbers():
            raise BackendError(
                f"malformed answer: its usage ({', '.join(bad)}) is not in numbers", provider=self.backend.name
            )
        last, known = cost_of(self.backend.model, usage, self.backend.name)
        self.state.count_spent(usage, last)
        if not known and (self.backend.name, self.backend.model) not in self._unpriced:
            self._unpriced.add((self.backend.name, self.backend.model))  # said once in the session
            self.bus.emit(Event("info", unknown_notice(self.backend.model, self.backend.name)))
        self.bus.emit(Event("usage", data=self.state.usage.to_dict()))

    async def after_tools(self) -> None:
        """After a tool round, its results committed: each extension's turn (never failing the
        turn; what goes wrong is theirs to tell as events)."""
        for extension in self.extensions:
            await extension.after_tools(self.env.dispatcher)

    def call_context(self) -> CallContext:
        """What a tool call of this session runs with: its cwd, env (with what its extensions add:
        the key its plans are signed with), scratch dir, allowed policies."""
        return CallContext(
            cwd=self.state.cwd,
            session_id=self.state.id,
            env=self._stage_env(),
            tmpdir=str(self.tmpdir),
            policies=tuple(self.env.config.sandboxes),
        )

    def _stage_env(self) -> dict[str, str]:
        env = dict(self.state.env)
        for extension in self.extensions:
            env.update(extension.stage_env())
        return env
