"""The conversation as styled text for the screen: prompt_toolkit fragments, `(style, text)` pairs.

A block renders the same way every time for the same width and folding, so finished blocks are
rendered once and kept (`Renderer` caches by block, length and folding). What it draws:

    > the prompt                                    (bold)
    reasoning: the model's reasoning                (dimmed, folded after a few lines)
    assistant text, **bold**, `code`, # headings    (fenced code highlighted when Pygments is there,
    ── python ──                                     its fences drawn as rules)
    -> execute_code: ls | wc -l                     (a call on one line; its output folded below it)
         3
    retrying in 2s...   error: ...   :: info        (yellow, red, dimmed)
"""

from __future__ import annotations

import json
import re

from .model import Block, trimmed

Fragments = list[tuple[str, str]]

FOLD_LINES = 4  # output lines shown of a folded tool call or shell command
HEAD_MAX = 200  # characters of a call's arguments shown on its line
REASONING_CHARS = 320  # characters of folded reasoning shown (at most FOLD_LINES lines of it)

STYLE = {
    "user": "bold",
    "user.mark": "bold ansicyan",
    "call": "ansicyan",
    "call.name": "bold ansicyan",
    "output": "ansigray",
    "fold": "italic ansigray",
    "diff.add": "ansigreen",
    "diff.del": "ansired",
    "diff.hunk": "ansicyan",
    "retry": "ansiyellow",
    "error": "bold ansired",
    "info": "ansigray",
    "thought": "italic ansigray",
    "reasoning": "italic ansigray",
    "note": "italic ansimagenta",
    "shell": "bold ansimagenta",
    "md.code": "ansiyellow",
    "md.bold": "bold",
    "md.heading": "bold underline",
    "md.fence": "ansigray",
    "status": "reverse",
    "status.busy": "reverse bold",
    "status.error": "reverse bold ansired",
    "spinner": "reverse bold",
}


def call_head(head: str) -> tuple[str, str]:
    """(name, a short summary of the arguments) of a call line `name(args)`."""
    name, _, args = head.partition("(")
    args = args[:-1] if args.endswith(")") else args
    try:
        value = json.loads(args)
    except ValueError:
        return name, _one_line(args)
    if isinstance(value, dict):
        steps = value.get("steps")
        if isinstance(steps, list) and steps and all(isinstance(s, dict) for s in steps):
            codes = [str(s.get("code", "")) for s in steps]
            return name, " | ".join(_one_line(c) for c in codes)
        if len(value) == 1:
            return name, _one_line(str(next(iter(value.values()))))
    return name, _one_line(args)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    out = lines[0] if lines else ""
    if len(lines) > 1:
        out += f" (+{len(lines) - 1} lines)"
    return out if len(out) <= HEAD_MAX else out[: HEAD_MAX - 3] + "..."


def _is_diff(lines: list[str]) -> bool:
    return any(ln.startswith("@@") for ln in lines) or (
        any(ln.startswith("--- ") for ln in lines) and any(ln.startswith("+++ ") for ln in lines)
    )


def _output_line(line: str, diff: bool) -> tuple[str, str]:
    style = "class:output"
    if diff:
        if line.startswith("+") and not line.startswith("+++"):
            style = "class:diff.add"
        elif line.startswith("-") and not line.startswith("---"):
            style = "class:diff.del"
        elif line.startswith("@@"):
            style = "class:diff.hunk"
    return style, "    " + line + "\n"


def output(lines: list[str], expanded: bool, fold_key: str = "Ctrl-O") -> Fragments:
    lines = trimmed(lines)
    diff = _is_diff(lines)
    shown = lines if expanded or len(lines) <= FOLD_LINES + 1 else lines[:FOLD_LINES]
    out = [_output_line(ln, diff) for ln in shown]
    if len(shown) < len(lines):
        out.append(("class:fold", f"    ... {len(lines) - len(shown)} more lines ({fold_key} to unfold)\n"))
    return out


_INLINE = re.compile(r"(\*\*[^*\n]+\*\*|`[^`\n]+`)")


def _inline(line: str) -> Fragments:
    out: Fragments = []
    for part in _INLINE.split(line):
        if not part:
            continue
        if part.startswith("**") and part.endswith("**") and len(part) > 4:
            out.append(("class:md.bold", part[2:-2]))
        elif part.startswith("`") and part.endswith("`") and len(part) > 2:
            out.append(("class:md.code", part[1:-1]))
        else:
            out.append(("", part))
    return out


def _highlight(code: list[str], lang: str) -> Fragments:
    text = "\n".join(code) + "\n"
    try:
        from prompt_toolkit.formatted_text import PygmentsTokens, to_formatted_text
        from pygments import lex  # type: ignore[import-untyped]
        from pygments.lexers import get_lexer_by_name  # type: ignore[import-untyped]
        from pygments.util import ClassNotFound  # type: ignore[import-untyped]
    except ImportError:
        return [("class:md.code", text)]
    try:
        lexer = get_lexer_by_name(lang or "text")
    except ClassNotFound:
        return [("class:md.code", text)]
    return [(s, t) for s, t, *_ in to_formatted_text(PygmentsTokens(list(lex(text, lexer))))]


_FENCE = re.compile(r"\s{0,3}(`{3,}|~{3,})\s*([^`\s]*)")


def markdown(lines: list[str]) -> Fragments:
    """Markdown, a little of it: headings, bold, inline code, fenced code (highlighted, its fences
    drawn as dim rules: what is copied from the screen is the code)."""
    out: Fragments = []
    code: list[str] | None = None
    fence, lang = "", ""
    for line in trimmed(lines):
        m = _FENCE.match(line)
        if code is None and m:
            code, fence, lang = [], m[1], m[2]
            out.append(("class:md.fence", f"── {lang} ──\n" if lang else "──\n"))
        elif code is not None and m and m[1].startswith(fence) and line.strip() == m[1]:
            out += _highlight(code, lang)
            out.append(("class:md.fence", "──\n"))
            code = None
        elif code is not None:
            code.append(line)
        elif line.startswith("#"):
            out.append(("class:md.heading", line.lstrip("#").strip() + "\n"))
        else:
            out += _inline(line)
            out.append(("", "\n"))
    if code is not None:  # still streaming
        out += _highlight(code, lang)
    return out


def reasoning(lines: list[str], expanded: bool, fold_key: str = "Ctrl-O") -> Fragments:
    """The model's reasoning, dimmed; folded to its first lines (and characters) unless expanded."""
    lines = trimmed(lines)
    text = "\n".join(lines)
    if expanded or (len(lines) <= FOLD_LINES + 1 and len(text) <= REASONING_CHARS):
        return [("class:reasoning", f"reasoning: {text}\n")]
    shown = "\n".join(lines[:FOLD_LINES])[:REASONING_CHARS]
    return [
        ("class:reasoning", f"reasoning: {shown}"),
        ("class:fold", f" ... ({len(text) - len(shown)} more characters, {fold_key} to unfold)\n"),
    ]


def block(b: Block, expanded: bool) -> Fragments:
    """One block's fragments, ending in a newline."""
    match b.kind:
        case "user":
            return [("class:user.mark", "\n> "), ("class:user", "\n  ".join(trimmed(b.lines)) + "\n")]
        case "assistant":
            return markdown(b.lines)
        case "reasoning":
            return reasoning(b.lines, expanded)
        case "call":
            name, args = call_head(b.head)
            return [("class:call", "-> "), ("class:call.name", name), ("class:call", f": {args}\n")] + output(
                b.lines, expanded
            )
        case "shell":
            return [("class:shell", f"! {b.head}\n")] + output(b.lines, expanded)
        case "thought":
            return [("class:thought", "thought: " + "\n".join(trimmed(b.lines)) + "\n")]
        case "retry" | "error":
            prefix = "error: " if b.kind == "error" else ""
            return [(f"class:{b.kind}", prefix + "\n".join(trimmed(b.lines)) + "\n")]
        case "note":
            return [("class:note", "\n".join(b.lines) + "\n")]
    return [("class:info", "\n".join(":: " + ln if i == 0 else "   " + ln for i, ln in enumerate(trimmed(b.lines))))]


class Renderer:
    """Fragments of a whole conversation; each block's kept until it changes."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[tuple[int, int, bool], Fragments]] = {}

    def render(self, blocks: list[Block], expanded: bool) -> Fragments:
        out: Fragments = []
        for b in blocks:
            # Lines are only added, and only the last one grows (in a provisional copy).
            key = (len(b.lines), len(b.lines[-1]) if b.lines else -1, expanded)
            cached = self._cache.get(b.seq)
            if cached is None or cached[0] != key:
                frags = block(b, expanded)
                if frags and not frags[-1][1].endswith("\n"):
                    frags.append(("", "\n"))
                cached = self._cache[b.seq] = (key, frags)
            out += cached[1]
        return out


def plain(fragments: Fragments) -> str:
    return "".join(t for _, t in fragments)
