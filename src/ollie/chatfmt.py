r"""The chat log: the conversation as plain text, the way `tail -f chat` shows it.

    user: what is in this directory?
    assistant: Let me look.
    -> execute_code({"steps":[{"code":"ls"}]})
    README.md
    src
    assistant: There are two entries: README.md and src.

A segment of assistant text is prefixed once, and so is one of the model's reasoning (`reasoning: `,
in the session's chat only); tool calls are `-> name(args)`; results follow as they are;
`retrying in Ns...`, `error: X` and `:: info` lines; each turn ends with a blank line.

Only ollie starts a line with a marker (`MARKERS`): a line of content (a tool's output, the
model's text, a prompt's second line) that would read as one is quoted with a `>`, as mbox quotes
`From ` (`>user: ` shows a tool that printed `user: `, and `>>user: ` one that printed `>user: `),
so that what a model or a tool writes can never pass for a turn; `unquoted` gives the content back.
Control characters are shown as escapes (ESC as `\x1b`), so that printing the chat cannot drive
the terminal: `visible` does it, for every frontend that prints text from a model or a tool.
"""

from __future__ import annotations

import re

from .types import ContextSize, Cost, Event, Usage

# What a terminal acts on instead of showing: C0 controls but tab and newline (ESC starts CSI and
# OSC sequences; CR and BS write over what is shown), DEL, and C1 controls (U+009B is a CSI on its
# own). Lone surrogates too: they cannot be written as UTF-8 at all.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def visible(text: str) -> str:
    r"""`text` safe to print to a terminal, each control character shown as an escape (`\x1b`,
    `\x0d`, `\x9b`, `\ud800`). A CR before a newline only ends a line: it goes."""
    text = text.replace("\r\n", "\n")
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def _escape(m: re.Match[str]) -> str:
    code = ord(m[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


PROMPT_PREFIX = "user: "
# The prefixes that start a line of the chat, with the kind of line each starts, in the order a
# parser tries them (`:: thought: ` before `:: `). A `-> ` line is a tool call; its output follows.
MARKERS = (
    (PROMPT_PREFIX, "user"),
    ("assistant: ", "assistant"),
    ("reasoning: ", "reasoning"),
    ("-> ", "call"),
    ("retrying in ", "retry"),
    ("error: ", "error"),
    (":: thought: ", "thought"),
    (":: ", "info"),
)
QUOTE = ">"
_MARKER = "(?:" + "|".join(re.escape(prefix) for prefix, _ in MARKERS) + ")"
_AS_MARKER = re.compile(f"{QUOTE}*{_MARKER}")  # a line that reads as a marker, quoted or not
_TO_QUOTE = re.compile(f"(?m)^(?={_AS_MARKER.pattern})")
_QUOTED = re.compile(f"{QUOTE}+{_MARKER}")


def quoted(text: str) -> str:
    """`text` as lines of content: each line that would read as a marker, or as a quoted one,
    gets one more `>`."""
    return _TO_QUOTE.sub(QUOTE, text)


def unquoted(line: str) -> str:
    """A line of content as it was written (a quoted marker loses its `>`)."""
    return line[1:] if _QUOTED.match(line) else line


def may_become_marker(start: str) -> bool:
    """Whether the start of a line could still grow into a marker, quoted or not."""
    rest = start.lstrip(QUOTE)
    return any(prefix.startswith(rest) for prefix, _ in MARKERS)


def last_prompt_offset(chat: bytes) -> int:
    """Where the last prompt's line starts in a chat log (its end when there is none)."""
    pos = chat.rfind(b"\n" + PROMPT_PREFIX.encode())
    if pos >= 0:
        return pos + 1
    return 0 if chat.startswith(PROMPT_PREFIX.encode()) else len(chat)


class ChatRenderer:
    """Turns events into chat text; feed it every event in order and append what it returns.
    With `reasoning`, the model's reasoning is written too (the session's chat; `ollie run` leaves
    it out)."""

    def __init__(self, reasoning: bool = False) -> None:
        self.reasoning = reasoning
        self._segment = ""  # "assistant" or "reasoning" while a segment of either is being written
        self._held = ""  # newlines that ended the reasoning so far: written if more of it follows
        # The start of the segment's current line while it could still become a marker (held back
        # until it is decided whether to quote it); None in the middle of a line.
        self._start: str | None = None
        self.line_start = 0  # where, in the text `render` last returned, its line starts

    def render(self, ev: Event) -> str:
        if ev.kind == "assistant" or (ev.kind == "reasoning" and self.reasoning):
            return visible(self._text(ev.kind, ev.text))
        line = self._line(ev)
        if line is None:
            return ""
        out = (self._start or "") + "\n" if self._segment else ""
        self._segment, self._held, self._start = "", "", None
        self.line_start = len(out)
        return visible(out + line)

    def _text(self, kind: str, text: str) -> str:
        """A piece of a segment of text; its first is prefixed. A reasoning segment's leading and
        trailing newlines are dropped (models pad their reasoning), so that in the chat only the
        end of a turn leaves a blank line."""
        if kind == "reasoning":
            text = self._held + text if self._segment == kind else text.lstrip("\r\n")
            body = text.rstrip("\r\n")
            self._held, text = text[len(body) :], body
        if not text:
            return ""
        if self._segment == kind:
            return self._continue(text)
        out = (self._start or "") + "\n" if self._segment else ""
        self._segment, self._start = kind, None
        return out + f"{kind}: " + self._continue(text)

    def _continue(self, text: str) -> str:
        """More of a segment, its lines quoted where they would read as markers; the start of a
        line that could still become one waits for the text that decides."""
        out = []
        while text:
            if self._start is None:  # in a line: it passes, up to the next one's start
                end = text.find("\n") + 1
                if not end:
                    out.append(text)
                    break
                out.append(text[:end])
                text, self._start = text[end:], ""
                continue
            text, self._start = self._start + text, None
            if _AS_MARKER.match(text):
                out.append(QUOTE)
            elif may_become_marker(text):
                text, self._start = "", text
        return "".join(out)

    @staticmethod
    def _line(ev: Event) -> str | None:
        match ev.kind:
            case "user":
                return marked(PROMPT_PREFIX, ev.text)
            case "call":
                return marked("-> ", f"{ev.name}({ev.text})")
            case "tool":
                return quoted(ev.text if ev.text.endswith("\n") or not ev.text else ev.text + "\n")
            case "retry" | "limitretry" if ev.data and ev.data.get("first"):
                dropped = (
                    " (the answer above was cut off: it is dropped and asked for again)"
                    if ev.data.get("dropped")
                    else ""
                )
                return f"retrying in {ev.data['seconds']}s{dropped}...\n"
            case "error":
                return marked("error: ", ev.text)
            case "info" | "maxsteps":
                return marked(":: ", ev.text)
            case "done":
                return "\n"
        return None


def marked(marker: str, text: str) -> str:
    """A line of the chat: `marker`, then `text`, whose lines after the first are content."""
    first, newline, rest = text.partition("\n")
    return f"{marker}{first}{newline}{quoted(rest)}\n"


def usage_text(u: Usage) -> str:
    """`N in, N out, N requests[, N cached][ [estimated]]`: the `usage` file and `/usage`."""
    s = f"{u.input_tokens} in, {u.output_tokens} out, {u.requests} requests"
    if u.cache_read_tokens:
        s += f", {u.cache_read_tokens} cached"
    return s + (" [estimated]" if u.estimated else "")


def context_text(c: ContextSize) -> str:
    """`EST / WINDOW (P%)`: the `ctxsz` file and `/context`."""
    return f"{c.estimate} / {c.window} ({c.percent}%)"


def cost_text(c: Cost, model: str) -> str:
    """The `cost` file and `/cost`."""
    if c.price_known:
        return f"costLast=${c.last:.6f}\ncostSession=${c.session:.6f}"
    session = f"${c.session:.6f} + unknown" if c.session else "unknown"
    return f"costLast=unknown\ncostSession={session}\n(no price known for model {model!r}: counted as $0)"
