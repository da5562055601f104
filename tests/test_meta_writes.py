"""A session's metadata (`SessionMeta`) is written only through the methods that keep its rules:
`SessionState`'s (agent/state.py) and its own (agent/session.py). docs/architecture.md promises
that nothing else writes the state, so that every frontend meets the same rules; this fails where
code elsewhere writes a field of it directly (`meta.f = …`, `x.meta.f += …`, `meta.f[k] = …`,
`meta.f.append(…)`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import ollie
from ollie.agent.session import SessionMeta

SRC = Path(ollie.__file__).parent
OWNERS = {SRC / "agent" / "state.py", SRC / "agent" / "session.py"}
FIELDS = {f.name for f in fields(SessionMeta)}
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault"}


def meta_field(node: ast.expr) -> str | None:
    """The field `node` names, if it is one of a session's metadata: `meta.f` or `x.meta.f`,
    subscripted or not."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if not isinstance(node, ast.Attribute) or node.attr not in FIELDS:
        return None
    owner = node.value
    if isinstance(owner, ast.Name) and owner.id == "meta" or isinstance(owner, ast.Attribute) and owner.attr == "meta":
        return node.attr
    return None


def written(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from written(element)
    elif isinstance(target, ast.Starred):
        yield from written(target.value)
    else:
        yield target


def meta_writes(source: str) -> list[tuple[int, str]]:
    """(line, field) of each direct write of a metadata field in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            for one in written(target):
                if (name := meta_field(one)) is not None:
                    found.append((one.lineno, name))
    return sorted(found)


def test_the_check_finds_each_kind_of_write():
    source = """
meta.cost_last = 1
a, s.meta.first_prompt = 1, "x"
core.session.meta.cost_session += 2
parent.meta.children["cost"] = 3
meta.notes.append("n")
del meta.env["A"]
meta.unknown = 4
meta.cost_last == 1
print(meta.children.get("cost"))
"""
    fields_written = [name for _, name in meta_writes(source)]
    assert fields_written == ["cost_last", "first_prompt", "cost_session", "children", "notes", "env"]


def test_only_the_state_and_the_store_write_a_sessions_metadata():
    offenders = [
        f"{path.relative_to(SRC.parent)}:{line}: meta.{name}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in OWNERS
        for line, name in meta_writes(path.read_text())
    ]
    assert offenders == [], "write these through SessionState's or SessionMeta's methods:\n" + "\n".join(offenders)
