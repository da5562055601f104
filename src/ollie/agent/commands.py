"""Slash commands and `!shell` lines, handled by `Core.submit` at once, even during a turn.

Output goes to the frontend as `info` events (`error` when a command fails or is refused);
an unknown `/word` is not a command: it is sent to the model as a prompt.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..types import Event

if TYPE_CHECKING:
    from .core import Core

SHELL_TIMEOUT = 300.0

Handler = Callable[["Core", str], Awaitable[str | None]]
_COMMANDS: dict[str, tuple[Handler, str, bool]] = {}  # name -> (handler, help, refused during a turn)


def command(name: str, help: str, idle_only: bool = False) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = (fn, help, idle_only)
        return fn

    return register


async def run_command(core: Core, line: str) -> bool:
    """Handle `line` if it is a command; return False when it is a prompt after all."""
    if line.startswith("!"):
        await _report(core, "!", _shell(core, line[1:].strip()))
        return True
    name, _, arg = line[1:].partition(" ")
    entry = _COMMANDS.get(name)
    if entry is None:
        return False
    handler, _, idle_only = entry
    arg = arg.strip()
    # "/backend", "/model" and "/cwd" with no argument only show the current value.
    if idle_only and core.running and (arg or name in ("compact", "clear")):
        core.emit(Event("error", f"/{name} cannot run while a turn is running; interrupt it first"))
        return True
    await _report(core, f"/{name}", handler(core, arg))
    return True


async def _report(core: Core, name: str, work: Awaitable[str | None]) -> None:
    """Run a command: its output becomes an info event, its failure an error event (a bad
    argument, a ConfigError, a backend down): reported, never raised."""
    try:
        out = await work
    except Exception as e:
        core.emit(Event("error", f"{name}: {e}"))
        return
    if out:
        core.emit(Event("info", out))


async def _shell(core: Core, cmd: str) -> str:
    """`!cmd` runs as the model's own code does (execute_code, the session's default sandbox
    policy): a prompt may come from anyone who can write the session's `prompt` file."""
    if not cmd:
        raise ValueError("give a command to run")
    arguments = {"steps": [{"code": cmd}], "timeout": SHELL_TIMEOUT}
    result = await core.dispatcher.dispatch("execute_code", arguments, core.call_context())
    text = result.text().rstrip()
    return f"!{cmd}" + (" (failed)" if result.is_error else "") + (f"\n{text}" if text else "")


@command("help", "list the commands")
async def _help(core: Core, arg: str) -> str:
    lines = [f"/{name:<8} {text}" for name, (_, text, _) in sorted(_COMMANDS.items())]
    return "\n".join([*lines, "!cmd     run a shell command in the session's cwd"])


@command("i", "inject a message into the running turn (queued when idle)")
async def _inject(core: Core, arg: str) -> str:
    if not arg:
        raise ValueError("usage: /i <message>")
    core.inject(arg)
    return "injected" if core.running else "queued"


@command("irw", "replace the pending injected message")
async def _inject_overwrite(core: Core, arg: str) -> str:
    if not arg:
        raise ValueError("usage: /irw <message>")
    core.inject(arg, replace=True)
    return "injected (replacing)" if core.running else "queued"


@command("q", "queue a prompt for after the current turn")
async def _queue(core: Core, arg: str) -> str:
    if not arg:
        raise ValueError("usage: /q <prompt>")
    core.queue(arg)
    return f"queued ({len(core.queued())} waiting)"


@command("backend", "show or switch the backend: /backend [name] [model]", idle_only=True)
async def _backend(core: Core, arg: str) -> str:
    from .. import backends

    if not arg:
        return f"backend: {core.backend_name} (known: {', '.join(backends.names())})"
    name, _, model = arg.partition(" ")
    await core.set_backend(name, model.strip() or None)
    return f"backend: {core.backend_name}, model: {core.model}"


@command("models", "list the backend's models")
async def _models(core: Core, arg: str) -> str:
    return "\n".join(await core.models()) or "(the backend lists no models)"


@command("model", "show or switch the model: /model [name]", idle_only=True)
async def _model(core: Core, arg: str) -> str:
    if not arg:
        return f"model: {core.model}"
    models = await core.models()
    if models and arg not in models:
        raise LookupError(f"no model {arg!r} on {core.backend_name}; models: {', '.join(models)}")
    await core.set_model(arg)
    return f"model: {core.model}"


@command("agents", "list the agent configs")
async def _agents(core: Core, arg: str) -> str:
    from .. import config

    return "\n".join(("* " if a == core.agent_name else "  ") + a for a in config.list_agents())


@command("agent", "show or switch the agent (fresh tool servers; cwd kept): /agent [name]", idle_only=True)
async def _agent(core: Core, arg: str) -> str:
    if not arg:
        return f"agent: {core.agent_name}"
    await core.set_agent(arg)
    return f"agent: {core.agent_name}"


@command("compact", "summarise the history to free the context", idle_only=True)
async def _compact(core: Core, arg: str) -> None:
    await core.compact()


@command("clear", "forget the history (it stays on disk in compaction.jsonl)", idle_only=True)
async def _clear(core: Core, arg: str) -> str:
    core.clear()
    return "history cleared"


@command("context", "show how full the context window is")
async def _context(core: Core, arg: str) -> str:
    return f"context: {core.ctxsz()}, {len(core.messages)} messages"


@command("cost", "show the cost of the last request and of the session")
async def _cost(core: Core, arg: str) -> str:
    return core.cost()


@command("usage", "show token usage")
async def _usage(core: Core, arg: str) -> str:
    return core.usage()


@command("history", "show the history, one line per message")
async def _history(core: Core, arg: str) -> str:
    lines = []
    for i, m in enumerate(core.messages):
        calls = " ".join(f"-> {c.name}" for c in m.tool_calls)
        text = m.content.replace("\n", " ")[:100]
        lines.append(f"{i:4} {m.role:<9} {text} {calls}".rstrip())
    return "\n".join(lines) or "(empty)"


@command("sessions", "list stored sessions")
async def _sessions(core: Core, arg: str) -> str:
    from .session import list_stored

    return "\n".join(f"{m.id}  {m.agent:<10} {m.cwd}  {m.first_prompt[:50]!r}" for m in list_stored())


@command("cwd", "show or change the working directory: /cwd [path]", idle_only=True)
async def _cwd(core: Core, arg: str) -> str:
    if arg:
        core.set_cwd(arg)
    return f"cwd: {core.cwd}"


@command("skills", "list the skills (SKILL.md files under OLLIE_SKILLS_PATH)")
async def _skills(core: Core, arg: str) -> str:
    from ..skills import list_skills

    return "\n".join(f"{s.name}: {s.description}" for s in list_skills()) or "(no skills)"


@command("tools", "list the tools the model is offered")
async def _tools(core: Core, arg: str) -> str:
    tools = await core.dispatcher.list_tools()
    return "\n".join(f"{name}: {t.description.splitlines()[0] if t.description else ''}" for name, t in tools.items())


@command("mcp", "list the tool servers and their tools")
async def _mcp(core: Core, arg: str) -> str:
    from ..tools import format_status

    return format_status(await core.dispatcher.server_status())


@command("sp", "show the system prompt")
async def _system_prompt(core: Core, arg: str) -> str:
    return core.system_prompt()


@command("set", "set a generation parameter: /set temperature 0.2", idle_only=True)
async def _set(core: Core, arg: str) -> str:
    key, _, value = arg.partition(" ")
    if not key:
        return json.dumps(core.params.nonempty()) or "{}"
    core.set_param(key, value.strip())
    return f"{key} = {getattr(core.params, key)!r}"
