"""The built-in `execute` server and its one tool, execute_code: pipelines of sandboxed code.

A call is a list of stages run in order, each stage's output fed to the next one's stdin:
`{code, language}` inline code, `{tool, args}` a script from OLLIE_TOOLS_PATH, or `{parallel: [...]}`
several of those at once, their outputs joined in submission order. Every process runs in the
session's jail (`ollie.sandbox.jail`: fresh namespaces, one per network setting, started on first use)
under the sandbox policy the call names (`ollie.sandbox`), in its own process group, which is
killed whole when the stage ends, times out or is cancelled: nothing a stage starts outlives it.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import config, sandbox, telemetry
from ..paths import real_dir_problem
from ..sandbox import jail as _jail
from ..types import ConfigError, InvalidValue
from . import CallContext, ServerFactory, Tool, ToolResult, scripts

DEFAULT_TIMEOUT = 30.0

# language → (programs to look for, in order; the flag that precedes the code).
# The flag "-c"/"-e" passes the code as an argument; ed, expect and bc read it from stdin instead.
LANGUAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "bash": (("bash",), "-c"),
    "sh": (("sh",), "-c"),
    "python3": (("python3",), "-c"),
    "python": (("python3", "python"), "-c"),
    "perl": (("perl",), "-e"),
    "lua": (("lua", "lua5.4", "lua5.3"), "-e"),
    "awk": (("gawk",), ""),
    "sed": (("sed",), "-e"),
    "jq": (("jq",), ""),
    "ed": (("ed",), "-s"),
    "expect": (("expect",), "-"),
    "bc": (("bc",), "-l"),
}
_CODE_ON_STDIN = {"ed", "expect", "bc"}

DESCRIPTION = f"""Run code in a sandbox and return its output (stdout and stderr together).
`steps` is a pipeline: stages run in order, each stage's output becomes the next stage's stdin.
A stage is one of:
- {{"code": "...", "language": "bash"}}: inline code. Languages: {", ".join(LANGUAGES)} (default bash; \
ed, expect and bc read the code itself from stdin, so they take no piped input).
- {{"tool": "name", "args": ["..."]}}: a tool script from OLLIE_TOOLS_PATH, args as its argv.
- {{"parallel": [stage, ...]}}: code or tool stages run at once; outputs joined in the order given.
Examples: [{{"code": "ls"}}] · [{{"code": "grep -rn TODO ."}}, {{"code": "wc -l"}}] · \
[{{"parallel": [{{"code": "wc -l < a"}}, {{"code": "wc -l < b"}}]}}, {{"code": "sort -n"}}]
The sandbox reads the system, writes only the working directory, $TMPDIR (a private /tmp) and the \
shared $OLLIE_MEMORY_DIR and $OLLIE_PLANS_DIR, and has no network. Each stage gets `timeout` \
seconds (default {DEFAULT_TIMEOUT:g}); a failing stage stops the pipeline and its exit status and \
output are returned."""
SCRIPTS_HEADING = 'Tool scripts, e.g. {"tool": "file_read", "args": ["README.md"]} (name args — what it does):'


def describe(tool_dirs: tuple[str, ...]) -> str:
    """execute_code's description: DESCRIPTION, then one line per tool script in `tool_dirs`
    (from the headers t/idx lists too), within scripts.SUMMARY_MAX characters."""
    listing = scripts.summary(tool_dirs)
    return f"{DESCRIPTION}\n{SCRIPTS_HEADING}\n{listing}" if listing else DESCRIPTION


_CODE_OR_TOOL = {
    "code": {"type": "string", "description": "Source code to run."},
    "language": {"type": "string", "enum": list(LANGUAGES), "default": "bash"},
    "tool": {"type": "string", "description": "Name of a tool script in OLLIE_TOOLS_PATH."},
    "args": {"type": "array", "items": {"type": "string"}, "description": "Arguments for the tool script."},
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "minItems": 1,
            "description": "Pipeline stages, run in order.",
            "items": {
                "type": "object",
                "properties": {
                    **_CODE_OR_TOOL,
                    "parallel": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "object", "properties": _CODE_OR_TOOL},
                        "description": "Code or tool stages to run concurrently.",
                    },
                },
            },
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "default": DEFAULT_TIMEOUT,
            "description": "Seconds each stage may run.",
        },
        "sandbox": {
            "type": "string",
            "description": "Sandbox policy name (one the agent's config allows; without it, the first it lists).",
        },
    },
    "required": ["steps"],
}


class StepError(InvalidValue):
    """The call's arguments are malformed; the message names the argument or stage (an
    InvalidValue, so still a ValueError)."""


def factory(cwd: str = "", view: Callable[[int], None] | None = None) -> ServerFactory:
    """A factory of execute servers running code in `cwd` ("" = the current directory) unless
    a call's context names another. `view`, given a jail's /dev/fuse descriptor, serves the
    session's own view of ollie's files on it (the file server gives one), mounted at $OLLIE in
    each jail."""
    cwd = cwd or os.getcwd()
    return lambda: Server(cwd, view)


VIEW_NOTE = """
$OLLIE holds ollie's files as this session may use them, and nothing else of ollie's (cat $OLLIE/help): \
s/$OLLIE_SESSION_ID/ is this session (read; `plan` writable; `think` records a thought), m/ the memory, \
pl/ the plans, t/idx the tool scripts, sk/idx the skills. Sub-agents: the subagent_spawn tool script \
(prompts in, answers out), b/new for batch jobs; or a sub-session: `echo "new agent=A cwd=DIR" > \
$OLLIE/ctl` (the new id is the one `ls $OLLIE/s` adds), write s/<id>/prompt, wait until s/<id>/state \
is idle, read s/<id>/reply, then `echo "kill <id>" > $OLLIE/ctl`."""


class Server:
    def __init__(self, cwd: str, view: Callable[[int], None] | None = None):
        self.cwd = cwd
        self._sandboxes = sandbox.Sandboxes()
        self._jails = sandbox.Jails(view)
        self._view = view is not None
        self._view_told = False  # that its jails run without the view (no FUSE here), said once
        self._seccomp_told = sandbox.seccomp_supported()  # that they run without the filter, said once
        self._namespaces = True  # False once a jail found them refused (and the policy allowed that)
        self._scratch = ""  # $TMPDIR for calls whose context has none; removed on close
        self._wrapper = sandbox.superpowers_prefix()
        self._shared: tuple[str, ...] | None = None

    async def list_tools(self) -> list[Tool]:
        # The scripts of the server's environment: a session's own OLLIE_TOOLS_PATH (its env)
        # reaches the calls, not this listing, which the dispatcher builds once and caches.
        description = describe(_tool_dirs(CallContext())) + (VIEW_NOTE if self._view else "")
        return [Tool("execute_code", description, SCHEMA, read_only_call=read_safe)]

    async def call_tool(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        if name != "execute_code":
            return ToolResult.of(f"unknown tool {name!r}; the execute server offers execute_code", is_error=True)
        try:
            steps, timeout, policy = _parse_arguments(arguments, ctx.policies)
            job = await self._job(ctx, policy, timeout)
            stages = _parse_steps(steps, job.programs, job.sandbox.policy.limits.parallel)
            if job.programs.wanted:  # looked up off the loop, then parsed again with what was found
                await job.programs.look_up()
                stages = _parse_steps(steps, job.programs, job.sandbox.policy.limits.parallel)
        except (StepError, ConfigError) as e:
            return ToolResult.of(str(e), is_error=True)
        result = await _run_pipeline(stages, job)
        if job.notice:
            result.content.insert(0, {"type": "text", "text": job.notice + "\n"})
        return result

    async def close(self) -> None:
        await self._jails.close()
        self._sandboxes.clear()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = ""

    async def _job(self, ctx: CallContext, policy: str, timeout: float | None) -> _Job:
        cwd = ctx.cwd or self.cwd
        if why := real_dir_problem(cwd):  # a link planted on it could lead into ollie's mount, served here
            raise StepError(f"working directory {cwd} {why}")
        session_tmp = ctx.tmpdir
        tool_dirs = _tool_dirs(ctx)
        box, jail = await sandbox.confined(
            self._sandboxes, self._jails, lambda: self._sandbox_for(policy, cwd, session_tmp, tool_dirs)
        )
        limits = box.policy.limits
        timeout = float(timeout or min(DEFAULT_TIMEOUT, limits.timeout))
        if timeout > limits.timeout:
            raise StepError(
                f"timeout: at most {limits.timeout:g} seconds (limits.timeout of sandbox policy {policy!r})"
            )
        notice = self._notice(jail)
        if not self._namespaces:  # $TMPDIR is a directory of the host, granted by the policy
            session_tmp = session_tmp or self._scratch_dir()
            box = await self._sandbox_for(policy, cwd, session_tmp, tool_dirs)
        env = box.environ()  # only what the policy lets in: never the server's API keys
        env.update(ctx.env)
        # In a jail $TMPDIR is its private /tmp; the session's own scratch directory (where long
        # results are saved) is readable there.
        env.update(
            TMPDIR="/tmp" if self._namespaces else session_tmp,
            OLLIE_SESSION_ID=ctx.session_id,
            OLLIE_TOOLS_PATH=":".join(tool_dirs),
        )
        env.update(zip(("OLLIE_MEMORY_DIR", "OLLIE_PLANS_DIR"), self._shared_dirs(), strict=False))
        if jail.has_view:
            env["OLLIE"] = config.mount_point()
        else:
            env.pop("OLLIE", None)  # the user's mount is hidden from sandboxed code
        asked_path = env.get("PATH") or os.defpath
        system_path = env["PATH"] = await box.search_path_async(asked_path)
        kept = set(system_path.split(":"))
        return _Job(
            box,
            jail,
            cwd,
            env,
            timeout,
            _Programs(system_path, tool_dirs, sandbox.programs_found(system_path)),
            self._wrapper,
            _Budget(limits.output),
            notice,
            tuple(d for d in dict.fromkeys(asked_path.split(":")) if d and d not in kept),
        )

    async def _sandbox_for(
        self, policy: str, cwd: str, session_tmp: str, tool_dirs: tuple[str, ...]
    ) -> sandbox.Sandbox:
        # The skills' directories too: the model reads a skill's SKILL.md and runs its scripts.
        rox = tool_dirs + tuple(str(d) for d in config.skills_path() if d.is_dir())
        if self._namespaces:
            tmp = (session_tmp,) if session_tmp else ()
            return await self._sandboxes.get_async(policy, cwd, "", rox, tmp, self._shared_dirs(), in_jail=True)
        return await self._sandboxes.get_async(policy, cwd, session_tmp, rox)

    def _shared_dirs(self) -> tuple[str, ...]:
        """The memory and the plans, which every session's code may read and write (found once).
        Only in a jail, whose mounts of them follow no symlink: under Landlock alone, a link one
        session planted there could lead another session's code to write in its own cwd."""
        if not self._namespaces:
            return ()
        if self._shared is None:
            self._shared = tuple(str(d) for d in config.shared_dirs())
        return self._shared

    def _notice(self, jail: _jail.Jail) -> str:
        """What the first results say of how the sandbox runs, when it runs without a part. A jail
        whose namespaces the kernel refused turns this server to sandboxes made for their absence
        first, whatever else is said: its calls must never run under one that counts on them (a
        network of the jail's own). (Once it returned the seccomp notice before looking.)"""
        notices = []
        if jail.namespaces_refused and self._namespaces:
            self._namespaces = False
            notices.append(
                f"[sandbox: {jail.namespaces_refused}; running with Landlock and seccomp alone, as "
                "general.best_effort allows: no process, network, /tmp or terminal isolation]"
            )
        if not self._seccomp_told:
            self._seccomp_told = True
            notices.append(
                f"[sandbox: no seccomp filter for this {platform.machine()}; running with Landlock and the "
                "namespaces alone, as general.best_effort allows: code may make sockets of any kind]"
            )
        if jail.view_error and not self._view_told:
            self._view_told = True
            notices.append(f"[no view of ollie's files at $OLLIE in this sandbox: {jail.view_error}]")
        return "\n".join(notices)

    def _scratch_dir(self) -> str:
        if not self._scratch:
            self._scratch = tempfile.mkdtemp(prefix="execute-", dir=config.private_dir(config.tmp_path()))
        return self._scratch


def read_safe(arguments: dict[str, Any], ctx: CallContext | None = None) -> bool:
    """Whether a call only runs tool scripts marked `ollie:parallel read` in their first lines,
    so it may run beside other read-only calls."""
    steps = arguments.get("steps") if isinstance(arguments, dict) else None
    leaves = _leaves(steps) if isinstance(steps, list) and steps else None
    if leaves is None or not all(isinstance(leaf, dict) and isinstance(leaf.get("tool"), str) for leaf in leaves):
        return False  # code (most calls): no tool directory looked up
    tool_dirs = _tool_dirs(ctx or CallContext())
    return all(
        (script := _find_tool(leaf["tool"], tool_dirs)) is not None and _marked_read_safe(script) for leaf in leaves
    )


def _leaves(steps: list[Any]) -> list[Any] | None:
    """The steps' commands, a parallel step's each; None if a step is no object or its
    `parallel` no list."""
    leaves: list[Any] = []
    for step in map(_given, steps):
        parallel = step.get("parallel", [step]) if isinstance(step, dict) else None
        if not isinstance(parallel, list):
            return None
        leaves += parallel
    return leaves


# ---- parsing: everything is checked before anything runs ---------------------------------------


@dataclass(slots=True)
class _Command:
    where: str  # "steps[1].parallel[0]": named in errors
    argv: list[str]
    stdin_code: bytes | None = None  # ed, expect and bc read their code from stdin


_Stage = list[_Command]  # one command, or several run in parallel


@dataclass(slots=True)
class _Programs:
    """Finds interpreters on the sandbox's PATH and scripts on the tools path. The PATH is looked
    up off the event loop (`look_up`): code working in $HOME could plant a link in one of its
    directories (`~/.local/bin/bash`) leading into ollie's own mount, which the loop serves."""

    path: str
    tool_dirs: tuple[str, ...]
    found: dict[tuple[str, ...], str | None]  # what was found, by the names looked for (`sandbox.programs_found`)
    wanted: set[tuple[str, ...]] = field(default_factory=set)  # names not looked up yet

    def which(self, names: tuple[str, ...]) -> str | None:
        """The first of `names` found, from what `look_up` found; one not looked up yet is
        `wanted`, and stands in for itself until then (the caller looks up, then asks again)."""
        if names in self.found:
            return self.found[names]
        self.wanted.add(names)
        return names[0]

    async def look_up(self) -> None:
        wanted, self.wanted = self.wanted, set()
        for names in wanted:
            self.found[names] = await sandbox.find_program(self.path, names)


def _given(value: Any) -> Any:
    """An object without its null members: a model filling every field of the schema sends null
    for the ones it means to leave out."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def _parse_arguments(arguments: Any, allowed: tuple[str, ...]) -> tuple[list[Any], float | None, str]:
    if not isinstance(arguments, dict):
        raise StepError('execute_code takes an object: {"steps": [...], "timeout": 30, "sandbox": "default"}')
    arguments = _given(arguments)
    unknown = set(arguments) - {"steps", "timeout", "sandbox"}
    if unknown:
        raise StepError(f"unknown argument {sorted(unknown)[0]!r}; execute_code takes steps, timeout and sandbox")
    steps = arguments.get("steps")
    if not isinstance(steps, list) or not steps:
        raise StepError('steps: must be a non-empty list of stages, e.g. [{"code": "ls"}]')
    timeout = arguments.get("timeout")  # None: the default, within the policy's limit
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf
    ):
        raise StepError(f"timeout: must be a positive number of seconds, got {timeout!r}")
    policy = arguments.get("sandbox", allowed[0] if allowed else "default")
    if not isinstance(policy, str):
        raise StepError(f"sandbox: must be a policy name, got {policy!r}")
    if policy not in allowed:
        raise StepError(
            f"sandbox: policy {policy!r} is not allowed for this agent; it may use "
            f'{", ".join(allowed)} (the agent config\'s "sandboxes" list)'
        )
    return steps, timeout, policy


def _parse_steps(steps: list[Any], programs: _Programs, max_parallel: int) -> list[_Stage]:
    stages = []
    for i, step in enumerate(steps):
        where, step = f"steps[{i}]", _given(step)
        if isinstance(step, dict) and "parallel" in step:
            if set(step) != {"parallel"}:
                raise StepError(f'{where}: a parallel stage has only the key "parallel"')
            branches = step["parallel"]
            if not isinstance(branches, list) or not branches:
                raise StepError(f"{where}.parallel: must be a non-empty list of code or tool stages")
            if len(branches) > max_parallel:
                raise StepError(
                    f"{where}.parallel: {len(branches)} branches; the sandbox policy allows at most "
                    f"{max_parallel} (limits.parallel)"
                )
            stages.append([_parse_command(b, f"{where}.parallel[{j}]", programs) for j, b in enumerate(branches)])
        else:
            stages.append([_parse_command(step, where, programs)])
    return stages


def _parse_command(step: Any, where: str, programs: _Programs) -> _Command:
    step = _given(step)
    if not isinstance(step, dict):
        raise StepError(f'{where}: must be an object like {{"code": "ls"}}, got {step!r}')
    if "parallel" in step:
        raise StepError(f"{where}: parallel stages cannot be nested")
    unknown = set(step) - {"code", "language", "tool", "args"}
    if unknown:
        raise StepError(
            f"{where}: unknown key {sorted(unknown)[0]!r}; a stage has code and language, tool and args, or parallel"
        )
    if ("code" in step) == ("tool" in step):
        raise StepError(f"{where}: needs code or tool" if "code" not in step else f"{where}: has both code and tool")
    if "code" in step:
        return _code_command(step, where, programs)
    return _tool_command(step, where, programs)


def _code_command(step: dict[str, Any], where: str, programs: _Programs) -> _Command:
    code, language = step["code"], step.get("language", "bash")
    if not isinstance(code, str):
        raise StepError(f"{where}.code: must be a string")
    if "\0" in code:
        raise StepError(f"{where}.code: must not contain NUL characters")
    if "args" in step:
        raise StepError(f"{where}: args belong to tool stages")
    if not isinstance(language, str) or language not in LANGUAGES:
        raise StepError(f"{where}.language: unknown language {language!r}; use one of {', '.join(LANGUAGES)}")
    names, flag = LANGUAGES[language]
    program = programs.which(names)
    if program is None:
        raise StepError(f"{where}: language {language} needs {names[0]}, {_not_found(programs)}")
    if language in _CODE_ON_STDIN:
        return _Command(where, [program, flag], code.encode() + (b"" if code.endswith("\n") else b"\n"))
    return _Command(where, [program, flag, code] if flag else [program, code])


def _tool_command(step: dict[str, Any], where: str, programs: _Programs) -> _Command:
    name, args = step["tool"], step.get("args", [])
    if "language" in step:
        raise StepError(f'{where}: a tool\'s language comes from its shebang; drop "language"')
    if not isinstance(name, str) or not name or "/" in name or ".." in name:
        raise StepError(f"{where}.tool: invalid tool name {name!r}: give a script's file name, without '/' or '..'")
    if not isinstance(args, list) or not all(
        isinstance(a, str | int | float) and not isinstance(a, bool) for a in args
    ):
        raise StepError(f"{where}.args: must be a list of strings")
    if any("\0" in str(a) for a in args):
        raise StepError(f"{where}.args: must not contain NUL characters")
    script = _find_tool(name, programs.tool_dirs)
    if script is None:
        raise StepError(f"{where}.tool: no tool script {name!r} in OLLIE_TOOLS_PATH ({':'.join(programs.tool_dirs)})")
    try:
        interpreter = _shebang(script) or ["bash"]
    except OSError as e:
        raise StepError(f"{where}.tool: cannot read {script}: {e.strerror}") from None
    program = programs.which((interpreter[0],))
    if program is None:
        raise StepError(f"{where}: tool {name} needs {interpreter[0]} (its shebang), {_not_found(programs)}")
    return _Command(where, [program, *interpreter[1:], script, *map(str, args)])


def _not_found(programs: _Programs) -> str:
    """Why a program is missing: the PATH searched, which a session's `env` may have set."""
    return f"which is not on the PATH searched ({programs.path[:300] or 'empty'}; a session's env may set PATH)"


def _tool_dirs(ctx: CallContext) -> tuple[str, ...]:
    raw = ctx.env.get("OLLIE_TOOLS_PATH") or os.environ.get("OLLIE_TOOLS_PATH")
    dirs = raw.split(":") if raw else [str(p) for p in config.tools_path()]
    return tuple(d for d in dirs if d)


def _find_tool(name: str, tool_dirs: tuple[str, ...]) -> str | None:
    if "/" in name or ".." in name:
        return None
    for d in tool_dirs:
        script = os.path.join(d, name)
        if os.path.isfile(script):
            return script
    return None


def _shebang(script: str) -> list[str]:
    """The interpreter and its arguments from `#!`, looking through `env` (and `env -S`)."""
    with open(script, "rb") as f:
        first = f.readline(512)
    if not first.startswith(b"#!"):
        return []
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
        if words and words[0] in ("-S", "--split-string"):
            words = words[1:]
    return words


def _marked_read_safe(script: str) -> bool:
    try:
        with open(script, "rb") as f:
            head = b"".join(f.readline(512) for _ in range(5))
    except OSError:
        return False
    return b"ollie:parallel read" in head


# ---- running ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Budget:
    """Bytes of output a call may still keep, shared by all its stages and branches."""

    left: int


@dataclass(slots=True)
class _Job:
    """What every process of one call shares."""

    sandbox: sandbox.Sandbox
    jail: _jail.Jail
    cwd: str
    env: dict[str, str]
    timeout: float
    programs: _Programs
    wrapper: list[str]  # `superpowers run-session --` when superpowerd runs
    output: _Budget
    notice: str = ""  # said before the result: how the sandbox runs, when that is worth knowing
    left_out: tuple[str, ...] = ()  # the PATH's directories the sandbox runs no program from


@dataclass(slots=True)
class _Outcome:
    output: bytes
    error: str = ""  # why the command failed; "" when it succeeded
    status: int | None = None  # its exit status, when it exited (negative: the signal that killed it)


async def _run_pipeline(stages: list[_Stage], job: _Job) -> ToolResult:
    named = len(stages) > 1 or len(stages[0]) > 1  # one simple stage: errors need no stage name
    data: bytes | None = None  # the first stage reads nothing
    for stage in stages:
        if len(stage) == 1:  # no task to schedule for the usual case
            outcomes = [await _traced_command(stage[0], data, job)]
        else:
            outcomes = await asyncio.gather(*(_traced_command(cmd, data, job) for cmd in stage))
        data = b"".join(o.output for o in outcomes)
        failures = [
            f"{cmd.where}: {o.error}" if named else o.error for cmd, o in zip(stage, outcomes, strict=True) if o.error
        ]
        if failures:
            return ToolResult.of("\n".join(failures) + "\n" + _text(data), is_error=True)
    return ToolResult.of(_text(data or b""))


async def _traced_command(cmd: _Command, stdin: bytes | None, job: _Job) -> _Outcome:
    """A stage, as a span of the call's trace when tracing is on (its program and exit status)."""
    with telemetry.stage(cmd.where, cmd.argv[0]) as span:
        outcome = await _run_command(cmd, stdin, job)
        span.exited(outcome.status, outcome.error)
    return outcome


async def _run_command(cmd: _Command, stdin: bytes | None, job: _Job) -> _Outcome:
    data = cmd.stdin_code if cmd.stdin_code is not None else stdin
    out_read, out_write = os.pipe2(os.O_CLOEXEC)
    if data is not None:
        in_read, in_write = os.pipe2(os.O_CLOEXEC)
    else:
        in_read, in_write = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
    try:
        stage = await job.jail.spawn(
            job.sandbox.confinement,
            [*job.wrapper, *cmd.argv],
            job.cwd,
            job.env,
            stdin=in_read,
            stdout=out_write,
            stderr=out_write,
        )
    except BaseException as e:
        for fd in (out_read, in_write):
            if fd >= 0:
                os.close(fd)
        if isinstance(e, _jail.JailError):
            return _Outcome(b"", f"cannot run {cmd.argv[0]}: {e}")
        raise
    finally:
        os.close(in_read)
        os.close(out_write)
    process = _Process(job.jail, stage, out_read, in_write, data or b"", job.output)
    try:
        timed_out = not await stage.wait(job.timeout)
    finally:
        await process.end()
    output = bytes(process.output)
    failure = process.failure(cmd.argv[0])
    if timed_out:
        timeout = f"execution timeout after {job.timeout:g} seconds"
        return _Outcome(output, f"{timeout}; {failure}" if failure else timeout)
    if process.truncated:
        cap = job.sandbox.policy.limits.output
        return _Outcome(
            output + b"\n[output truncated]",
            f"the call's output exceeded {_size_text(cap)} (limits.output); the stage was stopped",
        )
    if failure:
        return _Outcome(output, failure)
    status = process.status
    if status:
        why = f"exit status {status}" if status > 0 else f"killed by {signal.Signals(-status).name}"
        return _Outcome(
            output,
            f"execution failed: {why}{_limit_hit(status, job.sandbox.policy.limits)}{_left_out(status, job)}",
            status,
        )
    return _Outcome(output, status=0)


def _left_out(status: int, job: _Job) -> str:
    """For a command not found (127), the PATH's directories the sandbox left out: a virtualenv
    or conda outside the project disappeared from it without a word."""
    if status != 127 or not job.left_out:
        return ""
    shown = ", ".join(job.left_out[:6]) + (", …" if len(job.left_out) > 6 else "")
    return (
        f" (not found? the sandbox runs no program from these directories of the PATH: {shown};"
        " a sandbox policy granting one under filesystem.rox lets it)"
    )


def _limit_hit(status: int, limits: sandbox.Limits) -> str:
    """Which of the sandbox's limits a program's death points at (its own, or a shell's `128 + n`
    for a child it ran): "File size limit exceeded" alone names no setting to change."""
    signum = -status if status < 0 else status - 128
    if signum == signal.SIGXFSZ:
        return f" (a file reached limits.file_size of the sandbox policy: {_size_text(limits.file_size)})"
    if signum == signal.SIGXCPU:
        return f" (a process used limits.cpu of the sandbox policy: {limits.cpu} s of CPU)"
    return ""


class _Process:
    """A program started in the jail, served by the event loop's selector: its input written and
    its merged output gathered (within the call's budget) through non-blocking pipes. Its exit
    comes from the jail, which kills what is left of its process group first."""

    def __init__(self, jail: _jail.Jail, stage: _jail.Stage, out: int, stdin: int, data: bytes, budget: _Budget):
        self.jail = jail
        self.stage = stage
        self.unanswered = False  # the jail never reported the exit, and was closed
        self.output = bytearray()
        self.truncated = False
        self._budget = budget
        self._loop = loop = asyncio.get_running_loop()
        self._drained = loop.create_future()
        self._out, self._stdin = out, stdin
        os.set_blocking(out, False)
        loop.add_reader(out, self._read)
        self._pending = memoryview(data)
        if stdin >= 0:
            os.set_blocking(stdin, False)
            self._write()

    @property
    def status(self) -> int:
        return self.stage.exited.result()

    def failure(self, program: str) -> str:
        """Why the program did not start or was lost ("" if it ran and exited)."""
        if self.unanswered:
            return "the sandbox did not report the stage's exit; the session's sandbox was restarted"
        error = self.stage.exited.exception()
        if isinstance(error, _jail.SpawnError):
            return f"cannot run {program}: {error}"
        return f"{error}; the stage was stopped" if error else ""

    async def end(self) -> None:
        """Kill what is left of the process group; wait until the output is drained and the
        exit reported."""
        self.stage.kill()
        self._close_stdin()
        # Only a process that escaped the group could hold the pipe open: don't wait on it forever.
        if not (self._drained.done() and self.stage.exited.done()):
            await asyncio.wait({self._drained, self.stage.exited}, timeout=2)
        if not self._drained.done():
            self._close_output()
        if not self.stage.exited.done():  # the jail does not answer (its PID 1 stopped): end it whole
            self.unanswered = True
            await self.jail.close()

    def _read(self) -> None:
        try:
            data = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self._close_output()
            return
        room = self._budget.left
        if len(data) > room and not self.truncated:
            self.truncated = True
            self.stage.kill()  # stop a runaway writer now rather than at its timeout
        kept = data[:room]
        self._budget.left -= len(kept)
        self.output += kept

    def _write(self) -> None:
        try:
            self._pending = self._pending[os.write(self._stdin, self._pending) :]
        except BlockingIOError:
            pass
        except OSError:  # the process stopped reading (EPIPE): it just loses its input
            self._pending = memoryview(b"")
        if self._pending:
            self._loop.add_writer(self._stdin, self._write)
        else:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self._stdin >= 0:
            self._loop.remove_writer(self._stdin)
            os.close(self._stdin)
            self._stdin = -1

    def _close_output(self) -> None:
        if not self._drained.done():
            self._loop.remove_reader(self._out)
            os.close(self._out)
            self._drained.set_result(None)


def _size_text(size: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


def _text(data: bytes) -> str:
    return data.decode(errors="replace")
