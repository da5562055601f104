"""Sessions on disk: one directory per session under `$OLLIE_DATA_PATH/sessions/<id>/`.

history.jsonl     one message per line, appended and flushed per commit (never rewritten,
                  except when compaction or /clear replaces the history: then atomically)
meta.json         agent, backend, model, cwd, name, usage, cost, … (replaced atomically: written
                  to a new file, fsynced, renamed over the old one; see `save_meta`)
chat              the chat log in the text format of `ollie.chatfmt`, append-only
plan              the session's plan (markdown), replaced atomically
compaction.jsonl  every history that compaction replaced, appended, so nothing is lost
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from .. import config
from ..types import Busy, InvalidValue, Message, OllieError, Usage

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A history line: `json.dumps(…, ensure_ascii=False)` without building an encoder for each line.
_line = json.JSONEncoder(ensure_ascii=False).encode


def new_session_id() -> str:
    """`<unix-ns>-<6 hex>`: lexical order is creation order."""
    return f"{time.time_ns()}-{os.urandom(3).hex()}"


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
    # The agent was an AgentConfig built in code, not stored: continuing the session needs it again
    agent_in_code: bool = False
    backend: str = ""
    model: str = ""
    cwd: str = ""
    # A sub-agent's: the directory its cwd stays in (its parent's cwd when it was made), resolved
    # beneath it by descriptor whenever it changes
    cwd_within: str = ""
    # A sub-agent's: the cwd of the session its tree starts from, which its tree's code may write (a
    # program found there is none to run outside the session's own sandbox: a tool server's, say)
    tree_cwd: str = ""
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

    # Written by `SessionState` while the session is awake; these two the file server writes of an
    # asleep session too (no SessionState holds it), then saves.
    def set_parent(self, parent_id: str) -> None:
        """The session whose code started this one (its id, after a rename too)."""
        self.parent = parent_id

    def count_children(self, usage: Usage, cost: float, agents: int) -> None:
        """Add what ended sub-agents spent (`agents` of them) to `children`."""
        for key, value in (
            ("cost", cost),
            ("input_tokens", usage.input_tokens),
            ("output_tokens", usage.output_tokens),
            ("requests", usage.requests),
            ("agents", agents),
        ):
            self.children[key] = self.children.get(key, 0) + value

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionMeta:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, in field order, sharing the values' lists and dicts (to serialise
        at once: `dataclasses.asdict` copies them all, at 50 µs a save)."""
        return {
            "id": self.id,
            "agent": self.agent,
            "agent_in_code": self.agent_in_code,
            "backend": self.backend,
            "model": self.model,
            "cwd": self.cwd,
            "cwd_within": self.cwd_within,
            "tree_cwd": self.tree_cwd,
            "name": self.name,
            "parent": self.parent,
            "children": self.children,
            "created": self.created,
            "updated": self.updated,
            "first_prompt": self.first_prompt,
            "usage": self.usage,
            "cost_session": self.cost_session,
            "cost_last": self.cost_last,
            "env": self.env,
            "params": self.params,
            "notes": self.notes,
            "primer": self.primer,
            "system_prompt": self.system_prompt,
            "context_size": self.context_size,
        }


assert list(SessionMeta(id="").to_dict()) == [f.name for f in fields(SessionMeta)]

log = logging.getLogger("ollie.core")


def _replace_atomically(path: Path, text: str) -> None:
    """Write `text` to a new file, fsync it and rename it over `path`: a crash at any point
    leaves the old file or the new one, never a torn one. (Plain descriptors: in a worker
    thread, each Python step holds the GIL the event loop waits for.)"""
    tmp = f"{path.parent}/.{path.name}.{os.urandom(4).hex()}.tmp"
    data = memoryview(text.encode())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _Replacer:
    """Atomic replaces (`_replace_atomically`) done by a worker thread, off the event loop: the
    creation, fsync and rename of a file cost 0.4 ms and more under disk contention, which a
    session's loop should not wait for once a turn. The latest text of a path wins: a text queued
    while an older one still waits replaces it; one path is never written by two threads at once,
    so its last text queued is the last written. `wait` returns when a path's last text is on
    disk (writing it in the caller's thread if no worker has started it: a close does not wait
    for the queue); `write` writes at once in the caller's thread (after the one in progress,
    superseding any waiting). A write that failed raises from the next `put` or `wait` of its
    path. At exit, whatever waits is written. (A path's saves come from one thread, the loop's.)"""

    # One: each worker's Python steps between its syscalls hold the GIL the loop waits for. With
    # 300 writes queued during 60,000 small appends on the loop, the appends ended at +30% of
    # their time alone with one worker, at +55-170% with two or four (and +160% writing inline).
    THREADS = 1

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[Path, str] = {}  # the latest text of each path not yet being written
        self._busy: set[Path] = set()  # paths being written now
        self._errors: dict[Path, Exception] = {}
        self._threads = 0
        self._idle = 0

    def forked(self) -> None:
        """In a forked child: no worker runs there, and the parent writes what it queued."""
        self._cond = threading.Condition()
        self._pending, self._busy, self._errors = {}, set(), {}
        self._threads = self._idle = 0

    def put(self, path: Path, text: str) -> None:
        with self._cond:
            self._pending[path] = text
            if self._idle:
                self._cond.notify()
            elif self._threads < self.THREADS:
                self._threads += 1
                threading.Thread(target=self._work, name="ollie-meta", daemon=True).start()
            self._raise(path)  # an older text's failure (this one is queued all the same)

    def write(self, path: Path, text: str) -> None:
        with self._cond:
            self._pending.pop(path, None)  # older than this text
            self._own(path)
        self._write_owned(path, text)

    def wait(self, path: Path) -> None:
        with self._cond:
            while path in self._busy:
                self._cond.wait()
            text = self._pending.pop(path, None)
            if text is None:
                self._raise(path)
                return
            self._own(path)
        self._write_owned(path, text)

    def _own(self, path: Path) -> None:
        """(With the lock.) Take `path`, once the write in progress is done."""
        while path in self._busy:
            self._cond.wait()
        self._errors.pop(path, None)  # what failed is replaced by the text written now
        self._busy.add(path)

    def _write_owned(self, path: Path, text: str) -> None:
        try:
            _replace_atomically(path, text)
        finally:
            with self._cond:
                self._busy.discard(path)
                self._cond.notify_all()

    def drain(self) -> None:
        """Write whatever waits, in this thread too, and wait for the writes in progress."""
        while True:
            with self._cond:
                path = next((p for p in self._pending if p not in self._busy), None)
                if path is None:
                    while self._busy:
                        self._cond.wait()
                    if not self._pending:
                        return
                    continue
                text = self._pending.pop(path)
            try:
                self.write(path, text)
            except Exception as e:
                log.warning("cannot write %s: %s", path, e)

    def _raise(self, path: Path) -> None:
        if (e := self._errors.pop(path, None)) is not None:
            raise e

    def _work(self) -> None:
        while True:
            with self._cond:
                while (path := next((p for p in self._pending if p not in self._busy), None)) is None:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                text = self._pending.pop(path)
                self._busy.add(path)
            try:
                _replace_atomically(path, text)
            except Exception as e:
                log.warning("cannot write %s: %s", path, e)
                with self._cond:
                    self._errors[path] = e
            finally:
                with self._cond:
                    self._busy.discard(path)
                    self._cond.notify_all()


_replacer = _Replacer()
atexit.register(_replacer.drain)
os.register_at_fork(after_in_child=_replacer.forked)


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
    """The files of one session. Appends are flushed per commit and per event; metadata is
    replaced atomically."""

    def __init__(self, sid: str, root: Path | None = None):
        self.root = root or sessions_dir()
        self.id = check_session_id(sid)
        self._history: IO[str] | None = None
        self._chat: IO[bytes] | None = None
        self._meta_saved = False  # this store has written meta.json (or read it)
        self._saved = ("", "")  # what it wrote last (but the time; the context's size apart), as JSON
        self._whole = False  # this store made the session's files: no line of the history is torn
        self._held: int | None = None  # the lock file's descriptor, while this store holds the session

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
        self._whole = not (self.dir / "history.jsonl").exists()

    def hold(self) -> None:
        """Hold the session for one Core at a time, in any process: a second one's appends would
        interleave with the first's, and its close would remove the first's scratch directory.
        Busy when another holds it; the kernel lets go when this process ends, however it ends."""
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(
                f"session {self.id} is open elsewhere (another program, or ollie's file server): close it there"
            ) from None
        self._held = fd

    def let_go(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

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
        """Append messages to the history, flushed together (one write for a commit)."""
        if self._history is None:
            if not self._whole:
                _drop_torn_line(self.dir / "history.jsonl")
            self._history = open(self.dir / "history.jsonl", "a")
        self._history.write("".join([_line(m.to_dict()) + "\n" for m in messages]))
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
        text = "".join(_line(m.to_dict()) + "\n" for m in messages)
        _replace_atomically(self.dir / "history.jsonl", text)
        self._whole = True

    # ---- chat log ----
    def _chat_file(self) -> IO[bytes]:
        if self._chat is None:
            self._chat = open(self.chat_path, "ab", buffering=0)
        return self._chat

    def chat_size(self) -> int:
        """The chat log's size: where the next append starts (every append is written through, so
        the size is exact; a syscall, so asked only when wanted, not at every append)."""
        return os.fstat(self._chat_file().fileno()).st_size

    def append_chat(self, text: str) -> None:
        """Append to the chat log (one write, unbuffered: readers see it at once)."""
        chat = self._chat_file()
        data = text.encode()
        written = chat.write(data) or 0
        while written < len(data):  # a regular file takes it whole, but for a signal or a full disk
            written += chat.write(data[written:]) or 0

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
        _replacer.wait(path)  # what this process saved last
        try:
            meta = SessionMeta.from_dict(json.loads(path.read_text()))
            self._meta_saved = True
            content = meta.to_dict()
            del content["updated"]
            measured = json.dumps(content.pop("context_size"))
            self._saved = json.dumps(content), measured  # (a server's restart and stop are no activity either)
            return meta
        except FileNotFoundError:
            raise OllieError(f"no stored session {self.id!r} under {self.root}") from None
        except json.JSONDecodeError as e:
            raise OllieError(f"{path}: corrupt metadata: {e}") from None

    def save_meta(self, meta: SessionMeta, wait: bool = True) -> None:
        """Replace meta.json atomically (a crash leaves the old file or the new one). With `wait`
        (and for a store's first save: the session exists on disk once made), the file is written
        when this returns; without, a worker thread writes it, off the event loop, the latest save
        winning: `flush` and `close` wait for it, and a write that failed raises from the next
        save or `flush`. (The chat and the history are flushed, never fsynced: a crash of the
        machine may lose their last lines, not their meaning; the metadata must stay readable.)"""
        content = meta.to_dict()
        del content["updated"]
        measured = json.dumps(content.pop("context_size"))  # (measured anew at a restore: no activity)
        same = json.dumps(content)  # (a text: the dicts in it are the session's own, changed in place)
        if wait and self._meta_saved and (same, measured) == self._saved:  # nothing happened (a stop)
            self.flush()  # (a write that failed raises here, and the next save writes it again)
            return
        if not self._meta_saved or same != self._saved[0]:  # activity: not the context measured anew
            meta.updated = time.time()
        self._saved = same, measured
        text = f'{{"updated": {json.dumps(meta.updated)}, "context_size": {measured}, {same[1:]}'
        try:
            if wait or not self._meta_saved:
                _replacer.write(self.dir / "meta.json", text)
                self._meta_saved = True
            else:
                _replacer.put(self.dir / "meta.json", text)
        except BaseException:
            self._saved = ("", "")  # what failed is written again by the next save
            raise

    def flush(self) -> None:
        """Wait until the metadata saved last is on disk."""
        try:
            _replacer.wait(self.dir / "meta.json")
        except BaseException:
            self._saved = ("", "")
            raise

    def load_plan(self) -> str:
        try:
            return (self.dir / "plan").read_text()
        except FileNotFoundError:
            return ""

    def save_plan(self, text: str) -> None:
        _replace_atomically(self.dir / "plan", text)

    # ---- life cycle ----
    def close(self) -> None:
        """Close the files, once the metadata saved last is on disk."""
        for f in (self._history, self._chat):
            if f is not None:
                f.close()
        self._history = self._chat = None
        self.flush()

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
        try:
            self.close()
        except OSError:
            pass  # a save that failed: the files go anyway
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
