"""The session commands, defined once: slash commands, the session's `ctl` file and its `cfg` file
all run these.

A command's rules live in the `Core` method it calls (switching the backend is refused with
`Busy` while a turn runs, whoever asks), so it is refused the same way from every frontend.
`submit` is what a frontend calls with a line a user typed: `/name args` runs a command (an
unknown `/word` is a prompt after all), `!cmd` runs a shell command the way the model's code runs,
anything else is a prompt. Output goes to the chat as an `info` event, a failure as `error`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .. import backends, config
from ..chatfmt import context_text, cost_text, usage_text
from ..skills import index, list_skills
from ..tools import format_status
from ..types import Event, InvalidValue
from .core import Core
from .session import list_stored

SHELL_TIMEOUT = 300.0

Handler = Callable[[Core, str], Awaitable[str | None]]


def _never(arg: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str
    run: Handler
    aliases: tuple[str, ...] = ()
    # Whether, with this argument, it changes the conversation or the files: its outcome then goes
    # in the chat however it was given (typed in a prompt, every outcome does), so that whoever
    # reads the chat sees that what is above was taken back.
    changes: Callable[[str], bool] = _never


COMMANDS: dict[str, Command] = {}  # by name and by alias


def command(
    name: str, help: str, aliases: tuple[str, ...] = (), changes: Callable[[str], bool] = _never
) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        cmd = Command(name, help, fn, aliases, changes)
        for key in (name, *aliases):
            COMMANDS[key] = cmd
        return fn

    return register


def names() -> list[str]:
    return sorted({c.name for c in COMMANDS.values()})


async def run(core: Core, name: str, arg: str = "") -> str | None:
    """Run command `name`; returns its output. Raises what it raises (Busy, InvalidValue, …),
    and InvalidValue for an unknown name."""
    cmd = COMMANDS.get(name)
    if cmd is None:
        raise InvalidValue(f"unknown command {name[:40]!r}; commands: {', '.join(names())}")
    return await cmd.run(core, arg.strip())


async def run_noted(core: Core, name: str, arg: str = "") -> str | None:
    """`run`, for a control file: the outcome of a command that changed the conversation or the
    files (`Command.changes`) also goes in the chat, as a prompt's command's does."""
    out = await run(core, name, arg)
    if out and COMMANDS[name].changes(arg.strip()):
        core.emit(Event("info", out))
    return out


async def submit(core: Core, line: str) -> None:
    """A line a user typed: a command or a shell line runs at once (even during a turn), anything
    else goes to `core.submit` as a prompt."""
    await asyncio.shield(start(core, line))


def start(core: Core, line: str) -> asyncio.Future[None]:
    """`submit` in the background; a prompt's turn counts as running from this call on."""
    line = line.strip()
    if line.startswith("!"):
        return asyncio.ensure_future(_report(core, "!", _shell(core, line[1:].strip())))
    if is_command(line):
        name, _, arg = line[1:].partition(" ")
        return asyncio.ensure_future(_report(core, f"/{name}", run(core, name, arg)))
    return core.start(line)


def is_command(line: str) -> bool:
    """A `/command` or a `!shell` line: run at once (even during a turn), never sent as a prompt."""
    line = line.strip()
    return line.startswith("!") or line.startswith("/") and line[1:].partition(" ")[0] in COMMANDS


async def _report(core: Core, name: str, work: Awaitable[str | None]) -> None:
    """A command's output becomes an info event, its failure an error event: never raised. Either
    is the session's `reply` when no turn runs (a script that reads it after a command)."""
    try:
        out = await work
    except Exception as e:
        core.emit(Event("error", f"{name}: {e}"))
        core.answered(f"{name}: {e}")
        return
    if out:
        core.emit(Event("info", out))
    core.answered(out or "")


async def _shell(core: Core, cmd: str) -> str:
    """`!cmd` runs as the model's own code does (ollie's execute server, the session's default
    sandbox policy): a prompt may come from anyone who can write the session's `prompt` file."""
    if not cmd:
        raise InvalidValue("give a command to run")
    server = core.dispatcher.get_server("execute")
    if server is None:
        raise InvalidValue("this session has no execute server to run commands with")
    arguments = {"steps": [{"code": cmd}], "timeout": SHELL_TIMEOUT}
    result = await server.call_tool("execute_code", arguments, core.call_context())
    text = result.text().rstrip()
    return f"!{cmd}" + (" (failed)" if result.is_error else "") + (f"\n{text}" if text else "")


def _required(arg: str, usage: str) -> str:
    if not arg:
        raise InvalidValue(f"usage: {usage}")
    return arg


# ---- the turn -----------------------------------------------------------------------------------------


@command("stop", "interrupt the running turn (completed work is kept)", aliases=("interrupt",))
async def _stop(core: Core, arg: str) -> str:
    return "interrupted" if core.interrupt() else "no turn is running"


STARTED = "started: the session was idle"


@command("inject", "inject a message into the running turn (started when idle)", aliases=("i",))
async def _inject(core: Core, arg: str) -> str:
    done = core.inject(_required(arg, "inject <message>"))
    return STARTED if done == "started" else done


@command("irw", "replace the pending injected message (started when idle)")
async def _inject_overwrite(core: Core, arg: str) -> str:
    done = core.inject(_required(arg, "irw <message>"), replace=True)
    return STARTED if done == "started" else "injected (replacing)" if done == "injected" else done


@command("queue", "queue a prompt for after the current turn (started when idle)", aliases=("q",))
async def _queue(core: Core, arg: str) -> str:
    if core.queue(_required(arg, "queue <prompt>")):
        return STARTED
    return f"queued ({len(core.queued())} waiting)"


# ---- settings: show with no argument, change with one ---------------------------------------------------


@command("backend", "show or switch the backend: backend [name] [model]")
async def _backend(core: Core, arg: str) -> str:
    if not arg:
        return f"backend: {core.backend.name} (known: {', '.join(backends.names())})"
    name, _, model = arg.partition(" ")
    await core.set_backend(name, model.strip() or None)
    return f"backend: {core.backend.name}, model: {core.backend.model}"


@command("model", "show or switch the model: model [name]")
async def _model(core: Core, arg: str) -> str:
    if arg:
        await core.set_model(arg)
    return f"model: {core.backend.model}"


@command("agent", "show or switch the agent (its servers, prompt, hooks, parameters; history and cwd kept)")
async def _agent(core: Core, arg: str) -> str:
    if arg:
        await core.set_agent(arg)
    return f"agent: {core.agent.name}, backend: {core.backend.name}, model: {core.backend.model}"


@command("cwd", "show or change the working directory: cwd [path]")
async def _cwd(core: Core, arg: str) -> str:
    if arg:
        core.session.set_cwd(arg)
        await core.say_notices()  # what the new cwd's project tells the model, before `sp` shows it
    return f"cwd: {core.session.cwd}"


@command("set", "show or set generation parameters: set [name value]")
async def _set(core: Core, arg: str) -> str:
    key, _, value = arg.partition(" ")
    if not key:
        return json.dumps(core.session.params.nonempty())
    core.session.set_param(key, value.strip())
    return f"{key} = {getattr(core.session.params, key)!r}"


# ---- the history --------------------------------------------------------------------------------------


@command("compact", "summarise the history to free the context")
async def _compact(core: Core, arg: str) -> None:
    await core.compact()


@command("clear", "forget the history (it stays on disk in compaction.jsonl)", changes=lambda arg: True)
async def _clear(core: Core, arg: str) -> str:
    core.clear()
    return "history cleared"


@command("checkpoints", "list the checkpoints (what each turn changed in the cwd), newest first")
async def _checkpoints(core: Core, arg: str) -> str:
    checkpoints = core.checkpoints
    return (checkpoints.listing() if checkpoints else "").rstrip() or "(no checkpoints)"


@command("undo", "take back what the last turn changed in the cwd: undo [--force] [--chat]", changes=lambda arg: True)
async def _undo(core: Core, arg: str) -> str:
    flags = _flags(arg, {"--force", "--chat"})
    return await core.rewind(1, force="--force" in flags, chat="--chat" in flags)


@command(
    "rewind",
    "go back N checkpoints: rewind N shows what it would change, rewind N --yes does it",
    changes=lambda arg: "--yes" in arg.split(),
)
async def _rewind(core: Core, arg: str) -> str:
    number, _, rest = arg.partition(" ")
    flags = _flags(rest, {"--yes", "--force", "--chat"})
    if not number.isdigit():
        raise InvalidValue("rewind N [--yes] [--force] [--chat]: N is how many checkpoints to go back (/checkpoints)")
    apply = "--yes" in flags
    said = await core.rewind(int(number), apply=apply, force="--force" in flags, chat="--chat" in flags)
    return said if apply else f"{said}\n(nothing changed yet: rewind {number} --yes does it)"


def _flags(arg: str, known: set[str]) -> set[str]:
    flags = set(arg.split())
    if unknown := flags - known:
        raise InvalidValue(f"unknown option {sorted(unknown)[0]!r}; options: {', '.join(sorted(known))}")
    return flags


@command("history", "show the history, one line per message")
async def _history(core: Core, arg: str) -> str:
    lines = []
    for i, m in enumerate(core.session.messages):
        calls = " ".join(f"-> {c.name}" for c in m.tool_calls)
        text = m.content.replace("\n", " ")[:100]
        lines.append(f"{i:4} {m.role:<9} {text} {calls}".rstrip())
    return "\n".join(lines) or "(empty)"


# ---- what there is --------------------------------------------------------------------------------------


@command("help", "list the commands")
async def _help(core: Core, arg: str) -> str:
    lines = [f"/{c.name:<8} {c.help}" for c in sorted(set(COMMANDS.values()), key=lambda c: c.name)]
    return "\n".join([*lines, "!cmd      run a shell command in the session's cwd"])


@command("context", "show how full the context window is")
async def _context(core: Core, arg: str) -> str:
    return f"context: {context_text(core.ctxsz())}, {len(core.session.messages)} messages"


@command("cost", "show the cost of the last request and of the session")
async def _cost(core: Core, arg: str) -> str:
    return cost_text(core.cost(), core.backend.model)


@command("usage", "show token usage")
async def _usage(core: Core, arg: str) -> str:
    return usage_text(core.usage())


@command("models", "list the backend's models")
async def _models(core: Core, arg: str) -> str:
    return "\n".join(await core.models()) or "(the backend lists no models)"


@command("agents", "list the agent configs")
async def _agents(core: Core, arg: str) -> str:
    return "\n".join(("* " if a == core.agent.name else "  ") + a for a in config.list_agents())


@command("sessions", "list stored sessions")
async def _sessions(core: Core, arg: str) -> str:
    return "\n".join(f"{m.id}  {m.agent:<10} {m.cwd}  {m.first_prompt[:50]!r}" for m in list_stored())


@command("skills", "list the skills offered to the model (OLLIE_SKILLS_PATH, the project's .ollie/skills)")
async def _skills(core: Core, arg: str) -> str:
    skills, notices = await asyncio.to_thread(list_skills, core.session.cwd)  # (`project.read_text`)
    return (index(skills) + "".join(f"{n}\n" for n in notices)).rstrip() or "(no skills)"


@command("tools", "list the tools the model is offered")
async def _tools(core: Core, arg: str) -> str:
    tools = await core.dispatcher.list_tools()
    return "\n".join(f"{name}: {t.description.splitlines()[0] if t.description else ''}" for name, t in tools.items())


@command("mcp", "list the tool servers and their tools")
async def _mcp(core: Core, arg: str) -> str:
    return format_status(await core.dispatcher.server_status())


@command("sp", "show the system prompt")
async def _system_prompt(core: Core, arg: str) -> str:
    return core.system_prompt()
