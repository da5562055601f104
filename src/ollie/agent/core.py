"""The agent: `Core` is the API frontends drive; `_run_turn` is the loop.

One turn: send history to the backend, stream the answer, run the tool calls it asks for (in the
model's order), append the results, repeat until the model answers without tools. Everything a
frontend sees arrives as `Event`s; everything completed is on disk before the next request.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config
from ..chatfmt import ChatRenderer
from ..textcalls import BadArguments, arguments_text, parse_arguments, recover_tool_calls, stable_call_id
from ..tools import CallContext, Dispatcher, Tool, ToolResult
from ..types import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    Done,
    Event,
    GenerationParams,
    Message,
    OllieError,
    RateLimitError,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    TransientError,
    Usage,
    UsageChunk,
    valid_text,
    valid_value,
)
from . import context, hooks
from .session import SessionMeta, SessionStore, check_session_id, new_session_id

if TYPE_CHECKING:
    from ..backends import Backend
    from .env import AgentEnv

log = logging.getLogger("ollie.core")

MAX_ATTEMPTS = 4  # requests per step, retries included
RETRY_CAP = 60.0  # seconds: no provider's Retry-After makes us wait longer than this
HOOK_FOLLOW_UPS = 10  # turns in a row a hook's exit 2 may start
RESULT_LIMIT = 8192  # bytes of a tool result the model sees; the rest is saved to the tmpdir
NUDGE_AFTER, FAIL_AFTER = 5, 10  # consecutive all-error tool rounds
PLAN_EVERY = 10  # rounds between re-showing the plan
FIELDS = ("state", "usage", "ctxsz", "cwd", "reply")


class TurnError(Exception):
    """The turn cannot go on (the message says why); completed work is kept."""


@dataclass
class CoreConfig:
    backend: Backend
    env: AgentEnv  # the agent config, its dispatcher and resolved system prompt (build_agent_env)
    new_dispatcher: Callable[[], Dispatcher] | None = None  # for /agent switches
    session_id: str = ""  # restore this stored session; "" starts a new one
    store_root: Path | None = None  # default $OLLIE_DATA_PATH/sessions


class Core:
    def __init__(self, cfg: CoreConfig):
        self.backend = cfg.backend
        self._env = cfg.env
        self._new_dispatcher = cfg.new_dispatcher
        sid = cfg.session_id or new_session_id()
        # Checked before the store is touched, so that a refused start leaves nothing behind.
        self.tmpdir = _private_tmp() / sid
        self._store = SessionStore(sid, cfg.store_root)
        self.messages: list[Message] = []
        self.usage_total = Usage()
        self.params = GenerationParams(**cfg.env.config.params.nonempty())
        self._env_vars: dict[str, str] = {}
        self._cwd = os.path.abspath(cfg.env.cwd or os.getcwd())
        self.plan = ""
        self._meta = SessionMeta(id=sid, agent=cfg.env.config.name)
        self._reply = ""
        self._hook_runner: hooks.Runner | None = None
        if self._store.exists():
            self._restore()
        else:
            self._store.create()
        self._meta.backend, self._meta.model = self.backend.name, self.backend.model
        self._save_meta()
        self._state = "idle"
        self._queue: collections.deque[str] = collections.deque()
        self._inject: str | None = None
        self._turn: asyncio.Task | None = None
        self._subscribers: list[Callable[[Event], None]] = []
        self._changed = asyncio.Event()
        self._renderer = ChatRenderer()
        self._ctx_len: int | None = cfg.env.config.context_window or None
        self._ctx_asked = False
        self.tmpdir.mkdir(exist_ok=True, mode=0o700)
        self.window = context.Window(self)

    def _restore(self) -> None:
        meta = self._store.load_meta()
        self._meta = meta
        self.messages = self._store.load_history()
        self.usage_total = Usage(**meta.usage) if meta.usage else Usage()
        self._env_vars = dict(meta.env)
        for k, v in meta.params.items():
            self.params.set(k, v)
        if meta.cwd and os.path.isdir(meta.cwd):
            self._cwd = meta.cwd
        self.plan = self._store.load_plan()
        self._reply = last_reply(self.messages)
        self._store.end_cut_turn("the turn was cut short when ollie stopped; completed work is kept")

    # ---- identity and settings ------------------------------------------------------------------
    @property
    def session_id(self) -> str:
        return self._store.id

    def set_session_id(self, new_id: str) -> None:
        self._refuse_while_running("rename the session")
        check_session_id(new_id)
        if new_id == self.session_id:
            return
        self._store.rename(new_id)
        new_tmp = _private_tmp() / new_id
        if self.tmpdir.exists():
            os.rename(self.tmpdir, new_tmp)
        self.tmpdir = new_tmp
        self._meta.id = new_id
        self._save_meta()

    @property
    def agent_name(self) -> str:
        return self._env.config.name

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def model(self) -> str:
        return self.backend.model

    @property
    def dispatcher(self) -> Dispatcher:
        return self._env.dispatcher

    @property
    def agent_config(self) -> config.AgentConfig:
        return self._env.config

    @property
    def hook_runner(self) -> hooks.Runner | None:
        """What runs this session's hooks confined (None: the agent runs them unsandboxed)."""
        policy = self._env.config.hook_sandbox
        if not policy:
            return None
        if self._hook_runner is None:  # closed and dropped by an agent switch
            self._hook_runner = hooks.Runner(str(policy))
        return self._hook_runner

    def call_context(self) -> CallContext:
        """What a tool call of this session runs with: its cwd, env, scratch dir, allowed policies."""
        return CallContext(cwd=self._cwd, session_id=self.session_id, env=dict(self._env_vars), tmpdir=str(self.tmpdir),
                           policies=tuple(self._env.config.sandboxes))

    @property
    def meta(self) -> SessionMeta:
        return self._meta

    @property
    def chat_path(self) -> Path:
        return self._store.chat_path

    @property
    def cwd(self) -> str:
        return self._cwd

    def set_cwd(self, path: str) -> None:
        path = os.path.abspath(os.path.join(self._cwd, os.path.expanduser(path)))
        if not os.path.isdir(path):
            raise ValueError(f"not a directory: {path}")
        self._cwd = path
        self._save_meta()
        self._notify()

    @property
    def env(self) -> dict[str, str]:
        return dict(self._env_vars)

    def set_env(self, key: str, value: str | None) -> None:
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"invalid variable name {key!r}")
        if value is not None and "\0" in value:
            raise ValueError(f"the value of {key} contains a NUL byte")
        if value is None:
            self._env_vars.pop(key, None)
        else:
            self._env_vars[key] = value
        self._save_meta()

    def set_param(self, key: str, value: Any) -> None:
        self._refuse_while_running("change generation parameters")
        self.params.set(key, value)
        self._save_meta()

    def set_plan(self, text: str) -> None:
        self.plan = text
        self._store.save_plan(text)

    def _refuse_while_running(self, what: str) -> None:
        if self.running:
            raise ValueError(f"cannot {what} while a turn is running; interrupt it first")

    def _save_meta(self) -> None:
        m = self._meta
        m.cwd, m.env, m.params = self._cwd, self._env_vars, self.params.nonempty()
        m.agent, m.backend, m.model = self._env.config.name, self.backend.name, self.backend.model
        m.usage = {k: v for k, v in vars_of(self.usage_total).items()}
        self._store.save_meta(m)

    # ---- observing ---------------------------------------------------------------------------------
    def subscribe(self, handler: Callable[[Event], None]) -> Callable[[], None]:
        self._subscribers.append(handler)
        return lambda: self._subscribers.remove(handler) if handler in self._subscribers else None

    def emit(self, ev: Event) -> None:
        """Send an event to every subscriber and to the chat log (frontends may add notes too)."""
        ev.text = valid_text(ev.text)  # whatever it quotes (a server's error, a prompt) must be writable
        if text := self._renderer.render(ev):
            self._store.append_chat(text)
        for handler in tuple(self._subscribers):
            try:
                handler(ev)
            except Exception:  # a broken frontend must not break the loop
                log.exception("event handler failed")
        if ev.kind in ("usage", "done", "state"):
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.emit(Event("state", state))

    @property
    def state(self) -> str:
        return self._state

    @property
    def running(self) -> bool:
        return self._turn is not None and not self._turn.done()

    @property
    def reply(self) -> str:
        return self._reply

    def field(self, name: str) -> str:
        if name not in FIELDS:
            raise ValueError(f"unknown field {name!r}; fields: {', '.join(FIELDS)}")
        return {"state": lambda: self._state, "usage": self.usage, "ctxsz": self.ctxsz,
                "cwd": lambda: self._cwd, "reply": lambda: self._reply}[name]()

    async def wait_change(self, name: str, current: str, timeout: float | None = None) -> str:
        """Block until `name` differs from `current` (or the timeout passes); return its value."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.field(name) == current:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                break
        return self.field(name)

    def usage(self) -> str:
        u = self.usage_total
        s = f"{u.input_tokens} in, {u.output_tokens} out, {u.requests} requests"
        if u.cache_read_tokens:
            s += f", {u.cache_read_tokens} cached"
        return s + (" [estimated]" if u.estimated else "")

    def ctxsz(self) -> str:
        est, size = self.window.estimate(), self.context_length
        return f"{est} / {size} ({100 * est // max(size, 1)}%)"

    @property
    def context_length(self) -> int:
        return self._ctx_len or context.DEFAULT_WINDOW

    def cost(self) -> str:
        return f"costLast=${self._meta.cost_last:.6f}\ncostSession=${self._meta.cost_session:.6f}" + (
            "" if self._price_known() else f"\n(no price known for model {self.model!r}: counted as $0)"
        )

    def _price_known(self) -> bool:
        from ..cost import cost_of

        return self.usage_total.cost is not None or cost_of(self.model, Usage(input_tokens=1))[1]

    def system_prompt(self) -> str:
        return self._env.system_prompt

    def context_jsonl(self) -> str:
        return "".join(json.dumps(m.to_dict(), ensure_ascii=False) + "\n" for m in self.messages)

    async def models(self) -> list[str]:
        return sorted(await self.backend.models())

    async def list_servers(self) -> dict[str, list[Tool]]:
        """Every server and its tools, by the names the model calls them; a server that failed
        lists none (`dispatcher.server_status()` says why)."""
        return {name: list(s.tools.values()) for name, s in (await self.dispatcher.server_status()).items()}

    # ---- prompts -----------------------------------------------------------------------------------
    async def submit(self, prompt: str) -> None:
        """Run `prompt` (and every follow-up) to completion; while a turn runs, queue it instead.
        `/commands` and `!shell` lines are handled at once, even during a turn."""
        prompt = prompt.strip()
        if not prompt:
            return
        if prompt[0] in "/!":
            from .commands import run_command

            if await run_command(self, prompt):
                return
        if self.running:
            self._queue.append(prompt)
            self.emit(Event("info", f"queued: {prompt[:80]}"))
            return
        # Visible at once, before the task first runs: a script that writes a prompt and then reads
        # `reply` or `state` must not see the previous turn's.
        self._reply = ""
        self._set_state("thinking")
        self._turn = asyncio.create_task(self._run_until_idle(prompt))
        await asyncio.shield(self._turn)

    def start(self, prompt: str) -> asyncio.Task:
        """`submit` in the background (for frontends that must not wait)."""
        return asyncio.ensure_future(self.submit(prompt))

    def interrupt(self) -> bool:
        if not self.running:
            return False
        self._turn.cancel()
        return True

    def inject(self, prompt: str, replace: bool = False) -> None:
        """Deliver `prompt` into the running turn with the next tool result; else queue it.
        One message waits for delivery: another queues behind it, or `replace`s it."""
        if self.running and (self._inject is None or replace):
            self._inject = prompt
        else:
            self.queue(prompt)

    def queue(self, prompt: str) -> None:
        self._queue.append(prompt)
        self._notify()

    def pop_queue(self) -> str | None:
        return self._queue.popleft() if self._queue else None

    def queued(self) -> list[str]:
        return list(self._queue)

    async def _run_until_idle(self, prompt: str | None) -> None:
        follow_ups = 0  # turns in a row that a postTurn or turnError hook asked for
        while prompt is not None:
            follow_up = await self._guarded_turn(prompt)
            follow_ups = follow_ups + 1 if follow_up is not None else 0
            if follow_ups > HOOK_FOLLOW_UPS:  # a hook that always exits 2 would run turns (and bills) forever
                self.emit(Event("info", f"hooks asked for {HOOK_FOLLOW_UPS} more turns in a row; not another "
                                        "(does a postTurn or turnError hook always exit 2?)"))
                follow_up, follow_ups = None, 0
            if follow_up is None and self._inject is not None:
                follow_up, self._inject = self._inject, None
            prompt = follow_up if follow_up is not None else self.pop_queue()

    async def _guarded_turn(self, prompt: str) -> str | None:
        """One turn, whatever happens in it: errors become events, the state returns to idle."""
        try:
            try:
                return await self._run_turn(prompt)
            except Exception as e:
                return await self._turn_failed(e)
        except asyncio.CancelledError:  # an interrupt, in the turn or in its turnError hook
            asyncio.current_task().uncancel()
            self.emit(Event("info", "interrupted"))
            return None
        finally:
            self._set_state("idle")
            self._save_meta()
            self.emit(Event("done"))

    async def _turn_failed(self, e: Exception) -> str | None:
        """Report why the turn failed; a turnError hook may answer with the next prompt."""
        kind = getattr(e, "kind", "unknown")
        if not isinstance(e, (OllieError, TurnError)):
            log.error("turn failed", exc_info=e)
        self.emit(Event("error", str(e) or type(e).__name__, data={"error_type": kind}))
        return (await hooks.run(self, "turnError", {"error": str(e), "error_type": kind})).next_prompt

    # ---- the loop ----------------------------------------------------------------------------------
    async def _run_turn(self, prompt: str) -> str | None:
        """Run one turn; return a follow-up prompt (from a postTurn hook) or None."""
        prompt = valid_text(prompt)  # an argv or a file may hold bytes that are no UTF-8
        self._reply = ""
        self._check_spending_cap()
        if not self._ctx_asked:
            await self.refresh_context_length()
        pre = await hooks.run(self, "preTurn", {"prompt": prompt})
        if pre.blocked:
            raise TurnError(f"preTurn hook blocked the turn: {pre.reason}")
        await self.window.before_turn(prompt)
        content = prompt + (f"\n\n{pre.output}" if pre.output else "")
        if not self._meta.first_prompt:
            self._meta.first_prompt = prompt[:200]
        self.emit(Event("user", prompt))
        start = len(self.messages)
        self._commit([Message("user", content)])
        try:
            await self._steps()
        except ContextOverflowError:
            self.emit(Event("info", "context overflow: compacting and retrying the turn"))
            turn = len(self.messages) - start  # the prompt and the turn's work so far stay as they are
            await self.window.compact(reason="overflow", keep_last=turn)
            start = len(self.messages) - turn
            await self._steps()
        self._reply = "\n".join(m.content for m in self.messages[start:] if m.role == "assistant" and m.content)
        post = await hooks.run(self, "postTurn", {"prompt": prompt, "reply": self._reply})
        return post.reason if post.blocked else None

    async def _steps(self) -> None:
        tools = await self._tool_specs()
        failing = steps = 0
        max_steps = self._env.config.max_steps
        while True:
            if max_steps and steps >= max_steps:
                await self._last_answer(max_steps)
                return
            steps += 1
            assistant = await self._request(tools)
            if not assistant.tool_calls:
                self._commit([assistant])
                return
            results = await self._run_calls(assistant)
            failing = failing + 1 if all(r.is_error for r in results) else 0
            if failing >= FAIL_AFTER:
                self._commit([assistant, *results])
                raise TurnError(f"{FAIL_AFTER} consecutive tool rounds failed; stopping the turn")
            self._add_notes(results[-1], failing, steps)
            self._commit([assistant, *results])

    async def _last_answer(self, max_steps: int) -> None:
        """The step budget is spent: one more answer, without tools, that sums the work up."""
        self.emit(Event("maxsteps", f"step budget of {max_steps} exhausted"))
        note = (f"[The step budget of {max_steps} steps is exhausted. Do not call tools. Summarize "
                "what you did, what you found and what remains to be done.]")
        self._commit([Message("user", note)])
        final = await self._request([])
        final.tool_calls = []  # no tools were offered: a call now could never get its result
        self._commit([final])

    def _add_notes(self, result: Message, failing: int, steps: int) -> None:
        """What the model must hear besides the results: a nudge after failing rounds, the plan
        now and then, a message the user injected."""
        notes = []
        if failing == NUDGE_AFTER:
            notes.append(f"[{NUDGE_AFTER} tool rounds in a row failed. Step back: read the errors, "
                         "check your assumptions, and try a different approach.]")
        if self.plan and steps % PLAN_EVERY == 0:
            notes.append(f"[Your plan, as it stands:]\n{self.plan}")
        if self._inject is not None:
            notes.append(f"<system-user-interruption>{self._inject}</system-user-interruption>")
            self._inject = None
        if notes:
            result.content += "\n\n" + "\n\n".join(notes)

    def _commit(self, messages: list[Message]) -> None:
        """Append completed messages to the history and to disk; nothing in them may be unwritable
        as UTF-8 or unsendable (tool calls are checked as they are put together)."""
        for m in messages:
            m.content = valid_text(m.content)
            if m.provider_data:
                m.provider_data = valid_value(m.provider_data)
        self.messages.extend(messages)
        self._store.append_messages(messages)
        self.window.added(messages)

    async def _tool_specs(self) -> list[ToolSpec]:
        if not self._env.config.tools:
            return []
        specs = [tool.spec(name) for name, tool in (await self.dispatcher.list_tools()).items()]
        self.window.offered(specs)
        return specs

    async def _request(self, tools: list[ToolSpec]) -> Message:
        """One model answer, retrying rate limits, 5xx and dropped streams with capped waits."""
        self._check_spending_cap()
        for attempt in range(MAX_ATTEMPTS):
            try:
                return await self._stream_once(tools)
            except (RateLimitError, TransientError) as e:
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                if isinstance(e, RateLimitError):
                    wait, kind = e.retry_after if e.retry_after is not None else 5.0 * 2**attempt, "limitretry"
                else:
                    wait, kind = 2.0 * 2**attempt, "retry"
                await self._countdown(min(wait, RETRY_CAP), kind, str(e))
        raise AssertionError("unreachable")

    async def _countdown(self, seconds: float, kind: str, why: str) -> None:
        self._set_state("limitretry" if kind == "limitretry" else "thinking")
        left, first = seconds, True
        while True:  # an event a second, the first and the last (0 s left) included
            self.emit(Event(kind, why, data={"seconds": round(left, 1), "first": first}))
            if left <= 0:
                return
            first = False
            step = min(1.0, left)
            await asyncio.sleep(step)
            left -= step

    async def _stream_once(self, tools: list[ToolSpec]) -> Message:
        self._set_state("thinking")
        messages = [Message("system", self._env.system_prompt), *self.messages]
        text: list[str] = []
        parts: dict[int, list[ToolCallDelta]] = {}
        done: Done | None = None
        counted = False
        async for chunk in self.backend.stream(messages, tools, self.params):
            if isinstance(chunk, TextDelta):
                text.append(self._text_of(chunk))
                self.emit(Event("assistant", text[-1]))
            elif isinstance(chunk, ToolCallDelta):
                if not isinstance(chunk.index, int):  # no telling which call the piece belongs to
                    raise BackendError(f"malformed answer: a tool call piece has the index {chunk.index!r}, "
                                       "not a number", provider=self.backend.name)
                parts.setdefault(chunk.index, []).append(chunk)
            elif isinstance(chunk, UsageChunk):
                counted = counted or bool(chunk.usage.input_tokens or chunk.usage.output_tokens)
                self._add_usage(chunk.usage)
                self.window.measured(chunk.usage)
            elif isinstance(chunk, ReasoningDelta):
                self.emit(Event("reasoning", self._text_of(chunk)))
            elif isinstance(chunk, Done):
                done = chunk
        if done is None:
            raise TransientError("the stream ended before the answer was complete", provider=self.backend.name)
        calls = self._assemble_calls(parts)
        content = valid_text("".join(text))  # before recovering calls from it: their arguments come from it
        if not counted:  # the backend gave no token counts: estimate them, and say so
            out = len(content) + sum(len(c.arguments) for c in calls)
            self._add_usage(Usage(input_tokens=self.window.estimate(), output_tokens=out // context.CHARS_PER_TOKEN,
                                  requests=0, estimated=True))
        if not calls and tools and content:
            content, calls = recover_tool_calls(content, {t.name for t in tools}, len(self.messages))
        if done.stop_reason == "length" and not calls:
            self.emit(Event("info", "the answer was cut off at the token limit"))
        return Message("assistant", content, tool_calls=calls, provider_data=done.provider_data)

    def _text_of(self, chunk: TextDelta | ReasoningDelta) -> str:
        if not isinstance(chunk.text, str):
            what = "text" if isinstance(chunk, TextDelta) else "reasoning"
            raise BackendError(f"malformed answer: a piece of its {what} is {type(chunk.text).__name__}, not a string",
                               provider=self.backend.name)
        return chunk.text

    def _assemble_calls(self, parts: dict[int, list[ToolCallDelta]]) -> list[ToolCall]:
        """The answer's calls from their pieces, fit for the history whatever the backend sent: a
        name or arguments that are no text become text (then an unknown name or bad arguments give
        the call its error result), and an id that is missing, no text or already used is replaced
        by a stable one (providers refuse a history in which two calls share an id)."""
        taken = {c.id for m in self.messages for c in m.tool_calls}
        calls = []
        for i, (_, pieces) in enumerate(sorted(parts.items())):
            name = valid_text("".join(_as_text(p.name) for p in pieces))
            args = valid_text("".join(_as_text(p.arguments) for p in pieces))
            call_id = next((p.id for p in pieces if p.id), "")
            if not isinstance(call_id, str) or not call_id or call_id in taken:
                call_id = stable_call_id(len(self.messages), i, name, args)
            taken.add(call_id)
            calls.append(ToolCall(valid_text(call_id), name, args))
        return calls

    def _add_usage(self, usage: Usage) -> None:
        """Count a request's tokens and cost into the session's (summary requests too)."""
        from ..cost import cost_of

        counts = vars_of(usage)
        if bad := [k for k, v in counts.items() if not isinstance(v, (int, float)) and (k, v) != ("cost", None)]:
            raise BackendError(f"malformed answer: its usage ({', '.join(bad)}) is not in numbers",
                               provider=self.backend.name)
        self.usage_total.add(usage)
        last = usage.cost if usage.cost is not None else cost_of(self.model, usage)[0]
        self._meta.cost_last = last
        self._meta.cost_session += last
        self.emit(Event("usage", self.usage(), data=vars_of(self.usage_total)))

    def _check_spending_cap(self) -> None:
        """Before every request: a session that spent OLLIE_MAX_SESSION_COST makes no more.
        (The answer that crossed the cap is kept: it is paid for.)"""
        cap = os.environ.get("OLLIE_MAX_SESSION_COST")
        if not cap:
            return
        try:
            limit = float(cap)
        except ValueError:
            raise ConfigError(f"OLLIE_MAX_SESSION_COST={cap!r} is not an amount of US dollars; "
                              "set it like OLLIE_MAX_SESSION_COST=5, or unset it") from None
        if self._meta.cost_session > limit:
            raise TurnError(f"session cost ${self._meta.cost_session:.4f} exceeds OLLIE_MAX_SESSION_COST=${cap}; "
                            "raise the cap to go on")

    # ---- tool calls --------------------------------------------------------------------------------
    async def _run_calls(self, assistant: Message) -> list[Message]:
        """Run the calls in the model's order; consecutive read-only calls run concurrently and
        identical ones once. On interrupt, calls that did not finish are stripped from history."""
        calls = assistant.tool_calls
        results: list[Message] = []
        running: dict[tuple[str, str], asyncio.Future] = {}
        try:
            for batch in self._batches(calls, await self.dispatcher.list_tools()):
                running = {}
                for call in batch:
                    if (call.name, call.arguments) not in running:
                        running[call.name, call.arguments] = asyncio.ensure_future(self._call(call))
                await asyncio.gather(*running.values())
                for call in batch:
                    r = running[call.name, call.arguments].result()
                    results.append(Message("tool", r.content, tool_call_id=call.id, name=call.name, is_error=r.is_error))
        except BaseException:  # an interrupt, or a failure no call result could carry
            for future in running.values():
                future.cancel()
            if results or assistant.content:
                assistant.tool_calls = calls[: len(results)]
                self._commit([assistant, *results])
            raise
        return results

    def _batches(self, calls: list[ToolCall], tools: dict[str, Tool]) -> Iterator[list[ToolCall]]:
        """The calls in order: each run of read-only calls as one batch, every other call alone."""
        reads: list[ToolCall] = []
        for call in calls:
            if self._read_only(call, tools):
                reads.append(call)
                continue
            if reads:
                yield reads
                reads = []
            yield [call]
        if reads:
            yield reads

    @staticmethod
    def _read_only(call: ToolCall, tools: dict[str, Tool]) -> bool:
        tool = tools.get(call.name)
        if tool is None or not (tool.read_only or tool.read_only_call):
            return False
        try:
            return tool.reads_only(parse_arguments(call.arguments))
        except BadArguments:
            return False

    async def _call(self, call: ToolCall) -> Message:
        self._set_state(f"calling: {call.name}")
        self.emit(Event("call", call.arguments, name=call.name))
        result = await self._dispatch(call)
        text = self._fit(valid_text(result.text()))  # a tool's output may be anything
        self.emit(Event("tool", text, name=call.name, data={"is_error": result.is_error}))
        return Message("tool", text, is_error=result.is_error)

    async def _dispatch(self, call: ToolCall) -> ToolResult:
        try:
            args = parse_arguments(call.arguments)
        except BadArguments as e:
            return ToolResult.of(f"arguments for {call.name} {e}; send one JSON object that matches the tool's "
                                 "schema", is_error=True)
        pre = await hooks.run(self, "preTool", {"tool": call.name, "arguments": call.arguments})
        if pre.blocked:
            return ToolResult.of(f"blocked by a preTool hook: {pre.reason}", is_error=True)
        result = await self.dispatcher.dispatch(call.name, args, self.call_context())
        post = await hooks.run(self, "postTool", {"tool": call.name, "arguments": call.arguments,
                                                  "result": result.text()[:RESULT_LIMIT], "is_error": result.is_error})
        if post.blocked:
            return ToolResult.of(f"result withheld by a postTool hook: {post.reason}", is_error=True)
        if post.output:
            result.content.append({"type": "text", "text": post.output})
        return result

    def _fit(self, text: str) -> str:
        """Cut a result to RESULT_LIMIT bytes; the whole of it is saved where the model can read it."""
        data = text.encode()
        if len(data) <= RESULT_LIMIT:
            return text
        results = self.tmpdir / "results"
        results.mkdir(exist_ok=True)
        # A fresh name: call ids come from the model, may repeat, and are no safe file names.
        fd, name = tempfile.mkstemp(prefix="result-", suffix=".txt", dir=results)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        path = Path(name)
        head = data[:RESULT_LIMIT].decode(errors="ignore")
        return (f"{head}\n[result truncated: first {RESULT_LIMIT} of {len(data)} bytes shown; the whole result "
                f"is in {path}; read on from offset={RESULT_LIMIT}, e.g. tail -c +{RESULT_LIMIT + 1} {path}]")

    # ---- switching and life cycle -----------------------------------------------------------------
    async def set_backend(self, name: str, model: str | None = None) -> None:
        from .. import backends

        self._refuse_while_running("switch the backend")
        new = backends.create(name, model or None)
        old, self.backend = self.backend, new
        self._ctx_len, self._ctx_asked = self._env.config.context_window or None, False
        await old.aclose()
        self._save_meta()

    async def set_model(self, model: str) -> None:
        await self.set_backend(self.backend.name, model)

    async def set_agent(self, name: str) -> None:
        """Switch agent: a fresh dispatcher (every server torn down and rebuilt), new env; cwd kept."""
        from .env import build_agent_env

        self._refuse_while_running("switch the agent")
        if self._new_dispatcher is None:
            raise ValueError("this session was built without a dispatcher factory; cannot switch agents")
        cfg = config.load_agent(name)
        await self.dispatcher.close()
        await self._close_hook_runner()
        self._env = await build_agent_env(cfg, self._new_dispatcher(), self._cwd)
        self._ctx_len, self._ctx_asked = cfg.context_window or None, False
        for info in self._env.infos:
            self.emit(Event("info", info))
        self._save_meta()
        await hooks.run(self, "agentSpawn", {"agent": name})

    async def _close_hook_runner(self) -> None:
        if self._hook_runner is not None:
            await self._hook_runner.close()
            self._hook_runner = None

    async def refresh_context_length(self) -> None:
        """Ask the backend for its window (unless the agent config sets one); done before the
        first turn after a start or a switch, so a Core built by hand gets it too."""
        self._ctx_asked = True
        if not self._env.config.context_window:
            try:
                self._ctx_len = await self.backend.context_length()
            except Exception as e:
                log.warning("context length unknown for %s: %s", self.backend.name, e)

    def clear(self) -> None:
        self._refuse_while_running("clear the history")
        self._store.replace_history([], archive=self.messages)
        self.messages = []
        self.window.reset()
        self._notify()

    async def compact(self) -> None:
        self._refuse_while_running("compact")
        await self.window.compact(reason="manual")

    async def close(self) -> None:
        """Stop the turn (queued prompts are dropped), close the tool servers and the backend,
        remove the tmpdir."""
        self._queue.clear()
        self._inject = None
        if self.running:
            self._turn.cancel()
            await asyncio.gather(self._turn, return_exceptions=True)
        await self.dispatcher.close()
        await self._close_hook_runner()
        await self.backend.aclose()
        self._save_meta()
        self._store.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _private_tmp() -> Path:
    """The parent of session tmpdirs, refused unless it is ours alone: in a shared /tmp another
    user could create it first and then read or swap what tools keep there."""
    return config.private_dir(config.tmp_path())


def _as_text(value: Any) -> str:
    """A piece of a call's name or arguments as text: None is none; another value, as JSON."""
    return value if isinstance(value, str) else "" if value is None else arguments_text(value)


def last_reply(messages: list[Message]) -> str:
    """The assistant text after the last user message: a restored session's reply."""
    start = 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            start = i
            break
    return "\n".join(m.content for m in messages[start:] if m.role == "assistant" and m.content)


def vars_of(usage: Usage) -> dict[str, Any]:
    return {k: getattr(usage, k) for k in usage.__dataclass_fields__}
