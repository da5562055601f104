"""The conversation, parsed from the session's `chat` as it grows (the chat format, docs/files.md).

The chat is text meant for people, so the parse goes by line prefixes (`chatfmt.MARKERS`): `user: `,
`assistant: `, `reasoning: `, `-> name(args)` (a tool call; the lines after it are its output),
`retrying in `, `error: `, `:: `. A line without a prefix continues the block before it, as
content: only ollie writes a marker at a line's start, and content that would read as one is
quoted (`>user: `), which the parse undoes. Text arrives in pieces that split lines:
complete lines are parsed for good, the last partial line is shown provisionally (`view`), and a
partial line that could still become a prefix (`assis`, `>us`) waits for more.

Blocks the terminal adds itself (a `!cmd`'s output, a note) are `local`: they are placed where the
chat stands when they are added, and are never part of the chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..chatfmt import MARKERS, may_become_marker, unquoted

# Kinds whose following unprefixed lines belong to them: a tool call's output, a multi-line prompt,
# assistant text or reasoning, an info block (a command's output: `/help`, `/models`).
CONTINUED = {"user", "assistant", "reasoning", "call", "info", "thought", "error"}


@dataclass(slots=True)
class Block:
    kind: str  # user, assistant, reasoning, call, retry, error, info, thought; local: note, shell
    lines: list[str] = field(default_factory=list)  # a call: its output lines
    head: str = ""  # a call: `name(args)`; a shell block: the command
    local: bool = False
    seq: int = 0  # a number unique in the conversation (for caches)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Conversation:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.partial = ""
        self._seq = 0
        self.version = 0  # bumped by every change, for the renderer

    def feed(self, text: str) -> None:
        """Add text read from the chat."""
        if not text:
            return
        data = self.partial + text
        *lines, self.partial = data.split("\n")
        for line in lines:
            self._add_line(self.blocks, line)
        self.version += 1

    def add_local(self, kind: str, text: str, head: str = "") -> Block:
        block = self._new(kind, text.split("\n") if text else [], head=head, local=True)
        self.blocks.append(block)
        self.version += 1
        return block

    def view(self) -> list[Block]:
        """The blocks with the partial line in place (the block it grows is copied)."""
        if not self.partial or may_become_marker(self.partial):
            return self.blocks
        blocks = list(self.blocks)
        i = _last_chat_block(blocks)
        if i is not None:
            blocks[i] = replace(blocks[i], lines=list(blocks[i].lines))
        self._add_line(blocks, self.partial)
        return blocks

    def _new(self, kind: str, lines: list[str], head: str = "", local: bool = False) -> Block:
        self._seq += 1
        return Block(kind, lines, head, local, self._seq)

    def _add_line(self, blocks: list[Block], line: str) -> None:
        for prefix, kind in MARKERS:
            if line.startswith(prefix):
                rest = line[len(prefix) :]
                if kind == "call":
                    blocks.append(self._new(kind, [], head=rest))
                else:
                    blocks.append(self._new(kind, [line if kind == "retry" else rest]))
                return
        line = unquoted(line)
        i = _last_chat_block(blocks)
        if i is not None and blocks[i].kind in CONTINUED:
            blocks[i].lines.append(line)
        elif line:
            blocks.append(self._new("info", [line]))


def _last_chat_block(blocks: list[Block]) -> int | None:
    """The index of the last block read from the chat (local ones are skipped)."""
    for i in range(len(blocks) - 1, -1, -1):
        if not blocks[i].local:
            return i
    return None


def trimmed(lines: list[str]) -> list[str]:
    """`lines` without the blank lines at their end (a turn's closing blank line)."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]
