"""What happens when the context window fills.

Before a turn, at `compactWarn` (60 %) the user is warned once; at `compactAt` (75 %) the history is
summarised. A context-overflow error compacts what came before the turn in progress (its prompt
and completed calls stay verbatim) and goes on with the turn, once. Where summarising is not
possible (the summary call fails, or the history is too large to summarise), the oldest messages
are evicted instead, never separating a tool call from its result, and a notice says so. Every
replaced history is appended to the session's compaction.jsonl: nothing is lost.
"""

from __future__ import annotations

from .. import telemetry
from ..types import Event, GenerationParams, Message, TextDelta, UsageChunk
from .context import chars
from .runtime import Runtime

RESULT_EXCERPT = 4000  # bytes of each tool result shown to the summariser
SUMMARY_PREFIX = (
    "[Another model started this task; its context was compacted. Its summary of the work so far "
    "follows. Continue from there.]\n\n"
)
SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation below for another model that will continue the work. Keep: the user's goals "
    "and constraints, decisions made, files and commands involved, results found, errors met and how they "
    "were handled, and what remains to be done. Be concise and concrete."
)


async def before_turn(rt: Runtime, prompt: str) -> None:
    """Warn, or compact, as the window fills."""
    cfg, window = rt.env.config, rt.window
    used = (window.estimate() + len(prompt) / window.chars_per_token()) / window.length
    if used >= cfg.compact_at:
        await compact(rt, reason="auto", why=f"context {used:.0%} full: compacting")
    elif used >= cfg.compact_warn and not window.warned:
        window.warned = True
        rt.bus.emit(Event("info", f"context {used:.0%} full; /compact to summarise it"))


async def compact(rt: Runtime, reason: str, keep_last: int = 0, why: str = "") -> None:
    """Summarise the history but its last `keep_last` messages (the turn in progress: its prompt
    and the calls it completed stay as they are). A manual compaction that fails leaves the
    history as it was; automatic ones fall back to evicting old messages. `why` is said first,
    when there is something to compact."""
    with telemetry.compaction(reason):
        await _compact(rt, reason, keep_last, why)


async def _compact(rt: Runtime, reason: str, keep_last: int, why: str) -> None:
    messages = rt.state.messages
    cut = len(messages) - keep_last
    history, kept = messages[:cut], messages[cut:]
    if not history or (len(history) <= 4 and reason != "overflow"):
        if reason == "manual":
            rt.bus.emit(Event("info", "nothing to compact"))
        return
    if why:
        rt.bus.emit(Event("info", why))
    pre = await rt.hooks.run("preCompact", {"reason": reason, "messages": len(history)})
    if pre.blocked:
        rt.bus.emit(Event("info", f"compaction cancelled by a preCompact hook: {pre.reason}"))
        return
    previous_state = rt.bus.state
    rt.bus.set_state("compacting")
    try:
        summary = await _summarise(rt, history)
    except Exception as e:
        if reason == "manual":
            rt.bus.emit(Event("error", f"compaction failed, history unchanged: {e}"))
            return
        rt.bus.emit(Event("info", f"summarising failed ({e}); evicting old messages instead"))
        evict(rt, keep_last, pre.output)
        return
    finally:
        rt.bus.set_state(previous_state)
    post = await rt.hooks.run("postCompact", {"reason": reason, "summary": summary})
    notes = "".join(f"\n\n{out}" for out in (pre.output, post.output) if out)
    rt.replace_history([Message("user", SUMMARY_PREFIX + summary + notes), *kept])
    rt.bus.emit(Event("info", f"compacted {len(history)} messages into a summary"))


async def _summarise(rt: Runtime, history: list[Message]) -> str:
    text = flatten(history)
    if len(text) / rt.window.chars_per_token() > rt.window.length * 0.9:
        raise ValueError("the history is too large for the model to summarise")
    request = [Message("system", SUMMARY_INSTRUCTIONS), Message("user", text)]
    parts = []
    params = GenerationParams(max_tokens=rt.state.params.max_tokens)
    async for chunk in rt.backend.stream(request, [], params):
        if isinstance(chunk, TextDelta):
            parts.append(chunk.text)
        elif isinstance(chunk, UsageChunk):  # the summary is paid for like any request
            rt.count_usage(chunk.usage)
    summary = "".join(parts).strip()
    if not summary:
        raise ValueError("the model returned an empty summary")
    return summary


def evict(rt: Runtime, keep_last: int = 0, note: str = "") -> None:
    """Drop the oldest units (a user message, or an assistant message with its tool results),
    never one of the last `keep_last` messages, until the history takes at most half the
    window; say what was dropped (and add `note`, a preCompact hook's output, to that notice)."""
    msgs = rt.state.messages
    protected = len(msgs) - keep_last
    budget = rt.window.length * rt.window.chars_per_token() / 2  # characters, as the backend counts them
    total = sum(chars(m) for m in msgs)
    cut = 0
    while cut < protected and total > budget:
        end = cut + 1
        if msgs[cut].role == "assistant":
            while end < protected and msgs[end].role == "tool":
                end += 1
        if end > protected:
            break
        total -= sum(chars(m) for m in msgs[cut:end])
        cut = end
    while cut < len(msgs) and msgs[cut].role == "tool":  # never start on an orphaned result
        cut += 1
    if cut == 0:
        if total > budget:  # the turn in progress alone fills it: said, not done in silence
            rt.bus.emit(Event("info", "nothing could be evicted: the turn in progress alone fills the context"))
        return
    notice = Message(
        "user",
        f"[{cut} earlier messages were evicted from the context to make room; "
        "they are kept in the session's compaction.jsonl.]" + (f"\n\n{note}" if note else ""),
    )
    rt.replace_history([notice, *msgs[cut:]])
    rt.bus.emit(Event("info", f"evicted {cut} old messages from the context"))


def flatten(history: list[Message]) -> str:
    """The history as text for the summariser: calls as `[Tool call: name(args)]`, results cut."""
    lines = []
    for m in history:
        if m.role == "tool":
            body = m.content.encode()[:RESULT_EXCERPT].decode(errors="ignore")
            lines.append(f"[Tool result{' (error)' if m.is_error else ''}]: {body}")
            continue
        if m.content:
            lines.append(f"{m.role}: {m.content}")
        lines.extend(f"[Tool call: {c.name}({c.arguments})]" for c in m.tool_calls)
    return "\n\n".join(lines)
