"""`Core`: the API a frontend drives. One session, its turns one after another, its agent and backend.

The turn itself is `loop.run_turn`; the session's state and its rules are `state.SessionState`;
what the user types (`/commands`, `!shell`) is `commands`, a layer above this one. `submit` takes
a prompt and nothing else, so a program that passes text through to it cannot run commands.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import backends, config, telemetry
from ..tools import CallContext, Dispatcher, Tool
from ..types import (
    BackendError,
    ContextSize,
    Cost,
    Event,
    GenerationParams,
    InvalidValue,
    NotFound,
    OllieError,
    TurnError,
    Usage,
)
from . import compaction, loop
from .checkpoints import Checkpoints
from .context import DEFAULT_WINDOW, Window
from .env import build_agent_env
from .events import Bus
from .extensions import ExtensionFactory, SessionHandle
from .hooks import Hooks
from .runtime import Runtime
from .session import SessionStore, new_session_id
from .state import SessionState, session_cost

if TYPE_CHECKING:
    from ..backends import Backend
    from .env import AgentEnv

log = logging.getLogger("ollie.core")

HOOK_FOLLOW_UPS = 10  # turns in a row a hook's exit 2 may start
FIELDS = ("state", "usage", "ctxsz", "cwd", "reply")


@dataclass(slots=True)
class _Prompt:
    """A prompt to run, and the `submit` that waits for its turn's outcome, if any."""

    text: str
    outcome: asyncio.Future[str] | None = None

    def settle(self, reply: str, error: OllieError | None) -> None:
        if self.outcome is not None and not self.outcome.done():
            if error is None:
                self.outcome.set_result(reply)
            else:
                self.outcome.set_exception(error)


@dataclass
class CoreConfig:
    backend: Backend
    env: AgentEnv  # the agent config, its dispatcher and resolved system prompt (build_agent_env)
    new_dispatcher: Callable[[], Dispatcher] | None = None  # for /agent switches
    session_id: str = ""  # restore this stored session; "" starts a new one
    store_root: Path | None = None  # default $OLLIE_DATA_PATH/sessions
    extensions: tuple[ExtensionFactory, ...] = ()  # called after each tool round; open_session's: the plans
    # A sub-agent's: the directory its cwd stays in; env.cwd was resolved beneath it (taken as it is)
    cwd_within: str = ""
    tree_cwd: str = ""  # a sub-agent's: the cwd its tree starts from
    agent_in_code: bool = False  # env.config was built in code: stored as such, to be given again


class Core:
    def __init__(self, cfg: CoreConfig):
        sid = cfg.session_id or new_session_id()
        # Checked before the store is touched, so that a refused start leaves nothing behind.
        tmpdir = _private_tmp() / sid
        agent = cfg.env.config
        state = SessionState(
            SessionStore(sid, cfg.store_root),
            agent.name,
            cfg.env.cwd if cfg.cwd_within else os.path.realpath(cfg.env.cwd or os.getcwd()),
            GenerationParams(**agent.params.nonempty()),
            busy=lambda: self.running or bool(self._holder),
            changed=lambda: self._rt.bus.notify(),
            cwd_within=cfg.cwd_within,
            tree_cwd=cfg.tree_cwd,
        )
        bus = Bus(state.store)
        self._rt = Runtime(
            state,
            bus,
            cfg.backend,
            cfg.env,
            Hooks(agent, state, bus.emit),
            Window(lambda: state.messages, lambda: self._rt.system_prompt()),
            tmpdir,
        )
        handle = SessionHandle(state, bus.emit)
        self._rt.extensions = [make(handle) for make in cfg.extensions]
        self._rt.checkpoints = Checkpoints(
            lambda: state.store.dir / "checkpoints.jsonl", lambda text: bus.emit(Event("info", text))
        )
        if agent.context_window:
            self._rt.window.length = agent.context_window
        self._new_dispatcher = cfg.new_dispatcher
        self._length_known = False  # the backend was asked for its context window
        self._queue: collections.deque[_Prompt] = collections.deque()
        self._turn: asyncio.Task[None] | None = None
        self._current: _Prompt | None = None  # the prompt whose turn (or its follow-ups) runs
        self._turn_error: OllieError | None = None  # what ended the last turn, if anything
        self._holder = ""  # what holds the session between awaits (a switch, a compaction), if anything
        self._agent_in_code = cfg.agent_in_code
        self._save_meta()
        shutil.rmtree(tmpdir, ignore_errors=True)  # one a crash left: what its code planted there goes
        tmpdir.mkdir(mode=0o700)
        loop.copy_results(state.store.dir, tmpdir)  # the whole results its history names, as they were
        telemetry.sessions(1)
        self._counted = True  # in the sessions-alive metric, until closed

    async def __aenter__(self) -> Core:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- what the session is ------------------------------------------------------------------------
    @property
    def session(self) -> SessionState:
        """The session's state: its history (`messages`), `cwd`, `env`, generation `params`, `plan`,
        `usage` and `meta`, with the setters that keep its rules (`set_cwd`, `set_env`, …)."""
        return self._rt.state

    @property
    def session_id(self) -> str:
        return self._rt.state.id

    @property
    def agent(self) -> config.AgentConfig:
        """The agent's config (its name, prompt, hooks, limits, …)."""
        return self._rt.env.config

    @property
    def backend(self) -> Backend:
        return self._rt.backend

    @property
    def dispatcher(self) -> Dispatcher:
        return self._rt.env.dispatcher

    @property
    def checkpoints(self) -> Checkpoints | None:
        """What each turn changed in the cwd (`rewind` takes it back); None if not kept."""
        return self._rt.checkpoints

    @property
    def tmpdir(self) -> Path:
        """The session's scratch directory (removed by `close`)."""
        return self._rt.tmpdir

    @property
    def state(self) -> str:
        return self._rt.bus.state

    @property
    def running(self) -> bool:
        return self._turn is not None and not self._turn.done()

    @property
    def reply(self) -> str:
        return self._rt.state.reply

    @property
    def prompt_offset(self) -> int | None:
        """Where the last prompt of this run starts in the chat log (None before the first)."""
        return self._rt.bus.prompt_offset

    def usage(self) -> Usage:
        return self._rt.state.usage

    def ctxsz(self) -> ContextSize:
        return self._rt.window.size()

    def cost(self) -> Cost:
        return session_cost(self._rt.state.meta, self._rt.state.usage, self.backend.model, self.backend.name)

    def system_prompt(self) -> str:
        return self._rt.system_prompt()

    def call_context(self) -> CallContext:
        return self._rt.call_context()

    async def models(self) -> list[str]:
        return sorted(await self._rt.backend.models())

    async def list_servers(self) -> dict[str, list[Tool]]:
        """Every server and its tools, by the names the model calls them; a server that failed
        lists none (`dispatcher.server_status()` says why)."""
        return {name: list(s.tools.values()) for name, s in (await self.dispatcher.server_status()).items()}

    # ---- settings (each refused with Busy while a turn runs, unless it says otherwise) ----------------
    def set_session_id(self, new_id: str) -> None:
        """Rename the session: its files and its scratch directory move."""
        if new_id == self.session_id:
            return
        self._rt.state.rename(new_id)
        new_tmp = _private_tmp() / new_id
        if self._rt.tmpdir.exists():
            os.rename(self._rt.tmpdir, new_tmp)
        self._rt.tmpdir = new_tmp

    def _save_meta(self) -> None:
        rt = self._rt
        rt.state.save_setup(
            rt.env.config.name,
            rt.backend.name,
            rt.backend.model,
            rt.system_prompt(),
            rt.window.size(),
            self._agent_in_code,
        )

    # ---- observing -----------------------------------------------------------------------------------
    def subscribe(self, handler: Callable[[Event], None], follows: bool = True) -> Callable[[], None]:
        """Call `handler` with every event; returns the function that unsubscribes it. Pass
        `follows=False` for a handler that does not show the model's text as it comes: while
        nothing follows it, an answer streams in fewer, larger pieces (`looked`). The handler is
        called, not awaited: an `async def` one is refused (its events would be lost)."""
        check_handler(handler)
        return self._rt.bus.subscribe(handler, follows)

    def looked(self) -> None:
        """Someone read the chat log: for a while (events.FOLLOW_LINGER) the model's text reaches
        it as it comes, as it does while a subscriber follows it; else a second at a time."""
        self._rt.bus.looked()

    @property
    def followed(self) -> bool:
        """Someone follows the model's text as it comes (a subscriber that shows it, a look)."""
        return self._rt.bus.followed()

    def emit(self, ev: Event) -> None:
        """Send an event to every subscriber and to the chat log (frontends may add notes too)."""
        self._rt.bus.emit(ev)

    async def say_notices(self) -> None:
        """Read the project's instructions and skills for a new cwd or agent, and emit, once, what
        that had to say (a file cut short or left out); a turn's start says what a new cwd's had."""
        await self._rt.say_notices()

    async def wait_change(self, name: str, current: Any, timeout: float | None = None) -> Any:
        """Block until `name` (one of FIELDS: the state word, the Usage, the ContextSize, the cwd,
        the reply) differs from `current`, or the timeout passes; return its value."""
        if name not in FIELDS:
            raise InvalidValue(f"unknown field {name!r}; fields: {', '.join(FIELDS)}")
        try:
            async with asyncio.timeout(timeout):
                while self._field(name) == current:
                    await self._rt.bus.changed()
        except TimeoutError:
            pass
        return self._field(name)

    def _field(self, name: str) -> Any:
        state = self._rt.state
        match name:
            case "state":
                return self.state
            case "usage":
                return replace(state.usage)  # a copy: the total changes in place
            case "ctxsz":
                return self.ctxsz()
            case "cwd":
                return state.cwd
        return state.reply

    def answered(self, text: str) -> None:
        """What a command run between turns said becomes `reply` (a turn's end sets its own)."""
        if not self.running:
            self._rt.state.reply = text

    # ---- prompts -------------------------------------------------------------------------------------
    async def submit(self, prompt: str) -> str:
        """Run `prompt` (and the follow-ups its hooks ask for) to completion, and return its
        turn's reply; while a turn runs, the prompt queues and this waits for its own turn.
        Raises the `OllieError` that ended its turn (a `BackendError`, a `TurnError`; completed
        work is kept and the session stays usable); an interrupt ends it without one.
        Cancelling the call takes the prompt back: out of the queue, or the turn interrupted.
        The prompt is only a prompt: `/commands` and `!shell` lines are `commands.submit`'s."""
        outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.start(prompt, outcome)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            self._withdraw(outcome)
            raise

    def _withdraw(self, outcome: asyncio.Future[str]) -> None:
        """A cancelled `submit`: its prompt out of the queue, or its turn interrupted."""
        outcome.cancel()
        for queued in self._queue:
            if queued.outcome is outcome:
                self._queue.remove(queued)
                self._rt.bus.notify()
                return
        if self._current is not None and self._current.outcome is outcome:
            self.interrupt()

    def start(self, prompt: str, outcome: asyncio.Future[str] | None = None) -> asyncio.Future[None]:
        """`submit` in the background (`outcome`, if given, gets what `submit` returns or
        raises). The turn counts as running from this call on: `state`, `reply` and the refusals
        of settings see it at once."""
        prompt = prompt.strip()
        if prompt and (self.running or self._holder):
            self._queue.append(_Prompt(prompt, outcome))
            # The reply a running turn already gave (its checkpoint and postTurn hooks still run) is
            # stale once a prompt waits: a script that writes `prompt`, then waits for `reply`, read it.
            self._rt.state.reply = ""
            self.emit(Event("info", f"queued: {prompt[:80]}"))
        elif prompt:
            return self._begin(_Prompt(prompt, outcome))
        elif outcome is not None:
            outcome.set_result("")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _begin(self, first: _Prompt) -> asyncio.Task[None]:
        self._rt.state.reply = ""
        self._rt.bus.set_state("thinking")
        self._turn = asyncio.create_task(self._run_until_idle(first))
        return self._turn

    def interrupt(self) -> bool:
        """Stop the running turn (completed work is kept); False when none runs."""
        if self._turn is None or not self.running:
            return False
        self._turn.cancel()
        return True

    def inject(self, prompt: str, replace: bool = False) -> str:
        """Deliver `prompt` into the running turn with the next tool result; else queue it (which
        starts it at once on an idle session). One message waits for delivery: another queues
        behind it, or `replace`s it. Returns what was done: "injected", "queued" or "started"."""
        if self.running and (self._rt.inject is None or replace):
            self._rt.inject = prompt
            return "injected"
        return "started" if self.queue(prompt) else "queued"

    def queue(self, prompt: str) -> bool:
        """Run `prompt` after what runs and what is queued before it. On an idle session that is
        now: the turn starts (as `start` would start it), for idle means that nothing runs and
        nothing waits. True when it started a turn."""
        prompt = prompt.strip()
        if not prompt:
            return False
        self._queue.append(_Prompt(prompt))
        self._rt.bus.notify()
        if self.running or self._holder:  # the queue runs when the turn or the holder is done
            self._rt.state.reply = ""  # stale, as in `start`
            return False
        self._begin(self._queue.popleft()).add_done_callback(_log_failure)
        return True

    def pop_queue(self) -> str | None:
        """Take back the next queued prompt (a `submit` waiting for it is told so)."""
        if not self._queue:
            return None
        taken = self._queue.popleft()
        taken.settle("", OllieError("the prompt was taken back from the queue before it ran"))
        return taken.text

    def queued(self) -> list[str]:
        return [queued.text for queued in self._queue]

    async def _run_until_idle(self, first: _Prompt) -> None:
        try:
            await self._run_turns(first)
        finally:
            self._rt.bus.set_state("idle")  # only now: no queued or follow-up turn is left to run

    async def _run_turns(self, first: _Prompt) -> None:
        follow_ups = 0  # turns in a row that a postTurn or turnError hook asked for
        current: _Prompt | None = first
        prompt = first.text
        try:
            while current is not None:
                self._current = current
                follow_up = await self._guarded_turn(prompt)
                follow_ups, follow_up = self._follow_up(follow_up, follow_ups)
                if follow_up is not None:
                    prompt = follow_up  # still the same prompt's work
                    continue
                current.settle(self._rt.state.reply, self._turn_error)
                current = self._queue.popleft() if self._queue else None
                prompt = current.text if current else ""
        finally:
            self._current = None
            if current is not None:  # the runner itself was cancelled (the session closes)
                current.settle("", OllieError("the session closed before the turn ended"))

    def _follow_up(self, follow_up: str | None, follow_ups: int) -> tuple[int, str | None]:
        """The turn a hook or an injected message asks for next, if any, and how many hooks
        asked for in a row."""
        follow_ups = follow_ups + 1 if follow_up is not None else 0
        if follow_ups > HOOK_FOLLOW_UPS:  # a hook that always exits 2 would run turns (and bills) forever
            self.emit(
                Event(
                    "info",
                    f"hooks asked for {HOOK_FOLLOW_UPS} more turns in a row; not another "
                    "(does a postTurn or turnError hook always exit 2?)",
                )
            )
            follow_up, follow_ups = None, 0
        if follow_up is None and self._rt.inject is not None:
            follow_up, self._rt.inject = self._rt.inject, None
        return follow_ups, follow_up

    async def _guarded_turn(self, prompt: str) -> str | None:
        """One turn, whatever happens in it: errors become events, completed work is saved."""
        self._rt.bus.set_state("thinking")
        await self._rt.say_notices()
        self._turn_error = None
        try:
            try:
                if not self._length_known:
                    await self.refresh_context_length()
                return await loop.run_turn(self._rt, prompt)
            except Exception as e:
                if not isinstance(e, OllieError):
                    log.error("turn failed", exc_info=e)
                self._turn_error = e if isinstance(e, OllieError) else TurnError(f"the turn failed: {e!r}")
                return await loop.turn_failed(self._rt, e)
        except asyncio.CancelledError:  # an interrupt, in the turn or in its turnError hook
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self._turn_error = None  # asked for: no failure
            self.emit(Event("info", "interrupted", data={"interrupted": True}))
            return None
        finally:
            if self._rt.checkpoints is not None:
                await self._rt.checkpoints.turn_ended()
            self._save_meta()
            self.emit(Event("done"))

    # ---- the history ---------------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget the history (it stays on disk in compaction.jsonl)."""
        self._rt.state.clear()
        self._rt.window.reset()
        self._rt.bus.notify()

    async def rewind(self, back: int = 1, *, apply: bool = True, force: bool = False, chat: bool = False) -> str:
        """Take back what the last `back` checkpointed turns changed in the cwd (`/undo` is one);
        with `chat` the conversation goes back to before them too. A file changed since those
        turns is not overwritten unless `force`. Without `apply`, say what it would change."""
        checkpoints = self._rt.checkpoints
        if checkpoints is None:
            raise InvalidValue("this session keeps no checkpoints")
        async with self._holding("go back to a checkpoint"):
            if not apply:
                plan = await checkpoints.plan(back)
                warn = f"\nchanged since, would be overwritten (needs --force): {', '.join(plan.changed_since)}"
                return f"going back to before turn {plan.target.turn} would:\n{plan.describe()}" + (
                    warn if plan.changed_since else ""
                )
            messages = self._rt.state.messages
            if chat:
                target = checkpoints.live()[-back] if 0 < back <= len(checkpoints.live()) else None
                at = target.history if target else -1
                if target is None or at >= len(messages) or not messages[at].content.startswith(target.prompt):
                    raise InvalidValue(
                        "the conversation was compacted or cleared since that turn: go back without --chat"
                    )
            plan, undone = await checkpoints.rewind(back, force)
            if chat:
                self._rt.replace_history(messages[: undone[0].history])
            turns = ", ".join(str(c.turn) for c in undone)
            return f"went back to before turn {undone[0].turn} (undid turn {turns}):\n{plan.describe()}"

    async def compact(self) -> None:
        """Summarise the history to free the context window."""
        async with self._holding("compact"):
            await compaction.compact(self._rt, reason="manual")

    @contextlib.asynccontextmanager
    async def _holding(self, what: str) -> AsyncIterator[None]:
        """Hold the session for work that awaits (a switch, a compaction): settings are refused and
        prompts queue until it ends, then the queue runs."""
        self._rt.state.require_idle(what)
        self._holder = what
        try:
            yield
        finally:
            self._holder = ""
            if self._queue:
                self._begin(self._queue.popleft())

    # ---- switching -----------------------------------------------------------------------------------
    async def set_backend(self, name: str, model: str | None = None) -> None:
        """Switch to backend `name` (its default model unless `model`); the history is kept."""

        async with self._holding("switch the backend"):
            new = backends.create(name, model or None)
            old, self._rt.backend = self._rt.backend, new
            self._new_window()
            await old.aclose()
            self._save_meta()

    async def set_model(self, model: str) -> None:
        """Switch model on the same backend; refused for a model the backend lists none like
        (`llama3` stands for `llama3:latest`, `claude-x` for `claude-x-20250101`)."""
        if not model:
            raise InvalidValue("give a model name")
        self._rt.state.require_idle("switch the model")
        try:
            models = await self.models()
        except Exception:  # the backend cannot list them now: its first request will say
            models = []
        if models and not any(m == model or m.startswith((f"{model}:", f"{model}-", f"{model}@")) for m in models):
            raise NotFound(f"no model {model!r} on {self.backend.name}; models: {', '.join(models)}")
        await self.set_backend(self.backend.name, model)

    def _new_window(self) -> None:
        """Another backend or agent: its window is asked for before the next turn."""
        self._rt.window.length = self._rt.env.config.context_window or DEFAULT_WINDOW
        self._length_known = False

    async def set_agent(self, name: str) -> None:
        """Switch agent, keeping the history and the cwd. Everything else comes from the new
        agent's config: its tool servers (the old ones are closed), system prompt, hooks, sandbox
        policies, generation parameters (settings made with `set_param` are dropped), context
        window, and its backend and model if it names them (else the current ones stay). Its
        agentSpawn hooks run; their output replaces the old agent's in the system prompt."""

        rt = self._rt
        if self._new_dispatcher is None:
            raise InvalidValue("this session was built without a dispatcher factory; cannot switch agents")
        async with self._holding("switch the agent"):
            # Everything that may fail comes first: a refused switch leaves the session as it was.
            cfg = config.load_agent(name)
            new_backend = None
            if cfg.backend or cfg.model:
                new_backend = backends.create(cfg.backend or rt.backend.name, cfg.model or None)
            try:
                env = await build_agent_env(cfg, self._new_dispatcher(), rt.state.cwd, rt.state.written)
            except BaseException:
                if new_backend is not None:
                    await new_backend.aclose()
                raise
            await rt.env.dispatcher.close()
            await rt.hooks.close()
            rt.env, rt.hooks = env, Hooks(cfg, rt.state, rt.bus.emit)
            rt.state.switched(GenerationParams(**cfg.params.nonempty()))
            self._agent_in_code = False  # a config of the agents path now, found again by name
            if new_backend is not None:
                old, rt.backend = rt.backend, new_backend
                await old.aclose()
            self._new_window()
            for info in rt.env.infos:
                self.emit(Event("info", info))
            await rt.say_notices()
            await self.spawned()

    async def spawned(self) -> None:
        """Run the agentSpawn hooks (a new session, or an agent switch); their output primes the
        session: it becomes part of the system prompt."""
        outcome = await self._rt.hooks.run("agentSpawn", {"agent": self.agent.name})
        self._rt.state.set_primer(outcome.output)
        self._save_meta()  # one write: the primer and the system prompt it makes

    async def refresh_context_length(self) -> None:
        """Ask the backend for its window (unless the agent config sets one); done before the
        first turn after a start or a switch, so a Core built by hand gets it too."""
        self._length_known = True
        window = self._rt.window
        if configured := self._rt.env.config.context_window:
            window.length = configured
            return
        try:
            window.length = await self._rt.backend.context_length() or DEFAULT_WINDOW
        except Exception as e:
            window.length = DEFAULT_WINDOW
            # A server that gave no answer at all: the turn's request says so, once, where it is read.
            unanswered = isinstance(e, BackendError) and e.status is None
            level = logging.INFO if unanswered else logging.WARNING
            log.log(level, "context length unknown for %s: %s", self.backend.name, e)

    def trace_under(self, parent: Callable[[], object | None]) -> None:
        """Traces: this session's turns become children of what `parent` returns when a turn
        starts (a parent session's running tool call, `trace_context`), or roots when it is None."""
        self._rt.trace_parent = parent

    def trace_context(self) -> object | None:
        """Traces: the context of this session's tool call running now, if any (opaque)."""
        return self._rt.trace_tool

    def _keep_results(self) -> None:
        """The whole results the history names, kept with the session as they are now."""
        store = self._rt.state.store.dir
        shutil.rmtree(store / loop.RESULTS, ignore_errors=True)
        loop.copy_results(self._rt.tmpdir, store)

    async def close(self) -> None:
        """Stop the turn (queued prompts are dropped), close the tool servers, hooks and the
        backend, remove the tmpdir."""
        for queued in self._queue:  # said in the chat: a server's stop does not keep them
            self.emit(Event("info", f"not run, the session closed first: {queued.text[:80]}"))
            queued.settle("", OllieError("the session closed before the prompt ran"))
        self._queue.clear()
        self._rt.inject = None
        if self._turn is not None and self.running:
            self._turn.cancel()
            await asyncio.gather(self._turn, return_exceptions=True)
        if self._rt.checkpoints is not None:
            await self._rt.checkpoints.close()
        await self.dispatcher.close()
        await self._rt.hooks.close()
        await self._rt.backend.aclose()
        self._save_meta()
        self._rt.bus.flush()
        self._rt.state.store.close()
        await asyncio.to_thread(self._keep_results)
        self._rt.state.store.let_go()
        shutil.rmtree(self._rt.tmpdir, ignore_errors=True)
        if self._counted:
            self._counted = False
            telemetry.sessions(-1)


def check_handler(handler: Callable[[Event], None]) -> None:
    """An event handler is called, never awaited: an `async def` one would lose every event."""
    if inspect.iscoroutinefunction(handler):
        raise InvalidValue(
            "an event handler is a function that returns None, not an async one: it is called, never"
            " awaited (to await, start a task in it: asyncio.get_running_loop().create_task(...))"
        )


def _log_failure(turn: asyncio.Future[None]) -> None:
    """A turn nobody awaits (one a queued prompt started): what escaped it is logged."""
    if not turn.cancelled() and turn.exception() is not None:
        log.error("turn failed", exc_info=turn.exception())


def _private_tmp() -> Path:
    """The parent of session tmpdirs, refused unless it is ours alone: in a shared /tmp another
    user could create it first and then read or swap what tools keep there."""
    return config.private_dir(config.tmp_path())
