"""ollie: a small core for agentic systems.

    import ollie

    async with ollie.open_session(backend="anthropic") as core:
        await core.submit("count the lines of README.md")
        print(core.reply)

Names are imported on first use, so `import ollie` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"  # the version's one source: the package metadata (pyproject.toml) and `ollie --version` read it

_LAZY = {
    "open_session": "ollie.agent.opening",
    "AgentConfig": "ollie.config",
    "Core": "ollie.agent.core",
    "CoreConfig": "ollie.agent.core",
    "build_agent_env": "ollie.agent.env",
    "AgentEnv": "ollie.agent.env",
    "Message": "ollie.types",
    "Event": "ollie.types",
    "ToolCall": "ollie.types",
    "Usage": "ollie.types",
    "ContextSize": "ollie.types",
    "Cost": "ollie.types",
    "OllieError": "ollie.types",
    "ConfigError": "ollie.types",
    "Busy": "ollie.types",
    "InvalidValue": "ollie.types",
    "NotFound": "ollie.types",
}


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A package's `__getattr__` that imports each of `names` (name -> module) on first use, so
    that importing the package, or one module of it, stays cheap."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [*_LAZY, "__version__"]
