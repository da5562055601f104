"""The terminal's way to the sessions: the file interface, spoken over 9P.

The local server is reached on its Unix socket (started with `ollie srv start` when none runs), a
remote one over TCP with its token; either way the terminal reads and writes the same files that
scripts and other agents use on the mount (docs/files.md), so nothing here knows the agent's code.

    ns = await Namespace.local()                    # or Namespace.remote("tcp!host!5640", token)
    sid = await ns.new_session(cwd="/src")
    await ns.write(f"s/{sid}/prompt", "hello")
    print(await ns.read(f"s/{sid}/state"))
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .. import config
from ..chatfmt import PROMPT_PREFIX
from ..vfs import ninep as P
from ..vfs.ninep_client import Client, RemoteError

START_TIMEOUT = 90.0  # `ollie srv start` waits up to 60 s for the server itself


class Unreachable(Exception):
    """No server answers at the address (and, for the local one, none could be started)."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A line of `s/idx`."""

    id: str
    state: str
    cwd: str
    backend: str
    model: str


def parse_index(text: str) -> list[SessionInfo]:
    out = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) >= 5:
            out.append(SessionInfo(*fields[:5]))
    return out


def default_socket() -> str:
    return str(config.socket_path())


class Namespace:
    """A connection to a server's namespace: whole-file reads and writes, and the few operations
    the terminal needs on top (a new session, the index, the chat as it grows)."""

    def __init__(self, client: Client, addr: str, local: bool):
        self.client, self.addr, self.is_local = client, addr, local

    @classmethod
    async def remote(cls, addr: str, token: str) -> Namespace:
        try:
            return cls(await Client.connect(addr, token=token), addr, local=False)
        except RemoteError as e:
            if e.errno != errno.EACCES:
                raise
            why = "the token given is not the server's" if token else "no token was given"
            raise Unreachable(
                f"{addr} refused: {why} (--token-file FILE, or $OLLIE_9P_TOKEN; the server's is in "
                "ollie.token in its namespace directory)"
            ) from None
        except (OSError, ValueError) as e:
            raise Unreachable(f"cannot reach {addr}: {e}") from None

    @classmethod
    async def local(cls, socket: str | None = None, start: bool = True) -> Namespace:
        """The local server on its socket; started first when none answers (and `start`)."""
        socket = socket or default_socket()
        addr = f"unix!{socket}"
        try:
            return cls(await Client.connect(addr), addr, local=True)
        except OSError:
            if not start:
                raise Unreachable(f"no server on {socket} (start one with `ollie srv start`)") from None
        await asyncio.to_thread(start_server, socket)
        try:
            return cls(await Client.connect(addr), addr, local=True)
        except OSError as e:
            raise Unreachable(f"the server started but {socket} does not answer: {e}") from None

    async def close(self) -> None:
        await self.client.close()

    async def wait_lost(self) -> None:
        await self.client.wait_lost()

    # ---- files ------------------------------------------------------------------------------------------
    async def read(self, path: str) -> str:
        return (await self.client.read_path(path)).decode(errors="replace")

    async def write(self, path: str, text: str) -> None:
        """Write `text` to `path` in one open (truncating); the server acts on it at the close, and
        a refusal there (a bad `ctl` line) raises RemoteError."""
        fid = await self.client.walk(path)
        try:
            await self.client.open(fid, P.OWRITE | P.OTRUNC)
            await self.client.write(fid, 0, text.encode())
        finally:
            await self.client.clunk(fid)

    async def exists(self, path: str) -> bool:
        try:
            await self.client.stat_path(path)
        except RemoteError:
            return False
        return True

    async def mtime(self, path: str) -> int:
        try:
            return (await self.client.stat_path(path)).mtime
        except RemoteError:
            return 0

    async def names(self, path: str) -> list[str]:
        return [st.name for st in await self.client.list(path)]

    # ---- sessions ---------------------------------------------------------------------------------------
    async def sessions(self) -> list[SessionInfo]:
        return parse_index(await self.read("s/idx"))

    async def new_session(self, **spec: str | None) -> str:
        """Create a session through the root `ctl`; its id is read back on the same open file."""
        line = "new " + " ".join(f"{k}={v}" for k, v in spec.items() if v) + "\n"
        fid = await self.client.walk("ctl")
        try:
            await self.client.open(fid, P.ORDWR)
            await self.client.write(fid, 0, line.encode())
            return (await self.client.read(fid, 0, 4096)).decode().strip()
        finally:
            await self.client.clunk(fid)

    async def last_session(self, cwd: str) -> str | None:
        """The session of `cwd` whose chat changed last, if any."""
        mine = [s.id for s in await self.sessions() if s.cwd == cwd]
        if not mine:
            return None
        times = await asyncio.gather(*(self.mtime(f"s/{sid}/chat") for sid in mine))
        return max(zip(times, range(len(mine)), mine, strict=True))[2]

    async def first_prompt(self, sid: str) -> str:
        """The first line of the first prompt in the session's chat (its first 4 KiB)."""
        try:
            fid = await self.client.walk(f"s/{sid}/chat")
        except RemoteError:
            return ""
        try:
            await self.client.open(fid, P.OREAD)
            head = (await self.client.read(fid, 0, 4096)).decode(errors="replace")
        finally:
            await self.client.clunk(fid)
        for line in head.split("\n"):  # the chat's lines: no other separator starts one
            if line.startswith(PROMPT_PREFIX):
                return line[len(PROMPT_PREFIX) :]
        return ""

    async def wait_state(self, sid: str) -> AsyncIterator[str]:
        """The session's state now, then each time it changes (from `statewait`, which blocks up
        to 5 s and then repeats the state: repeats are passed on, so callers see a heartbeat).
        `statewait` is opened before `state` is read: it waits for a change from the state at its
        open, so a turn that starts between the two is news to it, not its starting point."""
        fid = await self.client.walk(f"s/{sid}/statewait")
        try:
            await self.client.open(fid, P.OREAD)
            yield (await self.read(f"s/{sid}/state")).strip()
            while True:
                yield (await self.client.read(fid, 0, 256)).decode().strip()
        finally:
            await asyncio.shield(self._clunk_quietly(fid))

    async def _clunk_quietly(self, fid: int) -> None:
        try:
            await self.client.clunk(fid)
        except RemoteError:
            pass


class ChatReader:
    """Reads what the session's `chat` gained since the last call (decoded, a split UTF-8
    sequence kept for the next call). A chat that shrank (a session file replaced) starts over."""

    def __init__(self, ns: Namespace, sid: str, offset: int = 0):
        self.ns, self.path, self.offset = ns, f"s/{sid}/chat", offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    async def read_new(self) -> str:
        client = self.ns.client
        try:
            fid = await client.walk(self.path)
        except RemoteError as e:
            if e.errno != errno.ENOENT:
                raise  # the connection is started again, not left showing nothing
            return ""  # not written yet
        parts: list[str] = []
        try:
            await client.open(fid, P.OREAD)
            while chunk := await client.read(fid, self.offset, client.iounit):
                self.offset += len(chunk)
                parts.append(self._decoder.decode(chunk))
        finally:
            await client.clunk(fid)
        return "".join(parts)


class Connection:
    """How to (re)connect: the local server's socket or a remote address with its token."""

    def __init__(self, addr: str | None = None, token: str = "", socket: str | None = None):
        self.addr, self.token, self.socket = addr, token, socket

    async def connect(self, start: bool = True) -> Namespace:
        if self.addr:
            return await Namespace.remote(self.addr, self.token)
        return await Namespace.local(self.socket, start=start)


def start_server(socket: str) -> None:
    """`ollie srv start` for `socket`, in a process of its own; raises Unreachable with its words
    when it does not start."""
    argv = [*config.own_command(), "srv", "start", "--socket", socket]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        raise Unreachable(f"`ollie srv start` did not answer in {START_TIMEOUT:.0f} s") from None
    if out.returncode != 0 and "already running" not in out.stderr:
        raise Unreachable((out.stderr or out.stdout).strip() or "`ollie srv start` failed")
