"""The layout's promises (docs/architecture.md), read from the source: layers point down only, and
no module imports one that imports it back. Every import counts, at the top or inside a function;
one under `if TYPE_CHECKING:` does not (it names a type, it loads nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
FRONTENDS = {"cli", "tui", "web", "fs", "__main__"}  # what people drive; they use the agent


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "ollie").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_only(tree: ast.Module) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The ollie modules an import statement loads (`from . import x` may name a module or a name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
        base = base if node.level else (node.module or "")
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    found = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            found.append(name)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        skip = _type_only(tree)
        graph[module] = {
            target
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skip
            for target in _imported(module, node)
        }
    return graph


GRAPH = _graph()


def _group(module: str) -> str:
    """`ollie.fs.jobs` -> `fs`; the package root `ollie` is its own group (its version, lazily its API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ollie"


def _offending(groups: set[str], forbidden: set[str]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _group(module) in groups
        for target in targets
        if _group(target) in forbidden
    )


def test_the_graph_sees_the_imports_it_should():
    """The checks below are only as good as this reading of the source."""
    assert "ollie.agent.loop" in GRAPH["ollie.agent.core"]
    assert "ollie.vfs.ninep_client" in GRAPH["ollie.tui.client"]
    assert "ollie.fs.ray_jobs" in GRAPH["ollie.fs.jobs"]  # inside a function: counted


def test_no_module_imports_one_that_imports_it_back():
    seen: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if seen.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in seen:
                visit(target, path)
        path.pop()
        seen[module] = 2

    for module in sorted(GRAPH):
        if module not in seen:
            visit(module, [])
    assert cycles == []


def test_below_the_agent_nothing_knows_the_agent_or_a_frontend():
    below = {_group(m) for m in MODULES} - FRONTENDS - {"agent", "ollie"}
    assert _offending(below, {"agent", *FRONTENDS}) == []


def test_the_agent_knows_no_frontend_and_no_file_server():
    assert _offending({"agent"}, {*FRONTENDS, "vfs"}) == []


def test_the_file_system_toolkit_knows_nothing_of_ollie_but_its_types_and_config():
    assert {_group(t) for m, ts in GRAPH.items() if _group(m) == "vfs" for t in ts} <= {"vfs", "types", "config"}


@pytest.mark.parametrize("frontend", ["tui", "web"])
def test_the_terminal_ui_and_the_web_page_reach_sessions_only_through_files(frontend):
    assert _offending({frontend}, {"agent", "fs", "cli"} - {frontend}) == []


def test_the_file_server_is_driven_by_the_command_line_never_the_reverse():
    assert _offending({"fs"}, {"cli", "tui"}) == []


def test_the_default_tool_scripts_import_nothing_of_ollie():
    """They run as programs in the sandbox, where ollie may not be importable."""
    assert _offending({"defaults"}, {_group(m) for m in MODULES} - {"defaults"}) == []
