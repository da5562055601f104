"""Hooks: shell commands an agent config runs at points of the loop.

Each command runs `sh -c` in the session cwd, in its own process group, with the payload as JSON on
stdin and each payload key exported as `OLLIE_<KEY>`. Exit 0: its stdout is added to the context.
Exit 2: the action is blocked and stderr says why (after postTurn or turnError, stderr becomes the
next prompt). Any other exit, a timeout or a crash: a warning, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import Core

TIMEOUT = 60.0  # seconds a hook may run
OUTPUT_LIMIT = 64 * 1024  # bytes of a hook's stdout or stderr that are kept
# Bytes of a payload value exported as OLLIE_<KEY>: the kernel refuses to start a program with a
# variable over 128 KiB. The whole payload is on stdin.
VARIABLE_LIMIT = 32 * 1024


@dataclass(frozen=True, slots=True)
class Outcome:
    blocked: bool = False
    reason: str = ""  # stderr of the blocking hook
    output: str = ""  # stdout of the hooks that exited 0, joined

    @property
    def next_prompt(self) -> str | None:
        return self.reason if self.blocked and self.reason else None


NOTHING = Outcome()


async def run(core: Core, event: str, payload: dict[str, Any]) -> Outcome:
    commands = core.agent_config.hooks.get(event)
    if not commands:
        return NOTHING
    from ..types import Event

    payload = {"event": event, "session_id": core.session_id, "cwd": core.cwd, **payload}
    outputs = []
    for cmd in commands:
        try:
            code, out, err = await run_command(cmd, payload, core.cwd, core.env)
        except OSError as e:  # it could not start: the session's cwd is gone, say
            core.emit(Event("info", f"{event} hook {cmd!r} could not start: {e}"))
            continue
        if code == 0:
            if out.strip():
                outputs.append(out.strip())
        elif code == 2:
            return Outcome(True, err.strip() or f"{event} hook {cmd!r} exited 2", "\n".join(outputs))
        else:
            core.emit(Event("info", f"{event} hook {cmd!r} {_describe(code)}: {err.strip()[:500]}"))
    return Outcome(False, "", "\n".join(outputs))


def _describe(code: int | None) -> str:
    return f"timed out after {TIMEOUT:g} s and was killed" if code is None else f"exited {code}"


async def run_command(cmd: str, payload: dict[str, Any], cwd: str, session_env: dict[str, str],
                      timeout: float | None = None) -> tuple[int | None, str, str]:
    """Run one hook; returns (exit code or None on timeout, stdout, stderr), outputs capped."""
    env = {**os.environ, **session_env}
    for key, value in payload.items():
        text = value if isinstance(value, str) else json.dumps(value)
        env[f"OLLIE_{key.upper()}"] = text.replace("\0", "").encode()[:VARIABLE_LIMIT].decode(errors="ignore")
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", cmd, cwd=cwd or None, env=env, start_new_session=True,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(
            _communicate(proc, json.dumps(payload).encode()), timeout if timeout is not None else TIMEOUT
        )
    except (TimeoutError, asyncio.CancelledError) as e:
        _kill_group(proc)
        await proc.wait()
        if isinstance(e, asyncio.CancelledError):
            raise
        return None, "", f"(killed after {timeout or TIMEOUT:g} s)"
    return proc.returncode, out, err


async def _communicate(proc: asyncio.subprocess.Process, data: bytes) -> tuple[str, str]:
    async def feed() -> None:
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the hook need not read its payload
        finally:
            proc.stdin.close()

    out, err, _ = await asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr), feed())
    await proc.wait()
    return out, err


async def _read_capped(stream: asyncio.StreamReader) -> str:
    """Read to EOF, keeping OUTPUT_LIMIT bytes (the rest is drained so the hook never blocks)."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = OUTPUT_LIMIT - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode(errors="replace")
    return text + (f"\n[hook output truncated: {dropped} more bytes]" if dropped else "")


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
