"""Jails: helper processes that start sandboxed programs in fresh namespaces (private; no stable API).

A `Jail` is one `_jaild.py` process, started once and then asked over a socket to start each
program: the program forks from that small process (not from ollie's, whose fork copies the page
tables of every SDK it imported) and runs with the Landlock ruleset, seccomp filter and limits of a
`_sandbox.Sandbox`. Everything a jail started dies when the jail is closed or its owner exits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .types import ConfigError

_JAILD = str(Path(__file__).with_name("_jaild.py"))
_START_TIMEOUT = 10.0


class JailError(ConfigError):
    """The jail could not start, or could not start a program."""


@dataclass(frozen=True, slots=True)
class JailSetup:
    """What is fixed for a jail's life: its network, its PID budget, its private /tmp and what it
    hides."""

    network: bool
    processes: int
    tmp_size: int
    hide: tuple[str, ...]


class Stage:
    """A program started in a jail; `exited` resolves to its exit status (negative: the signal).
    Await it shielded (or through asyncio.wait): cancelling an awaiter would cancel it."""

    def __init__(self, jail: Jail, rid: int):
        self._jail, self._rid = jail, rid
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def kill(self) -> None:
        """SIGKILL the program's process group (the jail does it: the group is not visible here)."""
        if self._rid in self._jail._stages:  # until the jail reports the exit
            self._jail._post({"op": "kill", "id": self._rid})


class Jail:
    def __init__(self, setup: JailSetup, sock: socket.socket):
        self.setup = setup
        self.namespaces_refused = ""  # why the jail runs without namespaces, when it does
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stages: dict[int, Stage] = {}
        self._ready: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._gone: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), self._receive)

    @classmethod
    async def start(cls, setup: JailSetup) -> Jail:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        config = {**asdict(setup), "fd": theirs.fileno()}
        try:
            # A clean environment: the helper needs nothing from ollie's, least of all its API keys.
            helper = subprocess.Popen([sys.executable, "-I", "-S", _JAILD, json.dumps(config)], env={},
                                      stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        except OSError as e:
            ours.close()
            raise JailError(f"cannot start the sandbox helper: {e.strerror}") from None
        finally:
            theirs.close()
        jail = cls(setup, ours)
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                hello = await jail._ready
        except BaseException:
            await jail.close()
            raise
        finally:
            await asyncio.to_thread(helper.wait)  # the first process exits once the jail's PID 1 runs
        if not hello.get("ready"):
            await jail.close()
            raise JailError(f"the sandbox could not set up its namespaces: {hello.get('error')}")
        jail.namespaces_refused = hello.get("namespaces", "")
        return jail

    async def spawn(self, spec: dict[str, Any], *, ruleset: int, stdin: int, stdout: int, stderr: int) -> Stage:
        """Start `spec` (argv, cwd, env, rlimits, seccomp, expose, jail_rules); the fds are sent to
        the jail, and the caller keeps (and closes) its own."""
        rid = next(self._ids)
        reply = self._replies[rid] = self._loop.create_future()
        stage = self._stages[rid] = Stage(self, rid)
        memfd = os.memfd_create("ollie-stage", os.MFD_CLOEXEC)  # argv and env may not fit in a packet
        try:
            os.write(memfd, json.dumps(spec).encode())
            names, fds = ["spec", "stdin", "stdout", "stderr"], [memfd, stdin, stdout, stderr]
            if ruleset >= 0:
                names.append("ruleset")
                fds.append(ruleset)
            await self._send({"op": "spawn", "id": rid, "fds": names}, fds)
        finally:
            os.close(memfd)
        try:
            answer = await reply
        finally:
            self._replies.pop(rid, None)
        if "error" in answer:
            self._stages.pop(rid, None)
            raise JailError(answer["error"])
        return stage

    async def close(self) -> None:
        """End the jail and everything in it; returns once the helper is gone."""
        if not self._gone.done():
            try:
                self._sock.shutdown(socket.SHUT_WR)  # the jail sees EOF, kills all, exits
            except OSError:
                pass
            try:
                await asyncio.wait_for(asyncio.shield(self._gone), 5)
            except TimeoutError:
                self._end("the sandbox helper did not exit")
        self._sock.close()

    @property
    def alive(self) -> bool:
        return not self._gone.done()

    def _post(self, message: dict[str, Any]) -> None:
        try:
            self._sock.send(json.dumps(message).encode())
        except BlockingIOError:
            self._loop.create_task(self._send(message, []))
        except OSError:
            pass  # the jail is gone, and its programs with it

    async def _send(self, message: dict[str, Any], fds: list[int]) -> None:
        data = json.dumps(message).encode()
        while True:
            if self._gone.done():
                raise JailError("the sandbox helper has exited")
            try:
                socket.send_fds(self._sock, [data], fds)
                return
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._sock.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._sock.fileno())
            except OSError as e:
                raise JailError(f"the sandbox helper is unreachable: {e.strerror}") from None

    def _receive(self) -> None:
        try:
            data = self._sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end("the sandbox helper exited")
            return
        message = json.loads(data)
        if not self._ready.done():
            self._ready.set_result(message)
            return
        rid = message.get("id")
        if "status" in message:
            stage = self._stages.pop(rid, None)
            if stage is not None and not stage.exited.done():
                stage.exited.set_result(message["status"])
        elif rid in self._replies and not self._replies[rid].done():
            self._replies[rid].set_result(message)

    def _end(self, why: str) -> None:
        self._loop.remove_reader(self._sock.fileno())
        if not self._gone.done():
            self._gone.set_result(None)
        if not self._ready.done():
            self._ready.set_result({"ready": False, "error": why})
        for future in self._replies.values():
            if not future.done():
                future.set_result({"error": why})
        for stage in self._stages.values():
            if not stage.exited.done():
                stage.exited.set_exception(JailError(why))
        self._stages.clear()
