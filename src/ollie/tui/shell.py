"""`!cmd` in the terminal: the user's own shell, in the session's directory, with the session's env.

Unlike a `!cmd` written to `prompt` (sandboxed, as the model's code runs: anyone who may write the
file may send one), this runs as the user at the keyboard, unsandboxed, like any command they type
in a shell. Its output is offered to the model with the next prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

TIMEOUT = 300.0
ATTACH_MAX = 16_000  # characters of output sent to the model (the middle is cut)


async def run_shell(cmd: str, cwd: str, env: dict[str, str], timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run `cmd` with $SHELL (else sh); (exit status, stdout and stderr together)."""
    shell = env.get("SHELL") or os.environ.get("SHELL") or "/bin/sh"
    proc = await asyncio.create_subprocess_exec(
        shell,
        "-c",
        cmd,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as e:
        # The whole group: a child left holding the output (`sleep 60; …`) would keep the wait
        # going until it ended.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if isinstance(e, asyncio.CancelledError):
            raise
        return 124, f"(killed after {timeout:.0f} s)"
    return proc.returncode or 0, out.decode(errors="replace").rstrip("\n")


def attachment(cmd: str, code: int, out: str) -> str:
    """What the model is told of a `!cmd` the user ran."""
    if len(out) > ATTACH_MAX:
        half = ATTACH_MAX // 2
        out = f"{out[:half]}\n[... {len(out) - ATTACH_MAX} characters cut ...]\n{out[-half:]}"
    status = f" (exit status {code})" if code else ""
    return f"I ran `{cmd}` in my shell{status}; its output:\n```\n{out}\n```"
