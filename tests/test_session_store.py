"""A session's files: metadata saved off the event loop (the latest wins, crash-safe, on disk
after a close), usage counted without `asdict`, the chat and history appends, the bus's wake-ups."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from ollie.agent import session as session_module
from ollie.agent.events import Bus
from ollie.agent.session import SessionMeta, SessionStore
from ollie.types import Usage


def stored(store: SessionStore) -> dict:
    return json.loads((store.dir / "meta.json").read_text())


def until(cond, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


@pytest.fixture
def store(tmp_path):
    s = SessionStore("s1", tmp_path)
    s.create()
    yield s
    s.close()


@pytest.fixture
def slow_fsync(monkeypatch):
    """fsync blocks until the test opens the gate; yields (gate, threads that fsynced)."""
    gate, threads = threading.Event(), []
    real = os.fsync

    def fsync(fd):
        threads.append(threading.current_thread().name)
        assert gate.wait(10)
        real(fd)

    monkeypatch.setattr(session_module.os, "fsync", fsync)
    yield gate, threads
    gate.set()


def test_meta_json_holds_every_field_as_asdict_did(store):
    meta = SessionMeta(id="s1", backend="openai", model="m", children={"cost": 0.5}, usage=Usage(3, 4).to_dict())
    meta.env, meta.params, meta.notes, meta.context_size = {"A": "b"}, {"top_k": 3}, ["n"], [10, 100]
    store.save_meta(meta)
    assert stored(store) == json.loads(json.dumps(asdict(meta)))
    assert SessionStore("s1", store.root).load_meta() == meta


def test_a_deferred_save_is_written_by_a_worker_and_the_latest_wins(store, slow_fsync):
    gate, threads = slow_fsync
    meta = SessionMeta(id="s1")
    gate.set()
    store.save_meta(meta, wait=False)  # a store's first save is written at once: the session exists
    assert threads == ["MainThread"] and stored(store)["name"] == ""
    gate.clear()
    for name in ("a", "b", "c", "d"):
        meta.name = name
        store.save_meta(meta, wait=False)  # returns while the worker is held in fsync
    until(lambda: threads[1:] == ["ollie-meta"])  # the worker writes, the caller went on
    assert stored(store)["name"] == ""  # nothing replaced yet: the old file, whole
    gate.set()
    store.flush()
    assert stored(store)["name"] == "d"
    assert len(threads) <= 3  # the first save, perhaps one already taken ("a"), then only the latest
    assert not [p for p in os.listdir(store.dir) if p.endswith(".tmp")]


def test_a_waited_save_supersedes_a_queued_one(store, slow_fsync):
    gate, _ = slow_fsync
    gate.set()
    meta = SessionMeta(id="s1")
    store.save_meta(meta)
    gate.clear()
    meta.name = "queued"
    store.save_meta(meta, wait=False)
    meta.name = "now"
    threading.Timer(0.1, gate.set).start()
    store.save_meta(meta)  # waits for the write in progress, then writes its own
    assert stored(store)["name"] == "now"
    store.flush()
    assert stored(store)["name"] == "now"


def test_close_rename_and_load_see_the_latest_save(tmp_path, slow_fsync):
    gate, _ = slow_fsync
    gate.set()
    store = SessionStore("a", tmp_path)
    store.create()
    meta = SessionMeta(id="a")
    store.save_meta(meta)
    gate.clear()
    meta.name = "one"
    store.save_meta(meta, wait=False)
    threading.Timer(0.1, gate.set).start()
    store.rename("b")  # the write goes to the old place first, then everything moves
    assert stored(store)["name"] == "one"
    gate.clear()
    meta.name = "two"
    store.save_meta(meta, wait=False)
    threading.Timer(0.1, gate.set).start()
    assert SessionStore("b", tmp_path).load_meta().name == "two"
    meta.name = "three"
    store.save_meta(meta, wait=False)
    store.close()
    assert stored(store)["name"] == "three" and os.listdir(tmp_path) == ["b"]


def test_a_failed_write_leaves_the_old_file_and_is_reported(store, monkeypatch):
    meta = SessionMeta(id="s1", name="old")
    store.save_meta(meta)

    def fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_module.os, "fsync", fsync)
    meta.name = "new"
    store.save_meta(meta, wait=False)
    with pytest.raises(OSError, match="No space"):
        store.flush()
    assert stored(store)["name"] == "old"
    assert not [p for p in os.listdir(store.dir) if p.endswith(".tmp")]
    store.flush()  # reported once
    monkeypatch.undo()
    store.save_meta(meta, wait=False)
    store.flush()
    assert stored(store)["name"] == "new"


def test_what_waits_is_written_at_exit(tmp_path):
    code = f"""
import os, time
from pathlib import Path
from ollie.agent import session
from ollie.agent.session import SessionMeta, SessionStore
store = SessionStore("s1", Path({str(tmp_path)!r}))
store.create()
meta = SessionMeta(id="s1")
store.save_meta(meta)
real = os.fsync
session.os.fsync = lambda fd: (time.sleep(0.3), real(fd))
for name in ("a", "b", "last"):
    meta.name = name
    store.save_meta(meta, wait=False)
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert json.loads((tmp_path / "s1" / "meta.json").read_text())["name"] == "last"


def test_usage_helpers_match_asdict():
    u = Usage(1, 2, 3, 4, 5, cost=0.25, estimated=True)
    assert u.to_dict() == asdict(u) and list(u.to_dict()) == list(asdict(u))
    assert Usage().not_numbers() == []
    assert Usage(input_tokens="7", cost="x").not_numbers() == ["input_tokens", "cost"]  # type: ignore[arg-type]


async def test_a_turn_saves_off_the_loop_and_close_leaves_exact_usage_and_cost(cores, slow_fsync):
    gate, threads = slow_fsync
    gate.set()
    usage = {"input_tokens": 1000, "output_tokens": 10, "cost": 0.125}
    core, *_ = await cores.open([{"text": "a", "usage": usage}, {"text": "b", "usage": usage}])
    store = core.session.store
    threads.clear()
    gate.clear()
    await core.submit("one")  # its end's save waits in a worker's fsync; the loop went on
    until(lambda: threads == ["ollie-meta"])
    gate.set()
    await core.submit("two")
    await cores.close(core)
    meta = stored(store)
    assert meta["usage"] == core.usage().to_dict() == Usage(2000, 20, requests=2, cost=0.25).to_dict()
    assert meta["cost_session"] == 0.25 and meta["cost_last"] == 0.125
    assert meta["first_prompt"] == "one"


async def test_chat_offsets_and_history_lines_are_exact(cores):
    core, *_ = await cores.open([{"text": "héllo"}, {"text": "wörld"}])
    await core.submit("ünï")
    first = core.prompt_offset
    await core.submit("two")
    chat = core.session.chat_path.read_bytes()
    assert first == 0 and chat[core.prompt_offset :].startswith(b"user: two\n")
    assert chat.decode() == "user: ünï\nassistant: héllo\n\nuser: two\nassistant: wörld\n\n"
    lines = (core.session.store.dir / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["content"] for line in lines] == ["ünï", "héllo", "two", "wörld"]


def test_a_new_store_appends_to_a_history_it_made_without_scanning_it(tmp_path, monkeypatch):
    scans: list[Path] = []
    real = session_module._drop_torn_line
    monkeypatch.setattr(session_module, "_drop_torn_line", lambda p: (scans.append(p), real(p)))
    from ollie.types import Message

    made = SessionStore("new", tmp_path)
    made.create()
    made.append_messages([Message("user", "x"), Message("assistant", "y")])
    made.close()
    assert scans == []
    again = SessionStore("new", tmp_path)  # a restored session: its last line may be torn
    again.append_messages([Message("user", "z")])
    again.close()
    assert len(scans) == 1
    assert [m.content for m in SessionStore("new", tmp_path).load_history()] == ["x", "y", "z"]


async def test_the_bus_wakes_every_waiter_at_the_next_change_and_only_then(store):
    bus = Bus(store)
    bus.notify()  # no one waits: nothing is kept for later waiters
    waiters = [asyncio.ensure_future(bus.changed()) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)
    bus.notify()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    late = asyncio.ensure_future(bus.changed())
    await asyncio.sleep(0.01)
    assert not late.done()
    bus.set_state("thinking")  # a state event is a change
    await asyncio.wait_for(late, 1)


async def test_streamed_text_reaches_the_chat_and_the_subscribers_as_one_event_a_window(store, tmp_path, monkeypatch):
    """The model's first piece in a while is sent at once (the first token shows without delay);
    the pieces after it within STREAM_EVERY are held and sent together, by the loop's one timer or
    at once when another event comes, which then follows them, in the chat log as for the
    subscribers; a subscriber always finds in the chat what its event says."""
    from ollie.agent import events as events_module
    from ollie.types import Event

    monkeypatch.setattr(events_module, "STREAM_EVERY", 0.05)
    store.create()
    other_store = SessionStore("s2", tmp_path)
    other_store.create()
    bus, other = Bus(store), Bus(other_store)
    seen: list[tuple[str, str, bytes]] = []
    bus.subscribe(lambda ev: seen.append((ev.kind, ev.text, store.chat_path.read_bytes())))
    for piece in ("Hel", "lo ", "world"):
        bus.stream("assistant", piece)
    other.stream("reasoning", "x")
    other.stream("reasoning", "y")  # another session's held text, sent by the same timer
    assert [(k, t) for k, t, _ in seen] == [("assistant", "Hel")]  # at once: nothing came before
    assert seen[0][2].endswith(b"assistant: Hel") and other_store.chat_path.read_bytes().endswith(b"reasoning: x")
    await asyncio.sleep(0.2)
    assert [(k, t) for k, t, _ in seen] == [("assistant", "Hel"), ("assistant", "lo world")]
    assert seen[1][2].endswith(b"assistant: Hello world")
    assert other_store.chat_path.read_bytes().endswith(b"reasoning: xy")
    bus.emit(Event("assistant", "!"))  # an emitted piece is streamed the same way: none came lately
    bus.stream("reasoning", "hm")  # held: text was sent just now
    bus.set_state("thinking")  # any other event sends what is held first, then itself
    assert [(k, t) for k, t, _ in seen[2:]] == [("assistant", "!"), ("reasoning", "hm"), ("state", "thinking")]
    assert b"Hello world!\nreasoning: hm" in seen[-1][2]
    bus.stream("assistant", "last")
    bus.flush()  # what a session's close does
    assert seen[-1][:2] == ("assistant", "last")
    await asyncio.sleep(0.1)
    assert len(seen) == 6  # nothing sent twice
    other_store.close()


def test_streamed_text_outside_a_loop_is_sent_at_once(store):
    store.create()
    bus = Bus(store)
    seen: list[str] = []
    bus.subscribe(lambda ev: seen.append(ev.text))
    bus.stream("assistant", "now")
    assert seen == ["now"] and store.chat_path.read_bytes().endswith(b"assistant: now")
