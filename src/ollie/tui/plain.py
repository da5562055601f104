"""Line output, for when stdout is no terminal: the chat as it is, each line read from stdin sent.

    echo "what is here?" | ollie > log

The conversation so far is printed first; each line of stdin is written to `prompt` (a `/command`
or `!cmd` too: there it runs as the server runs it, sandboxed), and what the chat gains is printed
until the session is idle again. At the end of stdin it returns; the session stays. The chat is
printed escaped (`visible`), whatever server wrote it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import IO

from ..chatfmt import PROMPT_PREFIX, visible
from .client import ChatReader, Namespace

QUIET = 0.3  # seconds without new chat, once idle, that end a line's output
START_WAIT = 2.0  # seconds a prompt's turn has to show a state other than idle


async def run_plain(ns: Namespace, sid: str, stdin: IO[str], stdout: IO[str]) -> int:
    reader = ChatReader(ns, sid)
    stdout.write(visible(await reader.read_new()))
    stdout.flush()
    print(visible(f"session: {sid}"), file=sys.stderr)
    while line := await asyncio.to_thread(stdin.readline):
        if not line.strip():
            continue
        await ns.write(f"s/{sid}/prompt", line)
        await _drain(ns, sid, reader, stdout, is_prompt=not line.lstrip().startswith(("/", "!")))
    return 0


async def _drain(ns: Namespace, sid: str, reader: ChatReader, stdout: IO[str], is_prompt: bool) -> None:
    """Print what the chat gains until the line's work is done."""
    started = not is_prompt
    since = time.monotonic()
    quiet_since = since
    while True:
        text = await reader.read_new()
        now = time.monotonic()
        if text:
            stdout.write(visible(text))
            stdout.flush()
            quiet_since = now
            started = started or f"\n{PROMPT_PREFIX}" in "\n" + text
            continue
        state = (await ns.read(f"s/{sid}/state")).strip()
        if state != "idle":
            started = True
        elif (started or now - since > START_WAIT) and now - quiet_since > QUIET:
            return
        await asyncio.sleep(0.05)
