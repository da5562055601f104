"""Tool scripts' headers: what `t/idx` lists and what execute_code's description tells the model.

A tool script says what it does in its leading comment lines (after the `#!` line; blank lines
allowed), which end at the first line that is not a comment:

    #!/usr/bin/env python3
    # ollie:parallel read
    # description: numbered lines of a text file
    # args: PATH [OFFSET] [LIMIT]

A script without a `description:` is not listed. Only the file's head is read, so a large or
binary file in a tools directory costs little. This module imports nothing of the file server.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

HEAD_BYTES = 8192  # the header is read from this much of a script, at most
SUMMARY_MAX = 1800  # characters of the script listing in execute_code's description
LINE_MAX = 200  # characters of one script's line in that listing
_FIELD = re.compile(r"#\s*(description|args):\s*(.*)")


@dataclass(frozen=True, slots=True)
class ScriptInfo:
    name: str
    description: str
    args: str = ""


def read_header(path: str | os.PathLike[str]) -> dict[str, str]:
    """The `description` and `args` fields of a script's leading comment lines ({} if unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in head.decode(errors="replace").splitlines():
        if line.startswith("#!") or not line.strip():
            continue
        if not line.startswith("#"):
            break
        m = _FIELD.match(line)
        if m:
            fields[m.group(1)] = m.group(2).strip()
    return fields


def list_scripts(dirs: Iterable[str | os.PathLike[str]]) -> list[ScriptInfo]:
    """Every described script in `dirs`, by name; a name in an earlier directory hides the same
    name in a later one, as execute_code looks them up."""
    found: dict[str, ScriptInfo] = {}
    for d in dirs:
        try:
            entries = sorted((e for e in os.scandir(d) if e.is_file()), key=lambda e: e.name)
        except OSError:  # missing, not a directory, unreadable
            continue
        for e in entries:
            if e.name in found or ".." in e.name:  # `..` in a name: execute_code refuses to run it
                continue
            fields = read_header(e.path)
            if "description" in fields:
                found[e.name] = ScriptInfo(e.name, fields["description"], fields.get("args", ""))
    return [found[name] for name in sorted(found)]


def index_text(dirs: Iterable[str | os.PathLike[str]]) -> str:
    """t/idx: `## name`, `description: …`, `args: …` and a blank line per script."""
    out = []
    for s in list_scripts(dirs):
        out.append(f"## {s.name}\ndescription: {s.description}\n")
        if s.args:
            out.append(f"args: {s.args}\n")
        out.append("\n")
    return "".join(out)


def summary(dirs: Iterable[str | os.PathLike[str]], cap: int = SUMMARY_MAX) -> str:
    """One line per script, `name args — description`, within `cap` characters; past the cap
    the rest are counted and the reader pointed at t/idx. "" when there are no scripts."""
    scripts = list_scripts(dirs)
    lines = []
    used = 0
    for i, s in enumerate(scripts):
        line = f"{s.name} {s.args}".rstrip() + f" — {s.description}"
        if len(line) > LINE_MAX:
            line = line[: LINE_MAX - 1] + "…"
        left = len(scripts) - i - 1
        tail = f"… and {left} more (see t/idx)" if left else ""
        # Keep room for the closing "… and N more" line, which may be needed after this one.
        room = cap - used - (len(tail) + 1 if tail else 0)
        if len(line) + 1 > room:
            lines.append(f"… and {len(scripts) - i} more (see t/idx)")
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)
