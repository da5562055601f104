"""The assistant's markdown in the terminal UI (issue 30), parsed by markdown-it: what a model
writes most (lists, tables, links, quotes, emphasis, code) reads as it should, and nothing in it is
taken for anything but text."""

from __future__ import annotations

from ollie.tui.render import markdown, plain


def _styled(fragments: list[tuple[str, str]], style: str) -> list[str]:
    return [text for s, text in fragments if s == f"class:{style}"]


def test_lists_nest_and_later_lines_align_under_their_item():
    out = plain(markdown(["- one", "- two", "  still two", "  1. first", "  2. second", "- three"]))
    assert out == "• one\n• two\n  still two\n  1. first\n  2. second\n• three\n"


def test_a_table_has_its_columns_aligned_and_its_header_ruled():
    out = plain(markdown(["| name | size |", "|---|---:|", "| a.py | 10 |", "| long_name.txt | 2000 |"]))
    assert out.splitlines() == [
        "name          │ size",
        "──────────────┼─────",
        "a.py          │ 10  ",
        "long_name.txt │ 2000",
    ]


def test_emphasis_code_links_and_quotes():
    fragments = markdown(["Some **bold**, *em*, ~~gone~~, `x = 1` and [docs](https://ex.org/d).", "", "> said"])
    assert _styled(fragments, "md.bold") == ["bold"] and _styled(fragments, "md.italic") == ["em"]
    assert _styled(fragments, "md.strike") == ["gone"] and _styled(fragments, "md.code") == ["x = 1"]
    assert _styled(fragments, "md.link") == ["docs"] and _styled(fragments, "md.url") == [" (https://ex.org/d)"]
    assert plain(fragments).endswith("\n\n│ said\n")


def test_fenced_code_is_highlighted_between_rules_even_while_it_streams():
    fragments = markdown(["```python", "def f():", "    return 1", "```"])
    text = plain(fragments)
    assert text == "── python ──\ndef f():\n    return 1\n──\n"
    assert any("pygments" in s.lower() or s.startswith("class:pygments") for s, _ in fragments)
    assert plain(markdown(["```sh", "ls -l"])).startswith("── sh ──\nls -l\n")  # not closed yet


def test_html_stays_text():
    out = plain(markdown(["<script>alert(1)</script>", "", "<b>not bold</b> & co"]))
    assert "<script>alert(1)</script>" in out and "<b>not bold</b> & co" in out
