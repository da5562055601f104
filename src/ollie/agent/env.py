"""An agent's environment: its config, its tool servers (built-in and MCP) and its system prompt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .. import config, mcp, project_mcp, sandbox
from ..config import AgentConfig
from ..tools import Dispatcher
from . import hooks

PROMPT_TIMEOUT = 30.0  # seconds a prompt command may run


@dataclass
class AgentEnv:
    config: AgentConfig
    """The agent's config, as loaded."""
    dispatcher: Dispatcher
    """Every tool server of this agent: the pre-registered ones plus its MCP servers."""
    cwd: str
    """The working directory the env was built for (relative MCP server cwds resolve against it)."""
    system_prompt: str
    """The resolved system prompt (`resolve_prompt`)."""
    infos: list[str] = field(default_factory=list)
    """Start-up notices for the user, e.g. "mcp server time failed: ..." (emitted as info events)."""


async def build_agent_env(
    cfg: AgentConfig, dispatcher: Dispatcher, cwd: str, written: tuple[str, ...] = ()
) -> AgentEnv:
    """Resolve the system prompt and connect `cfg.mcp_servers`, and those of the project's trusted
    `.mcp.json` (`project_mcp`), on top of the servers already in `dispatcher`, all in parallel,
    each within its startup timeout. A server that fails stays registered with its reason (shown by
    `/mcp` and as the result of calling it) and is noted in `infos`; the others carry on; a disabled
    one is listed, not started. If this raises, `dispatcher` has been closed."""

    try:
        _check_policies(cfg)
        env = AgentEnv(cfg, dispatcher, cwd, await resolve_prompt(cfg, cwd))
        project, notices = await asyncio.to_thread(project_mcp.declared, cwd, cfg.mcp_servers)
        env.infos += notices
        clients = []
        for name, raw, source in [*((n, r, "") for n, r in cfg.mcp_servers.items()), *project]:
            if dispatcher.get_server(name) is not None:
                env.infos.append(f"mcp server {name} skipped: the name is taken by a built-in server")
                continue
            try:
                if mcp.disabled(name, raw, source):
                    dispatcher.add_server(name, mcp.failed_server(name, "disabled"))
                    continue
                spec = mcp.parse_spec(name, raw, cwd, written, source)
            except Exception as e:  # ConfigError: the rest of the agent still works
                dispatcher.add_server(name, mcp.failed_server(name, str(e)))
                env.infos.append(f"mcp server {name} failed: {e}")
                continue
            client = mcp.Client(spec)
            dispatcher.add_server(name, mcp.new_server(client), timeout=spec.timeout)  # closed with it
            clients.append(client)
        results = await asyncio.gather(*(c.connect() for c in clients), return_exceptions=True)
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, BaseException):
                env.infos.append(f"mcp server {client.name} failed: {client.error or result}")
        dispatcher.invalidate()
        return env
    except BaseException:
        await asyncio.shield(dispatcher.close())
        raise


async def resolve_prompt(cfg: AgentConfig, cwd: str) -> str:
    """The system prompt: `config.prompt_text`, or the joined outputs of its commands. They run as
    hooks do: sandboxed under the agent's `hookSandbox` policy (the cwd readable, not writable:
    a command such as `git status` runs what the model may have planted there, a
    `core.fsmonitor`), refused when they are a file sandboxed code can write unless the agent
    trusts such files, and never on the event loop."""
    commands = config.prompt_commands(cfg.prompt)
    if not commands:
        return config.prompt_text(cfg.prompt if isinstance(cfg.prompt, str) else "")
    runner = hooks.Runner(str(cfg.hook_sandbox)) if cfg.hook_sandbox else None
    try:
        return "\n\n".join([await _run_prompt_command(c, cfg, cwd, runner) for c in commands])
    finally:
        if runner is not None:
            await runner.close()


async def _run_prompt_command(cmd: str, cfg: AgentConfig, cwd: str, runner: hooks.Runner | None) -> str:
    try:
        if runner is not None and not cfg.trust_writable_hooks:
            await sandbox.off_loop(hooks.refuse_writable, cmd, cwd, cfg.sandboxes)
        code, out, err = await hooks.run_command(cmd, {}, cwd, {}, PROMPT_TIMEOUT, runner)
    except (OSError, sandbox.SandboxError) as e:
        raise config.ConfigError(f"prompt command {cmd!r} could not start: {e}") from None
    if code is None:
        raise config.ConfigError(f"prompt command {cmd!r} timed out after {PROMPT_TIMEOUT:g} s")
    if code != 0:
        raise config.ConfigError(f"prompt command {cmd!r} failed (exit {code}): {err.strip()[:500]}")
    return out.strip()


def _check_policies(cfg: AgentConfig) -> None:
    """The sandbox policies the agent names are there (one missing failed every call its model
    made, naming the policy it had not asked for)."""
    hooks_policy = [cfg.hook_sandbox] if isinstance(cfg.hook_sandbox, str) else []
    for field_name, name in [*(("sandboxes", p) for p in cfg.sandboxes), *(("hookSandbox", p) for p in hooks_policy)]:
        if why := sandbox.missing_policy(name):
            where = cfg.path or f"agent {cfg.name!r}"
            raise config.ConfigError(f"{where}: {field_name}: {why}, or name one that is there")
