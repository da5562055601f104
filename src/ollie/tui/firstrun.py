"""No backend configured: look for a model server on this machine (Ollama, LM Studio, llama.cpp)
and offer it; else say plainly what the embedded model is, and how to configure a provider."""

from __future__ import annotations

import asyncio
import os
import sys

# (backend name, what it is, port, a path it answers on)
SERVERS = (
    ("ollama", "Ollama", 11434, "/api/tags"),
    ("lmstudio", "LM Studio", 1234, "/v1/models"),
    ("llamacpp", "a llama.cpp server", 8080, "/v1/models"),
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
    from .. import backends, config
    from ..types import ConfigError

    if backends.default_name() != "local":
        return True
    try:
        return bool(config.load_agent("default").backend)
    except ConfigError:  # a broken config is the server's to report
        return False


async def probe(port: int, path: str, host: str = "127.0.0.1", timeout: float = PROBE_TIMEOUT) -> bool:
    """Does an HTTP server on loopback `port` answer GET `path` with 200?"""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        return status.split()[1:2] == [b"200"]
    except (OSError, TimeoutError, IndexError):
        return False
    finally:
        writer.close()


async def detect() -> list[tuple[str, str, int]]:
    found = await asyncio.gather(*(probe(port, path) for _, _, port, path in SERVERS))
    return [(name, label, port) for (name, label, port, _), ok in zip(SERVERS, found, strict=True) if ok]


async def first_run() -> str | None:
    """The backend for a new session when none is configured: one found and accepted (kept as
    OLLIE_BACKEND in the env file), else None (the embedded model, said so)."""
    if configured():
        return None
    for name, label, port in await detect():
        answer = await asyncio.to_thread(
            input, f"No backend is configured; {label} answers on port {port}. Use it? [Y/n] "
        )
        if answer.strip().lower() in ("", "y", "yes"):
            from .keys import set_var

            path = set_var("OLLIE_BACKEND", name)
            os.environ["OLLIE_BACKEND"] = name
            print(f"OLLIE_BACKEND={name} saved in {path}")
            return name
    print(EMBEDDED, file=sys.stderr)
    return None
