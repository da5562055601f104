"""A session's state: its history, settings, usage, plan and notes, kept on disk as they change.

The setters carry the rules. What may not change while a turn runs (the cwd, the generation
parameters, the session's name, the history) raises `Busy`; a bad value raises `InvalidValue`.
Every frontend (slash commands, the `ctl` and `cfg` files, a library user) changes the session
through these setters, so it meets the same rules. (`commit`, `replace_history`, `switched`, the
notes, what was spent, the first prompt, the primer and `save_setup` are the loop's and `Core`'s
own: they run while the session is held.) Nothing outside this module and `session.py` assigns
the metadata's fields (tests/test_meta_writes.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import config, paths, sandbox
from ..cost import price_known
from ..types import Busy, ContextSize, Cost, GenerationParams, InvalidValue, Message, Usage, valid_text, valid_value
from .session import SessionMeta, SessionStore

MAX_NOTES = 10  # hook notes waiting for the next prompt


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SessionState:
    """One session's state, restored from its store or new. `busy` says whether a turn runs;
    `changed` is called when the cwd changes (whoever waits for it wakes)."""

    def __init__(
        self,
        store: SessionStore,
        agent: str,
        cwd: str,
        params: GenerationParams,
        busy: Callable[[], bool],
        changed: Callable[[], None] = lambda: None,
        cwd_within: str = "",
        tree_cwd: str = "",
    ):
        self.store = store
        self._busy = busy
        self._changed = changed
        self.meta = SessionMeta(id=store.id, agent=agent, cwd_within=cwd_within, tree_cwd=tree_cwd)
        self._messages: list[Message] = []
        self.usage = Usage()
        self._params = params
        self._env: dict[str, str] = {}
        self._cwd = cwd
        self._plan = ""
        self.reply = ""  # the assistant text of the last completed turn
        if store.exists():
            store.hold()
            try:
                self._restore()
            except BaseException:
                store.let_go()
                raise
        else:
            store.create()
            store.hold()

    def _restore(self) -> None:
        meta = self.meta = self.store.load_meta()
        self._messages = self.store.load_history()
        self.usage = Usage(**meta.usage) if meta.usage else Usage()
        self._env = dict(meta.env)
        self._params.restore(meta.params)
        if meta.cwd and not paths.real_dir_problem(meta.cwd):
            self._cwd = meta.cwd
        self._plan = self.store.load_plan()
        self.reply = last_reply(self._messages)
        self.store.end_cut_turn("the turn was cut short when ollie stopped; completed work is kept")

    def require_idle(self, what: str) -> None:
        if self._busy():
            raise Busy(f"cannot {what} while a turn is running; interrupt it first")

    def save(self) -> None:
        """Write the metadata (settings, usage, cost) atomically: on disk when this returns, but
        while the session is busy (a turn, a switch, a compaction), when a worker thread has
        written it (off the event loop; the store's `close` waits for it)."""
        m = self.meta
        m.cwd, m.env, m.params = self._cwd, self._env, self._params.nonempty()
        m.usage = self.usage.to_dict()
        self.store.save_meta(m, wait=not self._busy())

    def save_setup(
        self, agent: str, backend: str, model: str, system_prompt: str, context: ContextSize, agent_in_code: bool
    ) -> None:
        """Save, with what the session runs with (its agent, backend and model) and what a reader
        that must not wake it shows: its system prompt and how full its context is."""
        m = self.meta
        m.agent, m.backend, m.model, m.agent_in_code = agent, backend, model, agent_in_code
        m.system_prompt, m.context_size = system_prompt, [context.estimate, context.window]
        self.save()

    def count_spent(self, usage: Usage, cost: float) -> None:
        """A request's tokens and dollars join the session's (saved when its turn ends)."""
        self.usage.add(usage)
        self.meta.cost_last = cost
        self.meta.cost_session += cost

    def keep_first_prompt(self, prompt: str) -> None:
        """A turn starts with `prompt`: if it is the session's first, its start is kept (200
        characters), for listings."""
        if not self.meta.first_prompt:
            self.meta.first_prompt = prompt[:200]

    # ---- identity ---------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.store.id

    def rename(self, new_id: str) -> None:
        """Move the session's files to `new_id` (the caller moves its tmpdir)."""
        self.require_idle("rename the session")
        self.store.rename(new_id)  # checks the name
        self.meta.id = new_id
        self.save()

    # ---- settings ---------------------------------------------------------------------------------
    @property
    def cwd(self) -> str:
        return self._cwd

    def set_cwd(self, path: str) -> None:
        """Change the working directory (relative to the current one, `~` expanded), kept as a
        real path: the sandbox refuses a cwd that a symlink has replaced since. A sub-agent's stays
        in its `cwd_within`, resolved there once, by descriptor, following no symlink."""
        self.require_idle("change the working directory")
        path = os.path.join(self._cwd, os.path.expanduser(path))
        if mount := config.ollie_mount_of(path):
            raise InvalidValue(f"cwd: {path} is on ollie's file server's mount {mount}; a session works elsewhere")
        if self.meta.cwd_within:
            try:
                path = sandbox.directory_within(path, self.meta.cwd_within)
            except sandbox.SandboxError as e:
                raise InvalidValue(f"cwd: {e}") from None
        else:
            path = os.path.realpath(path)
            if mount := config.ollie_mount_of(path):  # a link led there
                raise InvalidValue(f"cwd: {path} is on ollie's file server's mount {mount}; a session works elsewhere")
        if own := config.own_dir_of(path):  # (real by now, either way)
            raise InvalidValue(f"cwd: {path} lies in ollie's own directory {own}, which sandboxed code never sees")
        if problem := paths.real_dir_problem(path):  # (a link swapped in since is not followed, on this loop)
            raise InvalidValue(f"cwd: {path} {problem}")
        self._cwd = path
        self.save()
        self._changed()

    @property
    def written(self) -> tuple[str, ...]:
        """Directories the code of this session's tree may write: its cwd, and for a sub-agent the
        cwd its tree starts from."""
        return tuple(dict.fromkeys(p for p in (self._cwd, self.meta.tree_cwd) if p))

    @property
    def env(self) -> dict[str, str]:
        """The session's variables, passed to tools and hooks (a copy)."""
        return dict(self._env)

    def set_env(self, key: str, value: str | None) -> None:
        """Set a variable (None removes it); takes effect from the next tool call, even mid-turn."""
        if not _VARIABLE.fullmatch(key):  # a name a shell can use: `not a var=x` was set for no program to read
            raise InvalidValue(f"invalid variable name {key!r}: letters, digits and _, not starting with a digit")
        if value is not None and "\0" in value:
            raise InvalidValue(f"the value of {key} contains a NUL byte")
        if value is None:
            self._env.pop(key, None)
        else:
            self._env[key] = value
        self.save()

    @property
    def params(self) -> GenerationParams:
        return self._params

    def set_param(self, key: str, value: Any) -> None:
        self.require_idle("change generation parameters")
        self._params.set(key, value)
        self.save()

    def switched(self, params: GenerationParams) -> None:
        """Another agent took the session (Core holds it meanwhile): its parameters replace every
        one, and the notes the old agent's hooks left are dropped."""
        self._params = params
        self.meta.notes = []
        self.save()

    @property
    def plan(self) -> str:
        return self._plan

    def set_plan(self, text: str) -> None:
        """The plan may change during a turn: the agent keeps it as it works."""
        self._plan = text
        self.store.save_plan(text)

    # ---- notes that hooks leave for the model -----------------------------------------------------
    def add_note(self, text: str) -> None:
        """Context for the model that rides with the next prompt (a postTurn hook's output). A
        note already waiting is not added again; the oldest go beyond MAX_NOTES."""
        if text in self.meta.notes:
            return
        self.meta.notes = [*self.meta.notes, text][-MAX_NOTES:]
        self.save()

    @property
    def notes(self) -> list[str]:
        """The notes waiting for the next prompt."""
        return list(self.meta.notes)

    def notes_delivered(self) -> None:
        """The next prompt, with the notes, is in the history."""
        if self.meta.notes:
            self.meta.notes = []
            self.save()

    @property
    def primer(self) -> str:
        """The agentSpawn hooks' output: part of every request's system prompt, so compaction and
        /clear never lose it."""
        return self.meta.primer

    def set_primer(self, text: str) -> None:
        """The agent spawned and its hooks said `text`. Not saved here: Core saves it with the
        system prompt it makes (`save_setup`), in one write."""
        self.meta.primer = text

    # ---- history ----------------------------------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        """The history (read it; change it through `commit`, `replace_history` or `clear`)."""
        return self._messages

    def commit(self, messages: list[Message]) -> None:
        """Append completed messages to the history and to disk; nothing in them may be unwritable
        as UTF-8 or unsendable."""
        for m in messages:
            m.content = valid_text(m.content)
            if m.provider_data:
                m.provider_data = valid_value(m.provider_data)
        self._messages.extend(messages)
        self.store.append_messages(messages)

    def replace_history(self, messages: list[Message]) -> None:
        """Compaction's new history; the old one is appended to compaction.jsonl."""
        self.store.replace_history(messages, archive=self._messages)
        self._messages = messages

    def clear(self) -> None:
        """Forget the history (kept in compaction.jsonl) and the notes waiting for it."""
        self.require_idle("clear the history")
        self.replace_history([])
        self.notes_delivered()

    @property
    def chat_path(self) -> Path:
        return self.store.chat_path


def session_cost(meta: SessionMeta, usage: Usage, model: str, backend: str = "") -> Cost:
    """What a session spent, from its metadata; `model` prices requests the backend did not."""

    known = usage.cost is not None or price_known(model, backend or meta.backend)
    return Cost(meta.cost_last, meta.cost_session, known)


def last_reply(messages: list[Message]) -> str:
    """The assistant text after the last user message: a restored session's reply."""
    start = 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            start = i
            break
    return "\n".join(m.content for m in messages[start:] if m.role == "assistant" and m.content)
