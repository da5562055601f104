"""No backend configured: look for a model server on this machine (Ollama, LM Studio, llama.cpp,
on their default loopback ports or where OLLAMA_HOST, OLLIE_OLLAMA_URL, … point) and offer it;
else say plainly what the embedded model is, and how to configure a provider."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .. import backends, config
from ..backends.ollama import base_url_from_env
from ..backends.openai import with_v1
from ..keys import set_var
from ..types import ConfigError

if TYPE_CHECKING:
    from .client import Namespace

# (backend name, what it is, the variable that moves it, its default port)
SERVERS = (
    ("ollama", "Ollama", "OLLIE_OLLAMA_URL", 11434),
    ("lmstudio", "LM Studio", "OLLIE_LMSTUDIO_URL", 1234),
    ("llamacpp", "a llama.cpp server", "OLLIE_LLAMACPP_URL", 8080),
)
PROBE_TIMEOUT = 0.5

EMBEDDED = (
    "No backend is configured, so this session runs on the embedded model, SmolLM2-135M: a 135M-parameter\n"
    "demo that runs offline but cannot do real work. To use a provider, store its key with\n"
    "  ollie keys set anthropic      (or openai, openrouter)\n"
    "or set OLLIE_BACKEND (`ollie backends` lists them)."
)


def configured() -> bool:
    """A backend is set (OLLIE_BACKEND, a provider's key), or the default agent names one."""

    if backends.default_name() != "local":
        return True
    try:
        return bool(config.load_agent("default").backend)
    except ConfigError:  # a broken config is the server's to report
        return False


def where(name: str, var: str, port: int) -> str:
    """The URL to ask whether the server is there: the one its backend would use (Ollama's
    OLLAMA_HOST counts too), at a path that answers 200 without a model."""
    if name == "ollama":
        return base_url_from_env() + "/api/tags"

    return with_v1(os.environ.get(var) or f"http://127.0.0.1:{port}") + "/models"


async def probe(url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Does an HTTP server at `url` (http only) answer GET with 200?"""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port or 80
    except ValueError:  # a port that is no number
        return False
    if parts.scheme != "http" or not host:
        return False
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        return status.split()[1:2] == [b"200"]
    except (OSError, TimeoutError, IndexError):
        return False
    finally:
        writer.close()


async def detect() -> list[tuple[str, str, str]]:
    """(backend, what it is, URL) of each model server that answers."""
    urls = [where(name, var, port) for name, _, var, port in SERVERS]
    found = await asyncio.gather(*(probe(url) for url in urls))
    return [(name, label, url) for (name, label, _, _), url, ok in zip(SERVERS, urls, found, strict=True) if ok]


async def first_run(notes: list[str]) -> str | None:
    """The backend for a new session when none is configured: one found and accepted (kept as
    OLLIE_BACKEND in the env file), else None (the embedded model). What to tell the user goes
    to `notes`, for the terminal UI to show: a line printed now would be hidden by its screen."""
    if configured():
        return None
    for name, label, url in await detect():
        at = urlsplit(url).netloc
        answer = await asyncio.to_thread(input, f"No backend is configured; {label} answers at {at}. Use it? [Y/n] ")
        if answer.strip().lower() in ("", "y", "yes"):
            path = set_var("OLLIE_BACKEND", name)
            os.environ["OLLIE_BACKEND"] = name
            notes.append(f"OLLIE_BACKEND={name} saved in {path}")
            return name
    notes.append(EMBEDDED)
    return None


async def stale_server(ns: Namespace) -> str:
    """Why new sessions will not get the backend configured now, if so: the local server reads the
    env file for each new session, but a variable of its own environment (set when it started)
    wins over the file."""

    if not ns.is_local:
        return ""
    mine = backends.default_name()
    theirs = next((ln[:-2] for ln in (await ns.read("backends")).splitlines() if ln.endswith(" *")), mine)
    if theirs == mine:
        return ""
    return (
        f"The server's default backend is {theirs}, but {mine} is configured here: the server's own"
        f" environment says so. To use {mine} for new sessions: `ollie srv stop`, then `ollie`."
    )
