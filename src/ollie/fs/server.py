"""The serving process: one asyncio loop holding every session, serving one namespace over 9P (a
Unix socket, TCP when asked), a FUSE mount, and the web page when asked (ollie.web).

Files beside the socket (`$NAMESPACE/ollie`, in a 0700 directory): `ollie.pid`, `ollie.log` (the
daemon's output), `ollie.token` (0600, when TCP is served), `ollie.web` (0600: the web page's
address with its token, when it is served; see ollie.web).

Killed sessions past their retention are pruned at start and every transcripts.PRUNE_INTERVAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as E
import gc
import logging
import os
import resource
import secrets
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config
from ..vfs.fuse import Mount
from ..vfs.ninep_server import serve_tcp, serve_unix
from . import transcripts, tree, view
from .jobs import Jobs
from .options import Options
from .sessions import Sessions

if TYPE_CHECKING:
    from ..web.app import Web

log = logging.getLogger("ollie.fs.server")

# The cyclic collector's young generation, in container allocations. At Python's 700, a server of
# 500 streaming sessions collected 50 times a second: 1.0 s of its CPU in bench/agents.py's run
# without the sandbox (two turns), 1,000 collections. At this: 0.07 s, 10 collections.
GC_YOUNG = 20_000


class Server:
    """Start, serve, stop. Sessions stored on disk are registered (asleep) at start."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.listeners: list = []
        self.mount: Mount | None = None
        self.sessions: Sessions | None = None
        self.jobs: Jobs | None = None
        self._pruner: asyncio.Task | None = None
        self.web: Web | None = None

    async def start(self) -> None:
        _raise_fd_limit()
        if pruned := transcripts.prune():  # a bad OLLIE_TRANSCRIPT_DAYS fails the start here
            log.info("pruned %d expired transcripts", pruned)
        sessions = self.sessions = Sessions()
        jobs = self.jobs = Jobs(sessions)
        sessions.view = lambda session, fd: view.serve(sessions, jobs, session, fd)  # before restore: sessions keep it
        restored = sessions.restore()
        jobs.restore()
        ns = tree.build(sessions, jobs)
        try:
            self.listeners.append(await serve_unix(ns, self.opts.socket))
            if self.opts.tcp:
                token = self.opts.token or secrets.token_urlsafe(24)
                _write_private(self.opts.token_file, token + "\n")
                with _port("9P", self.opts.tcp, "--tcp"):
                    self.listeners.append(await serve_tcp(ns, *self.opts.tcp, token=token))
            if self.opts.mount is not None:
                self.mount = Mount(ns, str(self.opts.mount))
                await self.mount.start()
            if self.opts.web:
                from ..web.app import Web

                with _port("the web page", self.opts.web, "`ollie web --addr`, `ollie srv start --web`"):
                    self.web = Web(ns, sessions, jobs, *self.opts.web, token=self.opts.web_token)
                await self.web.start()
                _write_private(self.opts.web_file, self.web.url + "\n")
            _write_private(self.opts.pid_file, f"{os.getpid()}\n{self.opts.mount or ''}\n")
            self._pruner = asyncio.create_task(_prune_periodically())
        except BaseException:
            await self.stop()
            raise
        log.info(
            "serving %s (%d stored sessions) on %s%s",
            config.data_path(),
            restored,
            self.opts.socket,
            f", mounted at {self.opts.mount}" if self.mount else "",
        )

    async def stop(self) -> None:
        """Stop listening, detach the mount, close every session (their state is on disk; their
        jails held copies of the mount), then see the mount end, and remove our files."""
        if self._pruner is not None:
            self._pruner.cancel()
        if self.web is not None:
            await self.web.stop()
            self.web = None
        for listener in self.listeners:
            await listener.close()
        self.listeners = []
        if self.mount is not None:
            await self.mount.unmount(meanwhile=self._close_sessions)
            self.mount = None
        else:
            await self._close_sessions()
        for path in (self.opts.pid_file, self.opts.token_file, self.opts.web_file):
            path.unlink(missing_ok=True)

    async def _close_sessions(self) -> None:
        if self.jobs is not None:
            await self.jobs.close()
        if self.sessions is not None:
            await self.sessions.close()


async def _prune_periodically() -> None:
    while True:
        await asyncio.sleep(transcripts.PRUNE_INTERVAL)
        await asyncio.to_thread(transcripts.prune)  # rmtree of large sessions: off the loop


def _raise_fd_limit() -> None:
    """Each session that has run keeps its chat and history open: 1,000 sessions need more than
    the usual soft limit of 1,024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class PortTaken(OSError):
    def __str__(self) -> str:
        return self.strerror or ""


@contextlib.contextmanager
def _port(what: str, where: tuple[str, int], flags: str):
    """A listener's start, whose port another program holding it is said in words, with the way out."""
    try:
        yield
    except OSError as e:
        if e.errno != E.EADDRINUSE:
            raise
        host, port = where
        raise PortTaken(
            E.EADDRINUSE, f"{what} cannot listen on {host}:{port}: another program does; give it another port ({flags})"
        ) from None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def serve(opts: Options, ready_fd: int | None = None) -> None:
    """Run until SIGTERM or SIGINT. `ready_fd` gets "ok" once serving, or the error, then closed."""
    server = Server(opts)
    try:
        await server.start()
    except Exception as e:
        _tell(ready_fd, f"error: {e}")
        raise
    _collect_less()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)  # after the mount: libfuse installs handlers of its own
    _tell(ready_fd, "ok")
    try:
        await stop.wait()
    finally:
        await server.stop()


def _collect_less() -> None:
    """What the server imported and set up stays for its life: out of the collector's scans
    (gc.freeze); and its young objects collected less often (GC_YOUNG)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])


def _tell(fd: int | None, message: str) -> None:
    if fd is not None:
        try:
            os.write(fd, (message + "\n").encode())
        finally:
            os.close(fd)
