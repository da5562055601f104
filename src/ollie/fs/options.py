"""Where the file server listens and what it writes beside its socket: read by `ollie srv` to start,
stop or find a server without importing the server itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import config


@dataclass
class Options:
    socket: Path
    mount: Path | None  # None: no FUSE mount
    tcp: tuple[str, int] | None = None
    token: str = ""
    web: tuple[str, int] | None = None  # the web page's address (ollie.web), off when None
    web_token: str = ""  # its token; generated when empty

    @property
    def pid_file(self) -> Path:
        return self.socket.with_name(self.socket.name + ".pid")

    @property
    def log_file(self) -> Path:
        return self.socket.with_name(self.socket.name + ".log")

    @property
    def token_file(self) -> Path:
        return self.socket.with_name(self.socket.name + ".token")

    @property
    def web_file(self) -> Path:
        """The web page's address with its token (0600): what `ollie web` prints."""
        return self.socket.with_name(self.socket.name + ".web")


def default_options() -> Options:
    return Options(socket=config.socket_path(), mount=config.mount_path())
