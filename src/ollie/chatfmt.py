"""The chat log: the conversation as plain text, the way `tail -f chat` shows it.

    user: what is in this directory?
    assistant: Let me look.
    -> execute_code({"steps":[{"code":"ls"}]})
    README.md
    src
    assistant: There are two entries: README.md and src.

A segment of assistant text is prefixed once; tool calls are `-> name(args)`; results follow as
they are; `retrying in Ns...`, `error: X` and `:: info` lines; each turn ends with a blank line.
"""

from __future__ import annotations

from .types import Event


class ChatRenderer:
    """Turns events into chat text; feed it every event in order and append what it returns."""

    def __init__(self) -> None:
        self._in_text = False

    def render(self, ev: Event) -> str:
        if ev.kind == "assistant":
            if not ev.text:
                return ""
            out = ev.text if self._in_text else "assistant: " + ev.text
            self._in_text = True
            return out
        line = self._line(ev)
        if line is None:
            return ""
        out = "\n" if self._in_text else ""
        self._in_text = False
        return out + line

    @staticmethod
    def _line(ev: Event) -> str | None:
        match ev.kind:
            case "user":
                return f"user: {ev.text}\n"
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
