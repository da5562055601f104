"""The context window: how full it is, and what happens when it fills.

Before a turn, at `compactWarn` (60 %) the user is warned once; at `compactAt` (75 %) the history is
summarised. A context-overflow error compacts what came before the turn in progress (its prompt
and completed calls stay verbatim) and goes on with the turn, once. Where summarising is not
possible (the summary call fails, or the history is too large to summarise), the rolling window
evicts the oldest messages instead, never separating a tool call from its result, and says so in
a notice. Every replaced history is
appended to the session's compaction.jsonl: nothing is lost.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..types import Event, GenerationParams, Message, TextDelta, ToolSpec, Usage, UsageChunk
from . import hooks

if TYPE_CHECKING:
    from .core import Core

DEFAULT_WINDOW = 128_000
CHARS_PER_TOKEN = 4
RESULT_EXCERPT = 4000  # bytes of each tool result shown to the summariser
SUMMARY_PREFIX = ("[Another model started this task; its context was compacted. Its summary of the work so far "
                  "follows. Continue from there.]\n\n")
SUMMARY_INSTRUCTIONS = (
    "Summarise the conversation below for another model that will continue the work. Keep: the user's goals "
    "and constraints, decisions made, files and commands involved, results found, errors met and how they "
    "were handled, and what remains to be done. Be concise and concrete."
)


def _chars(m: Message) -> int:
    return len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) + 8


class Window:
    def __init__(self, core: Core):
        self.core = core
        self._chars = sum(_chars(m) for m in core.messages)
        self._tokens = 0  # input tokens of the last request, as the backend counted them
        self._chars_at_usage = 0
        self._schema_chars = 0  # of the tools last offered to the model
        self._warned = False

    # ---- accounting ----
    def added(self, messages: list[Message]) -> None:
        self._chars += sum(_chars(m) for m in messages)

    def reset(self) -> None:
        self._chars = sum(_chars(m) for m in self.core.messages)
        self._tokens = 0
        self._warned = False

    def measured(self, usage: Usage) -> None:
        """The backend counted the request that the history so far made."""
        self._tokens = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        self._chars_at_usage = self._chars

    def estimate(self) -> int:
        """Tokens the next request will take: the backend's last count plus what was added since,
        else characters / 4 of the system prompt, the tool schemas and the history."""
        if self._tokens:
            return self._tokens + (self._chars - self._chars_at_usage) // CHARS_PER_TOKEN
        fixed = len(self.core.system_prompt()) + self._schema_chars
        return (fixed + self._chars) // CHARS_PER_TOKEN

    def offered(self, tools: list[ToolSpec]) -> None:
        """The tools the next requests carry: their schemas take room in the window too."""
        self._schema_chars = sum(len(t.name) + len(t.description) + len(json.dumps(t.input_schema)) for t in tools)

    # ---- triggers ----
    async def before_turn(self, prompt: str) -> None:
        cfg = self.core.agent_config
        used = (self.estimate() + len(prompt) // CHARS_PER_TOKEN) / self.core.context_length
        if used >= cfg.compact_at:
            self.core.emit(Event("info", f"context {used:.0%} full: compacting"))
            await self.compact(reason="auto")
        elif used >= cfg.compact_warn and not self._warned:
            self._warned = True
            self.core.emit(Event("info", f"context {used:.0%} full; /compact to summarise it"))

    async def compact(self, reason: str, keep_last: int = 0) -> None:
        """Summarise the history but its last `keep_last` messages (the turn in progress: its
        prompt and the calls it completed stay as they are). A manual compaction that fails
        leaves the history as it was; automatic ones fall back to evicting old messages."""
        core = self.core
        cut = len(core.messages) - keep_last
        history, kept = core.messages[:cut], core.messages[cut:]
        if not history or (len(history) <= 4 and reason != "overflow"):
            if reason == "manual":
                core.emit(Event("info", "nothing to compact"))
            return
        pre = await hooks.run(core, "preCompact", {"reason": reason, "messages": len(history)})
        if pre.blocked:
            core.emit(Event("info", f"compaction cancelled by a preCompact hook: {pre.reason}"))
            return
        previous_state = core.state
        core._set_state("compacting")
        try:
            summary = await self._summarise(history)
        except Exception as e:
            if reason == "manual":
                core.emit(Event("error", f"compaction failed, history unchanged: {e}"))
                return
            core.emit(Event("info", f"summarising failed ({e}); evicting old messages instead"))
            self.evict(keep_last)
            return
        finally:
            core._set_state(previous_state)
        self._replace([Message("user", SUMMARY_PREFIX + summary), *kept])
        core.emit(Event("info", f"compacted {len(history)} messages into a summary"))
        await hooks.run(core, "postCompact", {"reason": reason, "summary": summary})

    async def _summarise(self, history: list[Message]) -> str:
        core = self.core
        text = flatten(history)
        if len(text) // CHARS_PER_TOKEN > core.context_length * 0.9:
            raise ValueError("the history is too large for the model to summarise")
        request = [Message("system", SUMMARY_INSTRUCTIONS), Message("user", text)]
        parts = []
        async for chunk in core.backend.stream(request, [], GenerationParams(max_tokens=core.params.max_tokens)):
            if isinstance(chunk, TextDelta):
                parts.append(chunk.text)
            elif isinstance(chunk, UsageChunk):  # the summary is paid for like any request
                core._add_usage(chunk.usage)
        summary = "".join(parts).strip()
        if not summary:
            raise ValueError("the model returned an empty summary")
        return summary

    def evict(self, keep_last: int = 0) -> None:
        """Drop the oldest units (a user message, or an assistant message with its tool results),
        never one of the last `keep_last` messages, until the history takes at most half the
        window; say what was dropped."""
        core = self.core
        msgs = core.messages
        protected = len(msgs) - keep_last
        budget = core.context_length * CHARS_PER_TOKEN // 2
        total = sum(_chars(m) for m in msgs)
        cut = 0
        while cut < protected and total > budget:
            end = cut + 1
            if msgs[cut].role == "assistant":
                while end < protected and msgs[end].role == "tool":
                    end += 1
            if end > protected:
                break
            total -= sum(_chars(m) for m in msgs[cut:end])
            cut = end
        while cut < len(msgs) and msgs[cut].role == "tool":  # never start on an orphaned result
            cut += 1
        if cut == 0:
            return
        notice = Message("user", f"[{cut} earlier messages were evicted from the context to make room; "
                                 "they are kept in the session's compaction.jsonl.]")
        self._replace([notice, *msgs[cut:]])
        core.emit(Event("info", f"evicted {cut} old messages from the context"))

    def _replace(self, new: list[Message]) -> None:
        core = self.core
        core._store.replace_history(new, archive=core.messages)
        core.messages = new
        self.reset()


def flatten(history: list[Message]) -> str:
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
