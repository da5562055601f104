"""The agent core: `Core` (the loop) and `open_session`, which builds one from names."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable
from typing import Any

from ..types import Event
from .core import Core, CoreConfig


async def open_session(
    *,
    agent: str | None = None,
    cwd: str | None = None,
    backend: str | None = None,
    model: str | None = None,
    session_id: str | None = None,
    script: Any = None,
    store_root: Path | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> Core:
    """A ready Core: a new session, or the stored one `session_id` names (its agent, backend,
    model and cwd are restored unless given here). `on_event` is subscribed before the start-up
    notices (e.g. an MCP server that failed) are emitted. Raises ConfigError for bad names."""
    from .. import backends, config
    from ..tools import new_dispatcher_func
    from ..tools import execute
    from ..types import ConfigError
    from .env import build_agent_env
    from .session import SessionStore

    meta = None
    if session_id:
        store = SessionStore(session_id, store_root)
        if store.exists():
            meta = store.load_meta()
    agent = agent or (meta.agent if meta else None) or "default"
    cfg = config.load_agent(agent)
    cwd = os.path.abspath(os.path.expanduser(cwd or (meta.cwd if meta else "") or os.getcwd()))
    if not os.path.isdir(cwd):
        raise ConfigError(f"cwd {cwd!r} is not a directory")
    name = backend or (meta.backend if meta and not script else None) or cfg.backend or backends.default_name()
    model = model or (meta.model if meta and name == meta.backend else None) or cfg.model or os.environ.get("OLLIE_MODEL")
    options = {"script": script} if script is not None else {}
    be = backends.create(name, model or None, **options)
    new_dispatcher = new_dispatcher_func({"execute": execute.Decl(cwd)})
    env = await build_agent_env(cfg, new_dispatcher(), cwd)
    core = Core(CoreConfig(backend=be, env=env, new_dispatcher=new_dispatcher, session_id=session_id or "",
                           store_root=store_root))
    if on_event is not None:
        core.subscribe(on_event)
    await core.refresh_context_length()
    for info in env.infos:
        core.emit(Event("info", info))
    if meta is None:
        from . import hooks

        await hooks.run(core, "agentSpawn", {"agent": agent})
    return core


__all__ = ["Core", "CoreConfig", "open_session"]
