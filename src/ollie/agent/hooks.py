"""Hooks: shell commands an agent config runs at points of the loop.

Each command runs `sh -c` in the session cwd, in its own process group, with the payload as JSON on
stdin and each payload key exported as `OLLIE_<KEY>`.

Exit 0: its stdout is added to the context, for every event. agentSpawn's becomes part of the
system prompt (so compaction and /clear keep it); preTurn's is appended to the prompt; preTool's
and postTool's to the tool's result; postTurn's and turnError's ride with the next prompt;
preCompact's and postCompact's are appended to the summary that replaces the history. (A result
a postTool hook withholds is replaced by its reason whole, preTool's output with it.)
Exit 2: the action is blocked and stderr says why (after postTurn or turnError, stderr becomes the
next prompt). Any other exit, a timeout or a crash: a warning, and the loop goes on.

Hooks run sandboxed, under the agent's `hookSandbox` policy (built in: `hooks`, the default policy
with the cwd read-only): the model writes the cwd, and a hook runs what it finds there (`make`, a
`git` that reads `.git/config`). A hook whose command is a file the agent's code can write is
refused unless the config says `trustWritableHooks`. `"hookSandbox": false` runs hooks as the user.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from .. import config, sandbox, telemetry
from ..config import AgentConfig
from ..paths import real_dir_problem
from ..sandbox import jail as _jail
from ..types import Event
from .state import SessionState

TIMEOUT = 60.0  # seconds a hook may run
OUTPUT_LIMIT = 64 * 1024  # bytes of a hook's stdout or stderr that are kept
# Bytes of a payload value exported as OLLIE_<KEY>: the kernel refuses to start a program with a
# variable over 128 KiB. The whole payload is on stdin.
VARIABLE_LIMIT = 32 * 1024
_KILL_GRACE = 2.0  # seconds a killed hook's exit may take to be reported


@dataclass(frozen=True, slots=True)
class Outcome:
    blocked: bool = False
    reason: str = ""  # stderr of the blocking hook
    output: str = ""  # stdout of the hooks that exited 0, joined

    @property
    def next_prompt(self) -> str | None:
        return self.reason if self.blocked and self.reason else None


NOTHING = Outcome()


class Hooks:
    """The hooks of one agent config, run for one session (whose cwd and env they get)."""

    def __init__(self, agent: AgentConfig, state: SessionState, emit: Callable[[Event], None]):
        self.agent = agent
        self._state = state
        self._emit = emit
        self._runner: Runner | None = None

    def runner(self) -> Runner | None:
        """What runs the hooks confined (None: the agent runs them unsandboxed); started on first use."""
        if not self.agent.hook_sandbox:
            return None
        if self._runner is None:
            self._runner = Runner(str(self.agent.hook_sandbox))
        return self._runner

    async def run(self, event: str, payload: dict[str, Any]) -> Outcome:
        """Run the event's commands in order; the first that exits 2 blocks (and ends the run)."""
        commands = self.agent.hooks.get(event)
        if not commands:
            return NOTHING
        cwd = self._state.cwd
        payload = {"event": event, "session_id": self._state.id, "cwd": cwd, **payload}
        outputs = []
        for index, cmd in enumerate(commands):
            try:
                if self.agent.hook_sandbox and not self.agent.trust_writable_hooks:
                    await sandbox.off_loop(refuse_writable, cmd, cwd, self.agent.sandboxes)
                with telemetry.hook(event, index) as span:
                    code, out, err = await run_command(cmd, payload, cwd, self._state.env, runner=self.runner())
                    span.exited(code, err.strip())
            except (OSError, sandbox.SandboxError) as e:  # it could not start (the cwd is gone, a refusal): say
                self._emit(Event("info", f"{event} hook {cmd!r} could not start: {e}"))
                continue
            if code == 0:
                if out.strip():
                    outputs.append(out.strip())
            elif code == 2:
                return Outcome(True, err.strip() or f"{event} hook {cmd!r} exited 2", "\n".join(outputs))
            else:
                self._emit(Event("info", f"{event} hook {cmd!r} {_describe(code)}: {err.strip()[:500]}"))
        return Outcome(False, "", "\n".join(outputs))

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.close()
            self._runner = None


def _describe(code: int | None) -> str:
    return f"timed out after {TIMEOUT:g} s and was killed" if code is None else f"exited {code}"


async def run_command(
    cmd: str,
    payload: dict[str, Any],
    cwd: str,
    session_env: dict[str, str],
    timeout: float | None = None,
    runner: Runner | None = None,
) -> tuple[int | None, str, str]:
    """Run one hook (confined by `runner`, else as the user); returns (exit code or None on
    timeout, stdout, stderr), outputs capped."""
    variables = {}
    for key, value in payload.items():
        text = value if isinstance(value, str) else json.dumps(value)
        variables[f"OLLIE_{key.upper()}"] = text.replace("\0", "").encode()[:VARIABLE_LIMIT].decode(errors="ignore")
    if cwd and (why := real_dir_problem(cwd)):  # a link planted on it could lead into ollie's mount, served here
        raise FileNotFoundError(f"the session's working directory {cwd} {why}")
    if runner is None:
        proc = await asyncio.create_subprocess_exec(
            config.system_program("sh"),
            "-c",
            cmd,
            cwd=cwd or None,
            env={**os.environ, **session_env, **variables},
            start_new_session=True,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        process: _Started = _Subprocess(proc)
    else:
        process = await runner.start(cmd, cwd or os.getcwd(), {**session_env, **variables})
    try:
        out, err = await asyncio.wait_for(
            _communicate(process, json.dumps(payload).encode()), timeout if timeout is not None else TIMEOUT
        )
    except (TimeoutError, asyncio.CancelledError) as e:
        process.kill()
        try:
            await asyncio.wait_for(process.wait(), _KILL_GRACE)
        except TimeoutError:  # the jail does not answer (its PID 1 stopped): end it whole
            if runner is not None:
                await runner.close()
        if isinstance(e, asyncio.CancelledError):
            raise
        return None, "", f"(killed after {timeout or TIMEOUT:g} s)"
    code = await process.wait()
    if code == 127 and runner is not None and (program := _program(cmd)).startswith("/tmp/"):
        err += f"\n(a sandboxed hook has a /tmp of its own, where {program} is not: move it, or run hooks unsandboxed)"
    return code, out, err


def _program(cmd: str) -> str:
    """The program a hook's command starts with."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        words = cmd.split()
    return words[0] if words else ""


class Runner:
    """Runs hook commands in a jail under a sandbox policy; the jail starts on the first hook and
    lives until `close`."""

    def __init__(self, policy: str):
        self.policy = policy
        self._sandboxes = sandbox.Sandboxes(size=4)
        self._jails = sandbox.Jails()

    async def start(self, cmd: str, cwd: str, env: dict[str, str]) -> _Started:
        async def build() -> sandbox.Sandbox:
            return await self._sandboxes.get_async(self.policy, cwd, "")

        box, jail = await sandbox.confined(self._sandboxes, self._jails, build)
        full_env = {**box.environ(), **env}
        if not jail.namespaces_refused:
            full_env["TMPDIR"] = "/tmp"  # the jail's own
        full_env["PATH"] = await box.search_path_async(full_env.get("PATH") or os.defpath)
        sh = await sandbox.find_program(full_env["PATH"], ("sh",)) or "/bin/sh"
        fds = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]  # stdin, stdout, stderr
        try:
            stage = await jail.spawn(
                box.confinement, [sh, "-c", cmd], cwd, full_env, stdin=fds[0][0], stdout=fds[1][1], stderr=fds[2][1]
            )
        except BaseException:
            for fd in (fds[0][1], fds[1][0], fds[2][0]):
                os.close(fd)
            raise
        finally:
            for fd in (fds[0][0], fds[1][1], fds[2][1]):
                os.close(fd)
        return await _JailedProcess.connect(stage, fds[0][1], fds[1][0], fds[2][0])

    async def close(self) -> None:
        await self._jails.close()


class _Started(Protocol):
    """A started hook: its pipes as asyncio streams, its exit, a way to kill its process group."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    def kill(self) -> None: ...

    async def wait(self) -> int | None: ...


class _Subprocess:
    def __init__(self, proc: asyncio.subprocess.Process):
        assert proc.stdin and proc.stdout and proc.stderr  # started with three pipes
        self._proc = proc
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr

    def kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def wait(self) -> int | None:
        return await self._proc.wait()


class _JailedProcess:
    def __init__(
        self,
        stage: _jail.Stage,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
    ):
        self._stage = stage
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    @classmethod
    async def connect(cls, stage: _jail.Stage, stdin: int, stdout: int, stderr: int) -> _JailedProcess:
        loop = asyncio.get_running_loop()
        readers = asyncio.StreamReader(), asyncio.StreamReader()
        for reader, fd in zip(readers, (stdout, stderr), strict=True):
            await loop.connect_read_pipe(partial(asyncio.StreamReaderProtocol, reader), os.fdopen(fd, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(stdin, "wb", 0))
        return cls(stage, asyncio.StreamWriter(transport, protocol, None, loop), *readers)

    def kill(self) -> None:
        self._stage.kill()

    async def wait(self) -> int | None:
        await self._stage.wait()
        try:
            return self._stage.exited.result()
        except _jail.JailError:
            return None


def refuse_writable(cmd: str, cwd: str, policies: list[str]) -> None:
    """Refuse a hook that runs a file the agent's code may have rewritten. (Off the loop, with
    `sandbox.off_loop`: the file's path is made real through the cwd, whose links the code
    plants, into ollie's own mount, say.)"""
    program = _program(cmd)
    if "/" not in program:
        return  # a command looked up on PATH: the sandbox cannot write the system's directories
    path = os.path.realpath(os.path.join(cwd, os.path.expanduser(program)))
    shared = tuple(str(d) for d in config.shared_dirs())  # every session's code writes these too
    for name in policies:
        if sandbox.load_policy(name, cwd, "", extra_rw=shared).writes(path):
            raise sandbox.SandboxError(
                f"{program} is a file that sandboxed code can write (sandbox policy {name!r}); move it out of "
                'the agent\'s reach, or set "trustWritableHooks": true in the agent config'
            )


async def _communicate(proc: _Started, data: bytes) -> tuple[str, str]:
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
