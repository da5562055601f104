"""The agent loop: one turn, from the prompt to the answer.

Send the history to the backend, stream the answer, run the tool calls it asks for (in the
model's order), append the results, repeat until the model answers without tools. Everything a
frontend sees arrives as events on `rt.bus`; everything completed is on disk before the next
request. `Core` runs turns one after another; this module is the turn itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import cost, telemetry
from ..backends.hold import stream_hold
from ..textcalls import BadArguments, arguments_text, parse_arguments, recover_tool_calls, stable_call_id
from ..tools import Tool, ToolResult
from ..types import (
    BackendError,
    ConfigError,
    ContextOverflowError,
    Done,
    Event,
    Message,
    RateLimitError,
    ReasoningDelta,
    StoppedError,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    TransientError,
    TurnError,
    Usage,
    UsageChunk,
    valid_text,
)
from . import compaction
from .context import CHARS_PER_TOKEN
from .runtime import Runtime

MAX_ATTEMPTS = 4  # requests per step, retries included
RETRY_CAP = 60.0  # seconds: no provider's Retry-After makes us wait longer than this
RESULT_LIMIT = 8192  # bytes of a tool result the model sees; the rest is saved to the tmpdir
NUDGE_AFTER, FAIL_AFTER = 5, 10  # consecutive all-error tool rounds
PLAN_EVERY = 10  # rounds between re-showing the plan
ANSWERED = ("stop", "tool_calls", "length")  # stop reasons of an answer; any other ends the turn


async def run_turn(rt: Runtime, prompt: str) -> str | None:
    """Run one turn; return a follow-up prompt (from a postTurn hook) or None."""
    # An answer no one follows gathers longer in its stream: fewer wakeups (events.stream_hold).
    with telemetry.turn(rt, prompt), stream_hold(rt.bus.stream_hold):
        return await _turn(rt, prompt)


async def _turn(rt: Runtime, prompt: str) -> str | None:
    prompt = valid_text(prompt)  # an argv or a file may hold bytes that are no UTF-8
    state = rt.state
    state.reply = ""
    check_spending_cap(rt)
    pre = await rt.hooks.run("preTurn", {"prompt": prompt})
    if pre.blocked:
        raise TurnError(f"preTurn hook blocked the turn: {pre.reason}")
    await compaction.before_turn(rt, prompt)
    content = "\n\n".join([prompt, *state.notes, *([pre.output] if pre.output else [])])
    state.keep_first_prompt(prompt)
    rt.bus.emit(Event("user", prompt))
    start = len(state.messages)
    if rt.checkpoints is not None:
        rt.checkpoints.turn_started(prompt, start, state.cwd)
    rt.commit([Message("user", content)])
    state.notes_delivered()
    try:
        await _steps(rt)
    except ContextOverflowError:
        rt.bus.emit(Event("info", "context overflow: compacting and retrying the turn"))
        turn = len(state.messages) - start  # the prompt and the turn's work so far stay as they are
        await compaction.compact(rt, reason="overflow", keep_last=turn)
        start = len(state.messages) - turn
        await _steps(rt)
    state.reply = "\n".join(m.content for m in state.messages[start:] if m.role == "assistant" and m.content)
    post = await rt.hooks.run("postTurn", {"prompt": prompt, "reply": state.reply})
    if post.output:
        state.add_note(post.output)
    return post.reason if post.blocked else None


async def turn_failed(rt: Runtime, e: Exception) -> str | None:
    """Report why the turn failed; a turnError hook may answer with the next prompt."""
    kind = getattr(e, "kind", "unknown")
    rt.bus.emit(Event("error", str(e) or type(e).__name__, data={"error_type": kind}))
    outcome = await rt.hooks.run("turnError", {"error": str(e), "error_type": kind})
    if outcome.output:
        rt.state.add_note(outcome.output)
    return outcome.next_prompt


def check_spending_cap(rt: Runtime) -> None:
    """Before every request: a session that spent OLLIE_MAX_SESSION_COST makes no more.
    (The answer that crossed the cap is kept: it is paid for.)"""
    cost.warm(rt.backend.name)  # the price list, loaded while the first request is on its way
    cap = os.environ.get("OLLIE_MAX_SESSION_COST")
    if not cap:
        return
    try:
        limit = float(cap)
    except ValueError:
        raise ConfigError(
            f"OLLIE_MAX_SESSION_COST={cap!r} is not an amount of US dollars; "
            "set it like OLLIE_MAX_SESSION_COST=5, or unset it"
        ) from None
    backend, model = rt.backend.name, rt.backend.model
    if not os.environ.get(cost.ALLOW_UNPRICED) and not cost.price_known(model, backend):
        raise TurnError(cost.unpriced_message(model, backend, cap))
    spent = rt.state.meta.cost_session
    if spent > limit:
        raise TurnError(f"session cost ${spent:.4f} exceeds OLLIE_MAX_SESSION_COST=${cap}; raise the cap to go on")


# ---- steps: a request, then the calls it asks for ---------------------------------------------------


async def _steps(rt: Runtime) -> None:
    tools = await _tool_specs(rt)
    failing = steps = 0
    max_steps = rt.env.config.max_steps
    while True:
        if max_steps and steps >= max_steps:
            await _last_answer(rt, max_steps)
            return
        steps += 1
        assistant = await _answer(rt, tools)
        if not assistant.tool_calls:
            rt.commit([assistant])
            return
        if rt.checkpoints is not None:
            await rt.checkpoints.before_change()  # the cwd as it was before the turn, taken by now
        results = await _run_calls(rt, assistant)
        failing = failing + 1 if all(r.is_error for r in results) else 0
        if failing >= FAIL_AFTER:
            rt.commit([assistant, *results])
            raise TurnError(f"{FAIL_AFTER} consecutive tool rounds failed; stopping the turn")
        _add_notes(rt, results[-1], failing, steps)
        rt.commit([assistant, *results])
        await rt.after_tools()


async def _last_answer(rt: Runtime, max_steps: int) -> None:
    """The step budget is spent: one more answer, without tools, that sums the work up."""
    rt.bus.emit(Event("maxsteps", f"step budget of {max_steps} exhausted"))
    note = (
        f"[The step budget of {max_steps} steps is exhausted. Do not call tools. Summarize "
        "what you did, what you found and what remains to be done.]"
    )
    rt.commit([Message("user", note)])
    final = await _answer(rt, [])
    final.tool_calls = []  # no tools were offered: a call now could never get its result
    rt.commit([final])


async def _answer(rt: Runtime, tools: list[ToolSpec]) -> Message:
    """The model's answer; one that ended for a reason that is no answer (a content filter, a
    refusal, a reason we do not know) is kept without its calls, and ends the turn."""
    assistant, done = await _request(rt, tools)
    if done.stop_reason in ANSWERED:
        return assistant
    assistant.tool_calls = []
    if assistant.content:
        rt.commit([assistant])
    raise StoppedError(done.stop_reason, done.reason, rt.backend.name)


def _add_notes(rt: Runtime, result: Message, failing: int, steps: int) -> None:
    """What the model must hear besides the results: a nudge after failing rounds, the plan
    now and then, a message the user injected."""
    notes = []
    if failing == NUDGE_AFTER:
        notes.append(
            f"[{NUDGE_AFTER} tool rounds in a row failed. Step back: read the errors, "
            "check your assumptions, and try a different approach.]"
        )
    if rt.state.plan and steps % PLAN_EVERY == 0:
        notes.append(f"[Your plan, as it stands:]\n{rt.state.plan}")
    if rt.inject is not None:
        notes.append(f"<system-user-interruption>{rt.inject}</system-user-interruption>")
        rt.inject = None
    if notes:
        result.content += "\n\n" + "\n\n".join(notes)


async def _tool_specs(rt: Runtime) -> list[ToolSpec]:
    if not rt.env.config.tools:
        return []
    specs = [tool.spec(name) for name, tool in (await rt.env.dispatcher.list_tools()).items()]
    rt.window.offered(specs)
    return specs


# ---- one request, streamed, with retries ------------------------------------------------------------


async def _request(rt: Runtime, tools: list[ToolSpec]) -> tuple[Message, Done]:
    """One model answer, retrying rate limits, 5xx and dropped streams with capped waits."""
    check_spending_cap(rt)
    for attempt in range(MAX_ATTEMPTS):
        said: list[str] = []  # the answer's text as it streamed: a retry after some drops it
        try:
            with telemetry.chat(rt, attempt) as request:
                assistant, done = await _stream_once(rt, tools, said)
                request.answered(assistant, done)
            return assistant, done
        except (RateLimitError, TransientError) as e:
            if attempt == MAX_ATTEMPTS - 1:
                raise
            if isinstance(e, RateLimitError):
                wait, kind = e.retry_after if e.retry_after is not None else 5.0 * 2**attempt, "limitretry"
            else:
                wait, kind = 2.0 * 2**attempt, "retry"
            await _countdown(rt, min(wait, RETRY_CAP), kind, str(e), dropped=bool(said))
    raise AssertionError("unreachable")


async def _countdown(rt: Runtime, seconds: float, kind: str, why: str, dropped: bool = False) -> None:
    """Retry events a second until the wait is over; `dropped`: the answer had begun to stream,
    and what it said is not kept (its readers are told, with the first)."""
    rt.bus.set_state("limitretry" if kind == "limitretry" else "thinking")
    left, first = seconds, True
    while True:  # an event a second, the first and the last (0 s left) included
        data = {"seconds": round(left, 1), "first": first, **({"dropped": True} if first and dropped else {})}
        rt.bus.emit(Event(kind, why, data=data))  # type: ignore[arg-type]
        if left <= 0:
            return
        first = False
        step = min(1.0, left)
        await asyncio.sleep(step)
        left -= step


async def _stream_once(rt: Runtime, tools: list[ToolSpec], text: list[str]) -> tuple[Message, Done]:
    """One request's answer; its text pieces gather in `text` as they stream."""
    rt.bus.set_state("thinking")
    messages = [Message("system", rt.system_prompt()), *rt.state.messages]
    parts: dict[int, list[ToolCallDelta]] = {}
    done: Done | None = None
    counted = False
    async for chunk in rt.backend.stream(messages, tools, rt.state.params):
        if isinstance(chunk, TextDelta):
            text.append(_text_of(rt, chunk))
            rt.bus.stream("assistant", text[-1])
        elif isinstance(chunk, ToolCallDelta):
            if not isinstance(chunk.index, int):  # no telling which call the piece belongs to
                raise BackendError(
                    f"malformed answer: a tool call piece has the index {chunk.index!r}, not a number",
                    provider=rt.backend.name,
                )
            parts.setdefault(chunk.index, []).append(chunk)
        elif isinstance(chunk, UsageChunk):
            counted = counted or bool(chunk.usage.input_tokens or chunk.usage.output_tokens)
            rt.count_usage(chunk.usage)
            rt.window.measured(chunk.usage)
        elif isinstance(chunk, ReasoningDelta):
            rt.bus.stream("reasoning", _text_of(rt, chunk))
        elif isinstance(chunk, Done):
            done = chunk
    if done is None:
        raise TransientError("the stream ended before the answer was complete", provider=rt.backend.name)
    calls = _assemble_calls(rt.state.messages, parts)
    content = valid_text("".join(text))  # before recovering calls from it: their arguments come from it
    if not counted:  # the backend gave no token counts: estimate them, and say so
        out = len(content) + sum(len(c.arguments) for c in calls)
        rt.count_usage(
            Usage(input_tokens=rt.window.estimate(), output_tokens=out // CHARS_PER_TOKEN, requests=0, estimated=True)
        )
    if not calls and tools and content:
        content, calls = recover_tool_calls(content, {t.name for t in tools}, len(rt.state.messages))
    if done.stop_reason == "length" and not calls:
        rt.bus.emit(Event("info", "the answer was cut off at the token limit"))
    return Message("assistant", content, tool_calls=calls, provider_data=done.provider_data), done


def _text_of(rt: Runtime, chunk: TextDelta | ReasoningDelta) -> str:
    if not isinstance(chunk.text, str):
        what = "text" if isinstance(chunk, TextDelta) else "reasoning"
        raise BackendError(
            f"malformed answer: a piece of its {what} is {type(chunk.text).__name__}, not a string",
            provider=rt.backend.name,
        )
    return chunk.text


def _assemble_calls(history: list[Message], parts: dict[int, list[ToolCallDelta]]) -> list[ToolCall]:
    """The answer's calls from their pieces, fit for the history whatever the backend sent: a
    name or arguments that are no text become text (then an unknown name or bad arguments give
    the call its error result), and an id that is missing, no text or already used is replaced
    by a stable one (providers refuse a history in which two calls share an id)."""
    taken = {c.id for m in history for c in m.tool_calls}
    calls = []
    for i, (_, pieces) in enumerate(sorted(parts.items())):
        name = valid_text("".join(_as_text(p.name) for p in pieces))
        args = valid_text("".join(_as_text(p.arguments) for p in pieces))
        call_id = next((p.id for p in pieces if p.id), "")
        if not isinstance(call_id, str) or not call_id or call_id in taken:
            call_id = stable_call_id(len(history), i, name, args)
        taken.add(call_id)
        calls.append(ToolCall(valid_text(call_id), name, args))
    return calls


def _as_text(value: Any) -> str:
    """A piece of a call's name or arguments as text: None is none; another value, as JSON."""
    return value if isinstance(value, str) else "" if value is None else arguments_text(value)


# ---- tool calls -----------------------------------------------------------------------------------


async def _run_calls(rt: Runtime, assistant: Message) -> list[Message]:
    """Run the calls in the model's order; consecutive read-only calls run concurrently and
    identical ones once. On interrupt, calls that did not finish are stripped from history."""
    calls = assistant.tool_calls
    results: list[Message] = []
    running: dict[tuple[str, str], asyncio.Future[Message]] = {}
    try:
        for batch in _batches(calls, await rt.env.dispatcher.list_tools()):
            running = {}
            if len(batch) == 1:  # awaited as it is: a task and a gather of its own cost a lone call ~15 us
                outcomes = [await _call(rt, batch[0])]
            else:
                for call in batch:
                    if (call.name, call.arguments) not in running:
                        running[call.name, call.arguments] = asyncio.ensure_future(_call(rt, call))
                await asyncio.gather(*running.values())
                outcomes = [running[call.name, call.arguments].result() for call in batch]
            for call, r in zip(batch, outcomes, strict=True):
                results.append(Message("tool", r.content, tool_call_id=call.id, name=call.name, is_error=r.is_error))
    except BaseException:  # an interrupt, or a failure no call result could carry
        for future in running.values():
            future.cancel()
        if results or assistant.content:
            assistant.tool_calls = calls[: len(results)]
            rt.commit([assistant, *results])
        raise
    return results


def _batches(calls: list[ToolCall], tools: dict[str, Tool]) -> Iterator[list[ToolCall]]:
    """The calls in order: each run of read-only calls as one batch, every other call alone."""
    reads: list[ToolCall] = []
    for call in calls:
        if _read_only(call, tools):
            reads.append(call)
            continue
        if reads:
            yield reads
            reads = []
        yield [call]
    if reads:
        yield reads


def _read_only(call: ToolCall, tools: dict[str, Tool]) -> bool:
    tool = tools.get(call.name)
    if tool is None or not (tool.read_only or tool.read_only_call):
        return False
    try:
        return tool.reads_only(parse_arguments(call.arguments))
    except BadArguments:
        return False


async def _call(rt: Runtime, call: ToolCall) -> Message:
    rt.bus.set_state(f"calling: {call.name}")
    rt.bus.emit(Event("call", call.arguments, name=call.name))
    with telemetry.tool(rt, call) as span:
        result = await _dispatch(rt, call)
        span.result(result)
    text = _fit(rt.tmpdir, valid_text(result.text()))  # a tool's output may be anything
    rt.bus.emit(Event("tool", text, name=call.name, data={"is_error": result.is_error}))
    return Message("tool", text, is_error=result.is_error)


async def _dispatch(rt: Runtime, call: ToolCall) -> ToolResult:
    """The call's result, between its preTool and postTool hooks (whose output joins it)."""
    try:
        args = parse_arguments(call.arguments)
    except BadArguments as e:
        return ToolResult.of(
            f"arguments for {call.name} {e}; send one JSON object that matches the tool's schema", is_error=True
        )
    pre = await rt.hooks.run("preTool", {"tool": call.name, "arguments": call.arguments})
    if pre.blocked:
        return ToolResult.of(f"blocked by a preTool hook: {pre.reason}", is_error=True)
    result = await rt.env.dispatcher.dispatch(call.name, args, rt.call_context())
    post = await rt.hooks.run(
        "postTool",
        {
            "tool": call.name,
            "arguments": call.arguments,
            "result": result.text()[:RESULT_LIMIT],
            "is_error": result.is_error,
        },
    )
    if post.blocked:
        return ToolResult.of(f"result withheld by a postTool hook: {post.reason}", is_error=True)
    if pre.output:
        result.content.insert(0, {"type": "text", "text": pre.output})
    if post.output:
        result.content.append({"type": "text", "text": post.output})
    return result


def _fit(tmpdir: Path, text: str) -> str:
    """Cut a result to RESULT_LIMIT bytes; the whole of it is saved where the model can read it."""
    data = text.encode()
    if len(data) <= RESULT_LIMIT:
        return text
    head = data[:RESULT_LIMIT].decode(errors="ignore")
    try:
        name = _save_result(tmpdir / RESULTS, data)
    except OSError as e:  # a full disk, or something planted in the way: the cut result alone
        shown = f"first {RESULT_LIMIT} of {len(data)} bytes shown"
        return f"{head}\n[result truncated: {shown}; the rest was not kept: {e.strerror or e}]"
    return (
        f"{head}\n[result truncated: first {RESULT_LIMIT} of {len(data)} bytes shown; the whole result "
        f"is in {name}; read on from offset={RESULT_LIMIT}, e.g. tail -c +{RESULT_LIMIT + 1} {name}]"
    )


def _save_result(results: Path, data: bytes) -> str:
    """Write `data` to a new file of `results`, by descriptor, no link followed (under Landlock
    alone the scratch directory is the code's to write); its path. A fresh name: call ids come
    from the model, may repeat, and are no safe file names."""
    directory = _open_dir(results, make=True)
    try:
        file = f"result-{secrets.token_hex(6)}.txt"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(file, flags, 0o600, dir_fd=directory), "wb") as f:
            f.write(data)
    finally:
        os.close(directory)
    return str(results / file)


RESULTS = "results"  # the whole results `_fit` cut, in the session's scratch directory
# Bytes of them a session keeps over its close (what code could have made them): their copy back at
# its restore is on the event loop, where 64 MiB is some 50 ms
RESULTS_KEPT = 64 << 20


def copy_results(source: Path, target: Path) -> None:
    """The whole results of `source` (a directory holding a RESULTS one) copied into `target`'s:
    at a session's close from its scratch directory into its store, which its history names them
    in (in a thread), and back at its restore. Only ollie's own files go (regular, one link,
    `result-*.txt`, up to RESULTS_KEPT bytes in all), each way by descriptor: the scratch directory
    is the code's to write, and no link planted there (one left by a crash included) is followed."""
    try:
        src = _open_dir(source / RESULTS)
    except OSError:  # none (most sessions), or no directory of ollie's
        return
    try:
        names = [n for n in os.listdir(src) if n.startswith("result-") and n.endswith(".txt")]
        if not names:
            return
        dst = _open_dir(target / RESULTS, make=True)
        try:
            left = RESULTS_KEPT
            for name in names:
                left -= _copy_result(src, name, dst, left)
        finally:
            os.close(dst)
    except OSError:  # a full disk, a directory made a link meanwhile: those results are not kept
        return
    finally:
        os.close(src)


def _open_dir(path: Path, make: bool = False) -> int:
    """A descriptor of the directory `path` (made first, private, with `make`), never through a link."""
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _copy_result(source: int, name: str, target: int, room: int) -> int:
    """Copy one result file between directories (descriptors); the bytes it took, 0 if none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source)
    except OSError:
        return 0
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > room:
            return 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # only a file of its own making
        try:
            made = os.open(name, flags, 0o600, dir_fd=target)
        except OSError:
            return 0
        with os.fdopen(made, "wb") as out:
            shutil.copyfileobj(f, out)
        return st.st_size
