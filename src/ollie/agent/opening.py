"""`open_session`: a ready Core in one call, from an agent config, a backend and a cwd (or a stored
session), with execute_code, the agent's tool servers and the plans extension."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import backends, config, paths, sandbox
from ..plans import Plans
from ..tools import dispatcher_factory, execute
from ..types import ConfigError, Event, NotFound
from .core import Core, CoreConfig, check_handler
from .env import build_agent_env
from .session import SessionStore

if TYPE_CHECKING:
    from ..backends import Backend
    from ..config import AgentConfig
    from ..plans import PlanBackend
    from ..tools import Server
    from .session import SessionMeta


def open_session(
    *,
    agent: str | AgentConfig | None = None,
    cwd: str | None = None,
    backend: str | Backend | None = None,
    model: str | None = None,
    session_id: str | None = None,
    create: bool = False,
    servers: Mapping[str, Callable[[], Server]] | None = None,
    script: Any = None,
    store_root: Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    view: Callable[[int], None] | None = None,
    plan_backend: PlanBackend | None = None,
    cwd_within: str | None = None,
    tree_cwd: str | None = None,
) -> Opening:
    """A ready Core, awaited (`core = await open_session(...)`) or entered (`async with
    open_session(...) as core`, which closes it on the way out).

    A new session, or the stored one `session_id` names (its agent, backend, model and cwd are
    restored unless given here; NotFound when none is stored, unless `create`: then a new session
    takes that id). `agent` is the name of an agent config (`agents/<name>.json`) or
    an `AgentConfig` built in code. `backend` is a registered backend's name, or a backend you
    built (a `ScriptedBackend` in a test, which you can then `assert_consumed()`), used as it is:
    the session closes it. Every session has the sandboxed `execute_code` tool; `servers`
    adds tool servers of your own, each given as a function that builds a fresh one (an agent
    switch closes them and builds new ones). `script` (a list of turns, or a file) is for the
    scripted backend. `on_event` is subscribed before the start-up notices (e.g. an MCP server
    that failed) are emitted. `view` serves the session's own view of ollie's files to its
    sandboxed code (the file server gives one; see `tools.execute.factory`). The steps of the plans
    the agent makes (`task_plan`) are committed as tasks to a tool server with `task_create` if
    the agent has one, else to `plan_backend` (an `ollie.plans.PlanBackend`) if given.
    `cwd_within` (a sub-agent's: its parent's cwd) is where the cwd must stay, now and whenever it
    changes: it is resolved beneath that directory by descriptor, following no symlink; `tree_cwd`
    (a sub-agent's) is the cwd its tree of sessions starts from, whose files its tree's code may
    have written (no tool server's program is taken from there).
    Raises ConfigError for a bad name or config."""
    return Opening(
        _open(
            agent=agent,
            cwd=cwd,
            backend=backend,
            model=model,
            session_id=session_id,
            create=create,
            servers=servers or {},
            script=script,
            store_root=store_root,
            on_event=on_event,
            view=view,
            plan_backend=plan_backend,
            cwd_within=cwd_within or "",
            tree_cwd=tree_cwd or "",
        )
    )


class Opening:
    """A Core being opened: await it, or use it as an async context manager."""

    def __init__(self, opening: Awaitable[Core]):
        self._opening = opening
        self._core: Core | None = None

    def __await__(self) -> Generator[Any, None, Core]:
        return self._opening.__await__()

    async def __aenter__(self) -> Core:
        self._core = await self._opening
        return self._core

    async def __aexit__(self, *exc: object) -> None:
        if self._core is not None:
            await self._core.close()


async def _open(
    *,
    agent: str | AgentConfig | None,
    cwd: str | None,
    backend: str | Backend | None,
    model: str | None,
    session_id: str | None,
    create: bool,
    servers: Mapping[str, Callable[[], Server]],
    script: Any,
    store_root: Path | None,
    on_event: Callable[[Event], None] | None,
    view: Callable[[int], None] | None,
    plan_backend: PlanBackend | None,
    cwd_within: str,
    tree_cwd: str,
) -> Core:

    backend = _checked_arguments(backend, model, script, servers)
    if on_event is not None:
        check_handler(on_event)  # before anything is made
    meta = None
    if session_id:
        store = SessionStore(session_id, store_root)
        if store.exists():
            meta = store.load_meta()
        elif not create:  # a mistyped id would start an empty session in its name
            raise NotFound(f"no stored session {session_id!r} in {store.root} (create=True starts one of that id)")
    cfg = _agent(agent, meta)
    cwd = _cwd(cwd, cwd_within, meta)
    be = backend if not (backend is None or isinstance(backend, str)) else _backend(backend, model, script, meta, cfg)
    new_dispatcher = dispatcher_factory({"execute": execute.factory(cwd, view), **servers}, keeping_names=("execute",))
    env = await build_agent_env(cfg, new_dispatcher(), cwd, tuple(p for p in (cwd, tree_cwd) if p))
    core = Core(
        CoreConfig(
            backend=be,
            env=env,
            new_dispatcher=new_dispatcher,
            session_id=session_id or "",
            store_root=store_root,
            extensions=(lambda session: Plans(session, plan_backend),),
            cwd_within=cwd_within,
            tree_cwd=tree_cwd,
            agent_in_code=isinstance(agent, config.AgentConfig),
        )
    )
    if on_event is not None:
        core.subscribe(on_event)
    await core.refresh_context_length()
    for info in env.infos:
        core.emit(Event("info", info))
    await core.say_notices()
    if meta is None or meta.agent != cfg.name:  # a new session, or a stored one under another agent
        await core.spawned()
    return core


def _checked_arguments(
    backend: str | Backend | None, model: str | None, script: Any, servers: Mapping[str, Callable[[], Server]]
) -> str | Backend | None:
    """What open_session was given, refused when it cannot mean anything; the backend a script
    implies."""
    if not (backend is None or isinstance(backend, str)) and (model or script is not None):
        raise ConfigError("a backend given built takes no model or script here: give them to it when you build it")
    if "execute" in servers:
        raise ConfigError("the tool server name 'execute' is ollie's own (the sandboxed execute_code); choose another")
    if unbuilt := [name for name, make in servers.items() if not callable(make)]:
        raise ConfigError(
            f"servers[{unbuilt[0]!r}] must be a function that builds the server (an agent switch builds"
            " new ones), not a server"
        )
    if script is not None and backend is None:
        return "scripted"  # a script is the scripted backend's, whatever the agent names
    if script is not None and backend != "scripted":
        raise ConfigError(f"script= is for the scripted backend, not {backend!r}")
    return backend


def _agent(agent: str | AgentConfig | None, meta: SessionMeta | None) -> AgentConfig:
    """The agent given (one built in code, checked as a file is), else the stored session's,
    else the default; a stored session whose agent was built in code needs it given again."""
    if isinstance(agent, config.AgentConfig):
        return config.checked_agent(agent)
    if meta is not None and meta.agent_in_code and not agent:
        raise ConfigError(
            f"session {meta.id} ran an agent built in code ({meta.agent!r}), which is not stored: give it"
            " again (agent=AgentConfig(...)), or name an agent config to go on under that one"
        )
    return config.load_agent(agent or (meta.agent if meta else None) or "default")


def _backend(asked: str | None, model: str | None, script: Any, meta: SessionMeta | None, cfg: AgentConfig) -> Backend:
    """The backend by name: the one asked for, else the stored session's, the agent's, the default."""
    name = asked or (meta.backend if meta and not script else None) or cfg.backend or backends.default_name()
    # A model is another backend's name for it: one stored or configured for another backend is not asked for.
    stored = meta.model if meta and name == meta.backend else None
    configured = cfg.model if cfg.backend in ("", name) else None
    model = model or stored or configured or os.environ.get("OLLIE_MODEL")
    options = {"script": script} if script is not None else {}
    return backends.create(name, model or None, **options)


def _cwd(cwd: str | None, cwd_within: str, meta: SessionMeta | None) -> str:
    """A cwd given now, made real; a stored one as stored (it was real then: were it resolved again,
    a symlink put in its place since would move the session where the link points); a sub-agent's
    resolved beneath where it must stay, once: what was checked is what is kept."""
    if cwd_within:
        try:
            cwd = sandbox.directory_within(cwd or cwd_within, cwd_within)
        except sandbox.SandboxError as e:
            raise ConfigError(f"cwd: {e}") from None
    elif cwd:
        cwd = os.path.realpath(os.path.expanduser(cwd))
    else:
        cwd = meta.cwd if meta and meta.cwd else os.getcwd()
    if problem := paths.real_dir_problem(cwd):  # (a stored one swapped for a link since is not followed)
        raise ConfigError(f"cwd {cwd!r} {problem}")
    return cwd
