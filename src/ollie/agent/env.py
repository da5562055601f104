"""An agent's environment: its config, its tool servers (built-in and MCP) and its system prompt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..config import AgentConfig, resolve_prompt
from ..tools import Dispatcher


@dataclass
class AgentEnv:
    config: AgentConfig
    """The agent's config, as loaded."""
    dispatcher: Dispatcher
    """Every tool server of this agent: the pre-registered ones plus its MCP servers."""
    cwd: str
    """The working directory the env was built for (relative MCP server cwds resolve against it)."""
    system_prompt: str
    """The resolved system prompt (`config.resolve_prompt`)."""
    infos: list[str] = field(default_factory=list)
    """Start-up notices for the user, e.g. "mcp server time failed: ..." (emitted as info events)."""


async def build_agent_env(cfg: AgentConfig, dispatcher: Dispatcher, cwd: str) -> AgentEnv:
    """Resolve the system prompt and connect `cfg.mcp_servers` on top of the servers already in
    `dispatcher`, all in parallel, each within its startup timeout. A server that fails stays
    registered with its reason (shown by `/mcp` and as the result of calling it) and is noted in
    `infos`; the others carry on. If this raises, `dispatcher` has been closed."""
    from .. import mcp

    try:
        env = AgentEnv(cfg, dispatcher, cwd, resolve_prompt(cfg.prompt, cwd))
        clients = []
        for name, raw in cfg.mcp_servers.items():
            if dispatcher.get_server(name) is not None:
                env.infos.append(f"mcp server {name} skipped: the name is taken by a built-in server")
                continue
            try:
                spec = mcp.parse_spec(name, raw, cwd)
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
