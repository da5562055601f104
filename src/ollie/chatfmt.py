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
        self.line_start = 0  # where, in the text `render` last returned, its line starts

    def render(self, ev: Event) -> str:
        if ev.kind == "assistant" or (ev.kind == "reasoning" and self.reasoning):
            return visible(self._text(ev.kind, ev.text))
        line = self._line(ev)
        if line is None:
            return ""
        out = "\n" if self._segment else ""
        self._segment, self._held = "", ""
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
            return text
        out = ("\n" if self._segment else "") + f"{kind}: " + text
        self._segment = kind
        return out

    @staticmethod
    def _line(ev: Event) -> str | None:
        match ev.kind:
            case "user":
                return f"{PROMPT_PREFIX}{ev.text}\n"
            case "call":
                return f"-> {ev.name}({ev.text})\n"
            case "tool":
                text = ev.text if ev.text.endswith("\n") or not ev.text else ev.text + "\n"
                return text
            case "retry" | "limitretry" if ev.data and ev.data.get("first"):
                return f"retrying in {ev.data['seconds']}s...\n"
            case "error":
                return f"error: {ev.text}\n"
            case "info" | "maxsteps":
                return f":: {ev.text}\n"
            case "done":
                return "\n"
        return None


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
    text = f"costLast=${c.last:.6f}\ncostSession=${c.session:.6f}"
    return text if c.price_known else text + f"\n(no price known for model {model!r}: counted as $0)"
