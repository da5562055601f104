"""What each open page is told, and when: the sessions' and jobs' own events, coalesced.

A page opens one stream (a WebSocket; the same streams are served as server-sent events for
scripts). The stream waits on an `asyncio.Event` of its own, set by the sessions' and jobs'
listeners (`Sessions.on_event`, `Jobs.on_change`): while nothing happens no task runs and no timer
fires, however many pages are open (a keepalive every KEEPALIVE seconds keeps a connection through
proxies, and finds a page that went away).

The sessions' table is told which rows changed, at most every TABLE_EVERY seconds (a busy session
streams hundreds of events a second, of which its row shows none but its state and usage); a
session's page is told at once, with what its chat grew by since it last looked (read from the
chat file, which the event was written to before listeners hear of it).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..chatfmt import usage_text
from ..types import Event

if TYPE_CHECKING:
    from ..fs.job import Job
    from ..fs.jobs import Jobs
    from ..fs.sessions import Session, Sessions

KEEPALIVE = 30.0
TABLE_EVERY = 0.2
CHUNK = 256 << 10  # chat bytes sent in one event at most
SYNC_READ = 64 << 10  # what a stream reads of a chat on the loop (cached: microseconds); more in a thread
ROW_EVENTS = {"state", "usage", "done", "user", "error"}  # what changes a row of the table
PROMPT_SHOWN = 200  # characters of the last prompt in a row
WARM_BATCH = 100  # sessions asleep whose stored history one thread reads at once


# What a stream yields: (event, data, id), or None to say it is still there (nothing happened for
# KEEPALIVE seconds). app.py sends them over a WebSocket (the page) or as server-sent events.
Message = tuple[str, Any, str | None] | None
Messages = AsyncIterator[Message]


def msg(event: str, data: Any, eid: str | None = None) -> Message:
    return (event, data, eid)


def sse(m: Message) -> bytes:
    if m is None:
        return b": keepalive\n\n"
    event, data, eid = m
    head = f"id: {eid}\n" if eid is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class Waiter:
    """One open stream: what changed since it last looked, and an event to wake it."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.dirty: set[str] = set()
        self.info = False  # a session page: its state, usage or relations changed

    def tell(self, key: str = "", info: bool = False) -> None:
        if key:
            self.dirty.add(key)
        self.info = self.info or info
        self.wake.set()

    async def wait(self, timeout: float) -> bool:
        """Until told (True) or `timeout` (False)."""
        if not self.wake.is_set():
            try:
                await asyncio.wait_for(self.wake.wait(), timeout)
            except TimeoutError:
                return False
        self.wake.clear()
        return True


class Feed:
    def __init__(self, sessions: Sessions, jobs: Jobs):
        self.sessions = sessions
        self.jobs = jobs
        self.tables: set[Waiter] = set()
        self.pages: dict[str, set[Waiter]] = {}
        self.job_tables: set[Waiter] = set()
        self.closing = asyncio.Event()
        sessions.on_event.append(self._event)
        sessions.on_rename.append(self._renamed)
        jobs.on_change.append(self._job)

    def close(self) -> None:
        self.closing.set()
        for waiter in self._all():
            waiter.wake.set()
        if self._event in self.sessions.on_event:
            self.sessions.on_event.remove(self._event)
        if self._renamed in self.sessions.on_rename:
            self.sessions.on_rename.remove(self._renamed)
        if self._job in self.jobs.on_change:
            self.jobs.on_change.remove(self._job)

    def _all(self) -> list[Waiter]:
        return [*self.tables, *self.job_tables, *(w for ws in self.pages.values() for w in ws)]

    # ---- the listeners: cheap, never raise ------------------------------------------------------
    def _event(self, session: Session, ev: Event | None) -> None:
        row = ev is None or ev.kind in ROW_EVENTS
        if row:
            for waiter in self.job_tables if session.job else self.tables:
                waiter.tell(session.id)
        for waiter in self.pages.get(session.id, ()):
            waiter.tell(info=row)
        if row and session.meta.parent in self.pages:  # a sub-session came, went or changed
            for waiter in self.pages[session.meta.parent]:
                waiter.tell(info=True)

    def _renamed(self, old: str, new: str) -> None:
        for waiter in self.tables:
            waiter.tell(old)
            waiter.tell(new)
        for waiter in self.pages.get(old, ()):
            waiter.tell(info=True)

    def _job(self, job: Job) -> None:
        for waiter in self.job_tables:
            waiter.tell(job.id)
        for waiter in self.pages.get(job.id, ()):
            waiter.tell(info=True)
        for waiter in self.pages.get(job.record.parent, ()):
            waiter.tell(info=True)

    # ---- the sessions' table ---------------------------------------------------------------------
    def row(self, s: Session) -> dict[str, Any]:
        settings = s.settings()
        ctx = s.context_size()
        return {
            "id": s.id,
            "agent": settings["agent"],
            "model": settings["model"],
            "backend": settings["backend"],
            "state": s.state,
            "cwd": settings["cwd"],
            "ctx": ctx.percent,
            "cost": round(s.cost().session, 6),
            "prompt": s.last_prompt[:PROMPT_SHOWN],
            "updated": s.meta.updated,
            "parent": s.meta.parent,
        }

    async def rows(self, sessions: list[Session]) -> list[dict[str, Any]]:
        """Every row; the last prompts of sessions asleep, which are read from their stored
        histories (once: a session keeps it), read off the loop first, a batch at a time."""
        asleep = [s for s in sessions if s.core is None]
        for i in range(0, len(asleep), WARM_BATCH):
            await asyncio.to_thread(_last_prompts, asleep[i : i + WARM_BATCH])
        return [self.row(s) for s in sessions]

    async def table(self) -> Messages:
        waiter = Waiter()
        self.tables.add(waiter)
        try:
            yield msg("rows", {"reset": True, "rows": await self.rows(self.sessions.listed())})
            while not self.closing.is_set():
                if not await waiter.wait(KEEPALIVE):
                    yield None
                    continue
                await asyncio.sleep(TABLE_EVERY)  # what else changes meanwhile goes in the same event
                ids, waiter.dirty = waiter.dirty, set()
                rows, gone = [], []
                for sid in sorted(ids):
                    s = self.sessions.find(sid)
                    if s is None or s.job:
                        gone.append(sid)
                    else:
                        rows.append(self.row(s))
                if rows or gone:
                    yield msg("rows", {"rows": rows, "gone": gone})
        finally:
            self.tables.discard(waiter)

    # ---- one session's page --------------------------------------------------------------------
    def info(self, s: Session) -> dict[str, Any]:
        settings = s.settings()
        ctx = s.context_size()
        cost = s.cost()
        return {
            "id": s.id,
            "kind": "session",
            "state": s.state,
            "agent": settings["agent"],
            "backend": settings["backend"],
            "model": settings["model"],
            "cwd": settings["cwd"],
            "ctx": ctx.percent,
            "ctxText": f"{ctx.estimate} of {ctx.window} tokens",
            "usage": usage_text(s.usage()),
            "cost": round(cost.session, 6),
            "priceKnown": cost.price_known,
            "plan": s.plan,
            "parent": s.meta.parent,
            "tree": self.tree(s.id),
        }

    def tree(self, sid: str, depth: int = 0) -> list[dict[str, Any]]:
        """The sub-sessions and jobs under `sid`, nested."""
        if depth > 8:
            return []
        out: list[dict[str, Any]] = []
        for child in self.sessions.children(sid):
            if child.job:
                continue
            out.append(
                {"id": child.id, "kind": "session", "state": child.state, "children": self.tree(child.id, depth + 1)}
            )
        for job in self.jobs.all():
            if job.record.parent == sid:
                out.append({"id": job.id, "kind": "job", "state": job.status, "children": self.tree(job.id, depth + 1)})
        return out

    def _find(self, key: str) -> tuple[Session | None, Job | None]:
        """The session of `s/<key>`, or the job of `b/<key>` (and its session while it runs)."""
        job = self.jobs.find(key)
        if job is not None:
            return job.session, job
        s = self.sessions.find(key)
        return (s, None) if s is not None and not s.job else (None, None)

    def job_info(self, job: Job) -> dict[str, Any]:
        return {
            **self.job_row(job),
            "kind": "job",
            "spec": job.record.spec,
            "result": job.record.result,
            "usage": usage_text(job.usage()),
            "tree": self.tree(job.id),
        }

    async def page(self, key: str, offset: int) -> Messages:
        """A session's chat (or a job's log) from byte `offset` on, as it grows, and its info when
        it changes; `gone` when it ends."""
        waiter = Waiter()
        self.pages.setdefault(key, set()).add(waiter)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        waiter.info = True
        try:
            while not self.closing.is_set():
                s, job = self._find(key)
                if s is None and job is None:
                    yield msg("gone", {"id": key})
                    return
                path = job.log_path if job is not None else s.chat_path  # type: ignore[union-attr]
                if s is not None:
                    s.looked()  # its text then streams as it comes
                while offset < (size := _size(path)):
                    count = min(size - offset, CHUNK)
                    data = (
                        _read_at(path, offset, count)
                        if count < SYNC_READ
                        else await asyncio.to_thread(_read_at, path, offset, count)
                    )
                    if not data:
                        break
                    offset += len(data)
                    yield msg("chat", {"text": decoder.decode(data)}, str(offset))
                if waiter.info:
                    waiter.info = False
                    yield msg("info", self.job_info(job) if job is not None else self.info(s))  # type: ignore[arg-type]
                if not await waiter.wait(KEEPALIVE):
                    yield None
        finally:
            ws = self.pages.get(key)
            if ws is not None:
                ws.discard(waiter)
                if not ws:
                    del self.pages[key]

    # ---- batch jobs ------------------------------------------------------------------------------
    def job_row(self, job: Job) -> dict[str, Any]:
        spec = job.spec
        finished = job.record.finished or (time.time() if job.record.started else 0.0)
        return {
            "id": job.id,
            "status": job.status,
            "agent": spec.settings.get("agent", ""),
            "name": spec.settings.get("name", ""),
            "model": job.record.model or spec.settings.get("model", ""),
            "cost": round(job.cost().session, 6),
            "seconds": round(finished - job.record.started, 1) if job.record.started else None,
            "created": job.record.created,
            "prompt": job.spec.prompt.strip().split("\n", 1)[0][:PROMPT_SHOWN],
            "parent": job.record.parent,
        }

    async def job_table(self) -> Messages:
        waiter = Waiter()
        self.job_tables.add(waiter)
        try:
            yield msg("rows", {"reset": True, "rows": [self.job_row(j) for j in self.jobs.all()]})
            while not self.closing.is_set():
                if not await waiter.wait(KEEPALIVE):
                    yield None
                    continue
                await asyncio.sleep(TABLE_EVERY)
                ids, waiter.dirty = waiter.dirty, set()
                rows, gone = [], []
                for jid in sorted(ids):
                    job = self.jobs.find(jid)
                    if job is None:
                        if self.sessions.find(jid) is None:
                            gone.append(jid)
                    else:
                        rows.append(self.job_row(job))
                if rows or gone:
                    yield msg("rows", {"rows": rows, "gone": gone})
        finally:
            self.job_tables.discard(waiter)


def _last_prompts(sessions: list[Session]) -> list[str]:
    return [s.last_prompt for s in sessions]


def _size(path: os.PathLike[str] | str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_at(path: os.PathLike[str] | str, offset: int, count: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(count)
    except OSError:
        return b""
