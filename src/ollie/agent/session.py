"""Sessions on disk: one directory per session under `$OLLIE_DATA_PATH/sessions/<id>/`.

history.jsonl     one message per line, appended and flushed per message (never rewritten,
                  except when compaction or /clear replaces the history: then atomically)
meta.json         agent, backend, model, cwd, name, usage, cost, … (replaced atomically)
chat              the chat log in the text format of `ollie.chatfmt`, append-only
plan              the session's plan (markdown), replaced atomically
compaction.jsonl  every history that compaction replaced, appended, so nothing is lost
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import config
from ..types import InvalidValue, Message, OllieError

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_session_id() -> str:
    """`<unix-ns>-<6 hex>`: lexical order is creation order."""
    return f"{time.time_ns()}-{secrets.token_hex(3)}"


def check_session_id(sid: str) -> str:
    if not _ID.fullmatch(sid) or sid in (".", ".."):
        raise InvalidValue(f"invalid session id {sid!r}: use letters, digits, '.', '_' and '-' (no '/')")
    return sid


def sessions_dir() -> Path:
    return config.data_path() / "sessions"


@dataclass
class SessionMeta:
    id: str
    agent: str = "default"
    backend: str = ""
    model: str = ""
    cwd: str = ""
    name: str = ""
    parent: str = ""  # the session whose code started this one (through its view of the files)
    # What its sub-agents (sub-sessions and batch jobs its code started) spent, once they ended:
    # {"cost": dollars, "input_tokens": n, "output_tokens": n, "requests": n, "agents": n}
    children: dict[str, float] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    first_prompt: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    cost_session: float = 0.0
    cost_last: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # hook output waiting for the next prompt
    primer: str = ""  # the agentSpawn hooks' output, part of the system prompt
    # As of the last save, for readers that must not wake the session: its system prompt and
    # [estimated tokens, window] of its context.
    system_prompt: str = ""
    context_size: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionMeta:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


def _replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _drop_torn_line(path: Path) -> None:
    """Cut a last line without its newline (a crash mid-write; `load_history` skips it), so that
    the next message starts a line of its own instead of gluing onto it."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return
    with f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:  # back, a block at a time, to the last newline
            step = min(pos, 65536)
            f.seek(pos - step)
            block = f.read(step)
            if pos == end and block.endswith(b"\n"):
                return
            if (nl := block.rfind(b"\n")) >= 0:
                f.truncate(pos - step + nl + 1)
                return
            pos -= step
        f.truncate(0)


class SessionStore:
    """The files of one session. Appends are flushed per message; metadata is replaced atomically."""

    def __init__(self, sid: str, root: Path | None = None):
        self.root = root or sessions_dir()
        self.id = check_session_id(sid)
        self._history: IO[str] | None = None
        self._chat: IO[str] | None = None

    @property
    def dir(self) -> Path:
        return self.root / self.id

    @property
    def chat_path(self) -> Path:
        return self.dir / "chat"

    def exists(self) -> bool:
        return (self.dir / "meta.json").is_file()

    def create(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.chat_path.touch()

    # ---- history ----
    def load_history(self) -> list[Message]:
        """The history; a torn last line (a crash mid-write) is skipped, not fatal."""
        path = self.dir / "history.jsonl"
        messages: list[Message] = []
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return messages
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                messages.append(Message.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                if n != len(lines) - 1:
                    raise OllieError(f"{path}:{n + 1}: corrupt history line") from None
        return messages

    def append_messages(self, messages: list[Message]) -> None:
        if self._history is None:
            _drop_torn_line(self.dir / "history.jsonl")
            self._history = open(self.dir / "history.jsonl", "a")
        for m in messages:
            self._history.write(json.dumps(m.to_dict(), ensure_ascii=False) + "\n")
            self._history.flush()

    def replace_history(self, messages: list[Message], archive: list[Message] | None = None) -> None:
        """Replace the history (compaction, /clear); the replaced one is appended to compaction.jsonl."""
        if archive:
            with open(self.dir / "compaction.jsonl", "a") as f:
                entry = {"time": time.time(), "messages": [m.to_dict() for m in archive]}
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        if self._history is not None:
            self._history.close()
            self._history = None
        text = "".join(json.dumps(m.to_dict(), ensure_ascii=False) + "\n" for m in messages)
        _replace_atomically(self.dir / "history.jsonl", text)

    # ---- chat log ----
    def append_chat(self, text: str) -> int:
        """Append to the chat log; returns the offset the text starts at."""
        if self._chat is None:
            self._chat = open(self.chat_path, "a")
        offset = os.fstat(self._chat.fileno()).st_size  # every append is flushed: the size is exact
        self._chat.write(text)
        self._chat.flush()
        return offset

    def end_cut_turn(self, note: str) -> None:
        """If the chat log stops inside a turn (finished turns end with a blank line), end it with
        `note`, so that readers see the turn will not go on."""
        try:
            with open(self.chat_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 2))
                tail = f.read()
        except FileNotFoundError:
            return
        if tail and not tail.endswith(b"\n\n"):
            self.append_chat(("" if tail.endswith(b"\n") else "\n") + f":: {note}\n\n")

    # ---- metadata and plan ----
    def load_meta(self) -> SessionMeta:
        path = self.dir / "meta.json"
        try:
            return SessionMeta.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise OllieError(f"no stored session {self.id!r} under {self.root}") from None
        except json.JSONDecodeError as e:
            raise OllieError(f"{path}: corrupt metadata: {e}") from None

    def save_meta(self, meta: SessionMeta) -> None:
        meta.updated = time.time()
        _replace_atomically(self.dir / "meta.json", json.dumps(asdict(meta), indent=1))

    def load_plan(self) -> str:
        try:
            return (self.dir / "plan").read_text()
        except FileNotFoundError:
            return ""

    def save_plan(self, text: str) -> None:
        _replace_atomically(self.dir / "plan", text)

    # ---- life cycle ----
    def close(self) -> None:
        for f in (self._history, self._chat):
            if f is not None:
                f.close()
        self._history = self._chat = None

    def rename(self, new_id: str) -> None:
        """Move all of the session's files to a new id in one rename."""
        check_session_id(new_id)
        target = self.root / new_id
        if target.exists():
            raise InvalidValue(f"session {new_id!r} already exists")
        self.close()
        os.rename(self.dir, target)
        self.id = new_id

    def delete(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def list_stored(root: Path | None = None) -> list[SessionMeta]:
    """Every stored session's metadata, in creation order."""
    root = root or sessions_dir()
    metas: list[SessionMeta] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return metas
    for entry in entries:
        try:
            metas.append(SessionMeta.from_dict(json.loads(Path(entry.path, "meta.json").read_text())))
        except (OSError, json.JSONDecodeError, TypeError):
            continue  # a half-created directory is not a session
    metas.sort(key=lambda m: (m.created, m.id))
    return metas
