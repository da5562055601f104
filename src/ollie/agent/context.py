"""The context window's accounting: how many tokens the next request will take.

The backend's count of the last request is the base; what was added since is estimated at the
characters a token that count found (at most four: Chinese or Japanese text takes one or two), or
at four when the backend counts nothing. `compaction` acts on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..types import ContextSize, Message, ToolSpec, Usage

DEFAULT_WINDOW = 128_000
CHARS_PER_TOKEN = 4


def chars(m: Message) -> int:
    return len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) + 8


class Window:
    def __init__(self, messages: Callable[[], list[Message]], system_prompt: Callable[[], str]):
        self._messages = messages
        self._system_prompt = system_prompt
        self.length = DEFAULT_WINDOW  # the model's window, in tokens
        self._chars = sum(chars(m) for m in messages())
        self._tokens = 0  # input tokens of the last request, as the backend counted them
        self._chars_at_usage = 0
        self._chars_counted = 0  # what the backend's last count counted: system prompt, tools, history
        self._schema_chars = 0  # of the tools last offered to the model
        self._offered: list[ToolSpec] = []
        self.warned = False  # the user was told the window is filling up

    def added(self, messages: list[Message]) -> None:
        self._chars += sum(chars(m) for m in messages)

    def reset(self) -> None:
        """The history was replaced: count it afresh."""
        self._chars = sum(chars(m) for m in self._messages())
        self._tokens = 0
        self.warned = False

    def measured(self, usage: Usage) -> None:
        """The backend counted the request that the history so far made."""
        self._tokens = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        self._chars_at_usage = self._chars
        self._chars_counted = len(self._system_prompt()) + self._schema_chars + self._chars

    def offered(self, tools: list[ToolSpec]) -> None:
        """The tools the next requests carry: their schemas take room in the window too. (Counted
        when they change: encoding execute_code's schema cost ~35 us a turn; tools equal to the
        last ones are the same objects, most often, and compare at no cost.)"""
        if tools != self._offered:
            self._offered = list(tools)
            self._schema_chars = sum(len(t.name) + len(t.description) + len(json.dumps(t.input_schema)) for t in tools)

    def estimate(self) -> int:
        """Tokens the next request will take: the backend's last count plus what was added since,
        else characters / 4 of the system prompt, the tool schemas and the history."""
        if self._tokens:
            return self._tokens + int((self._chars - self._chars_at_usage) / self.chars_per_token())
        fixed = len(self._system_prompt()) + self._schema_chars
        return (fixed + self._chars) // CHARS_PER_TOKEN

    def chars_per_token(self) -> float:
        """Characters a token, as the backend's last count found them (from one to four), else four."""
        if not self._tokens:
            return CHARS_PER_TOKEN
        return min(CHARS_PER_TOKEN, max(1.0, self._chars_counted / self._tokens))

    def size(self) -> ContextSize:
        return ContextSize(self.estimate(), self.length)
