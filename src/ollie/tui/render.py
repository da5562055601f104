"""The conversation as styled text for the screen: prompt_toolkit fragments, `(style, text)` pairs.

A block renders the same way every time for the same width and folding, so finished blocks are
rendered once and kept (`Renderer` caches by block, length and folding). What it draws:

    > the prompt                                    (bold)
    reasoning: the model's reasoning                (dimmed, folded after a few lines)
    assistant text as markdown: headings, emphasis, (fenced code highlighted with Pygments,
    ── python ──                                     its fences drawn as rules; lists, quotes, tables)
    -> execute_code: ls | wc -l                     (a call on one line; its output folded below it)
         3
    retrying in 2s...   error: ...   :: info        (yellow, red, dimmed)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .model import Block, trimmed

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

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
    "md.italic": "italic",
    "md.strike": "strike",
    "md.link": "underline",
    "md.url": "ansigray",
    "md.mark": "ansigray",
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


def markdown(lines: list[str]) -> Fragments:
    """The assistant's markdown, parsed by markdown-it (CommonMark, with tables and strikethrough):
    headings, emphasis, inline code, links (their URL shown after the text), lists, quotes,
    tables (columns aligned), rules, and fenced code (highlighted, its fences drawn as dim rules:
    what is copied from the screen is the code). HTML in it is shown as the text it is."""
    return _Markdown().render("\n".join(trimmed(lines)))


_PARSER: MarkdownIt | None = None


def _parser() -> MarkdownIt:
    global _PARSER
    if _PARSER is None:
        from markdown_it import MarkdownIt

        _PARSER = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    return _PARSER


_INLINE_STYLE = {"strong": "class:md.bold", "em": "class:md.italic", "s": "class:md.strike", "link": "class:md.link"}


class _Markdown:
    """Tokens to fragments, as the blocks nest: each line starts with the marks of the lists and
    quotes it is in (an item's later lines aligned under its first)."""

    def __init__(self) -> None:
        self.out: Fragments = []
        self.prefixes: list[str] = []  # per open list item or quote: what its first line starts with
        self.numbers: list[int | None] = []  # per open list: the next item's number (None: bullets)
        self.table: list[list[Fragments]] | None = None  # rows of cells while a table is read
        self.style = ""  # the block's own (a heading's)
        self.at_line_start = True
        self.item_started = False  # the innermost item's first line is out
        self.gap = False  # a top-level block ended: a blank line before the next one

    def render(self, text: str) -> Fragments:
        for token in _parser().parse(text):
            handler = getattr(self, "_" + token.type, None)
            if handler is not None:
                handler(token)
        return self.out

    # ---- lines ---------------------------------------------------------------------------------
    def _emit(self, style: str, text: str) -> None:
        for i, part in enumerate(text.split("\n")):
            if i:
                self._newline()
            if part:
                self._start_line()
                self.out.append((style, part))

    def _start_line(self) -> None:
        if not self.at_line_start:
            return
        if self.gap:
            self.out.append(("", "\n"))
            self.gap = False
        self.at_line_start = False
        for i, prefix in enumerate(self.prefixes):
            later = i == len(self.prefixes) - 1 and self.item_started or i < len(self.prefixes) - 1
            self.out.append(("class:md.mark", " " * len(prefix) if later and prefix != "│ " else prefix))
        self.item_started = True

    def _newline(self) -> None:
        if not self.at_line_start:
            self.out.append(("", "\n"))
            self.at_line_start = True

    def _block_end(self) -> None:
        self._newline()
        self.gap = self.gap or not self.prefixes

    # ---- blocks (handlers by token type) --------------------------------------------------------
    def _inline(self, t: Token) -> None:
        fragments = inline(t.children or [])
        if self.table is not None:
            self.table[-1].append(fragments)
            return
        for style, text in fragments:
            self._emit(style or self.style, text)

    def _heading_open(self, t: Token) -> None:
        self._newline()
        self.style = "class:md.heading"

    def _heading_close(self, t: Token) -> None:
        self._block_end()
        self.style = ""

    def _paragraph_close(self, t: Token) -> None:
        self._block_end()

    def _bullet_list_open(self, t: Token) -> None:
        self.numbers.append(None)

    def _ordered_list_open(self, t: Token) -> None:
        self.numbers.append(int(t.attrGet("start") or 1))

    def _bullet_list_close(self, t: Token) -> None:
        self.numbers.pop()
        self._block_end()

    _ordered_list_close = _bullet_list_close

    def _list_item_open(self, t: Token) -> None:
        self._newline()
        number = self.numbers[-1]
        if number is not None:
            self.numbers[-1] = number + 1
        self.prefixes.append(f"{number}. " if number is not None else "• ")
        self.item_started = False

    def _list_item_close(self, t: Token) -> None:
        self._newline()
        self.prefixes.pop()
        self.item_started = True

    def _blockquote_open(self, t: Token) -> None:
        self._newline()
        self.prefixes.append("│ ")

    def _blockquote_close(self, t: Token) -> None:
        self._newline()
        self.prefixes.pop()
        self._block_end()

    def _fence(self, t: Token) -> None:
        lang = (t.info or "").split()[0] if t.type == "fence" and t.info else ""
        self._rule(f"── {lang} ──" if lang else "──")
        code = t.content[:-1] if t.content.endswith("\n") else t.content
        for style, text in _highlight(code.split("\n"), lang):
            self._emit(style, text)
        self._rule("──")
        self._block_end()

    _code_block = _fence

    def _hr(self, t: Token) -> None:
        self._rule("───")

    def _rule(self, text: str) -> None:
        self._newline()
        self._emit("class:md.fence", text)
        self._newline()

    def _table_open(self, t: Token) -> None:
        self.table = []

    def _tr_open(self, t: Token) -> None:
        if self.table is not None:
            self.table.append([])

    def _table_close(self, t: Token) -> None:
        rows, self.table = self.table or [], None
        texts = [["".join(text for _, text in cell).replace("\n", " ") for cell in row] for row in rows]
        columns = max(map(len, texts), default=0)
        widths = [max((len(r[i]) for r in texts if i < len(r)), default=0) for i in range(columns)]
        self._newline()
        for n, row in enumerate(rows):
            for i, cell in enumerate(row):
                self._emit("class:md.mark", " │ " if i else "")
                for style, text in cell:
                    self._emit(style or ("class:md.bold" if n == 0 else ""), text.replace("\n", " "))
                self._emit("", " " * (widths[i] - len(texts[n][i])))
            self._newline()
            if n == 0:
                self._emit("class:md.mark", "─┼─".join("─" * w for w in widths))
                self._newline()


def inline(children: list[Token]) -> Fragments:
    """An inline token's children as fragments: emphasis styled, a link's URL after its text."""
    out: Fragments = []
    styles: list[str] = []
    links: list[str] = []
    for c in children:
        if c.type in ("text", "html_inline"):
            out.append((styles[-1] if styles else "", c.content))
        elif c.type == "code_inline":
            out.append(("class:md.code", c.content))
        elif c.type in ("softbreak", "hardbreak"):
            out.append(("", "\n"))
        elif c.type == "image":
            out.append(("class:md.link", f"[image: {c.content or c.attrGet('src')}]"))
        elif c.tag in ("strong", "em", "s", "a") and c.type.endswith("_open"):
            styles.append(_INLINE_STYLE["link" if c.tag == "a" else c.tag])
            if c.tag == "a":
                links.append(str(c.attrGet("href") or ""))
        elif c.tag in ("strong", "em", "s", "a") and c.type.endswith("_close"):
            styles.pop()
            if c.tag == "a" and (href := links.pop()) and href not in "".join(text for _, text in out[-2:]):
                out.append(("class:md.url", f" ({href})"))
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
                frags = expand_tabs(block(b, expanded))
                if frags and not frags[-1][1].endswith("\n"):
                    frags.append(("", "\n"))
                cached = self._cache[b.seq] = (key, frags)
            out += cached[1]
        return out


def expand_tabs(fragments: Fragments, width: int = 8) -> Fragments:
    """Tabs as the spaces to the next tab stop of their line (the screen showed `^I`: Go's code,
    Makefiles and tab-separated output, and what was copied from it was not the code)."""
    out: Fragments = []
    column = 0
    for style, text in fragments:
        if "\t" in text:
            pieces = []
            for i, part in enumerate(text.split("\t")):
                if i:
                    pieces.append(" " * (width - column % width))
                    column += width - column % width
                pieces.append(part)
                column = len(part) - part.rfind("\n") - 1 if "\n" in part else column + len(part)
            text = "".join(pieces)
        else:
            column = len(text) - text.rfind("\n") - 1 if "\n" in text else column + len(text)
        out.append((style, text))
    return out


def plain(fragments: Fragments) -> str:
    return "".join(t for _, t in fragments)
