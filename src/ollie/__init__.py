"""ollie: a small core for agentic systems.

    import ollie

    async with ollie.open_session(backend="anthropic") as core:
        await core.submit("count the lines of README.md")
        print(core.reply)

Names are imported on first use, so `import ollie` stays cheap.
"""

from __future__ import annotations

import importlib
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
    "OllieError": "ollie.types",
    "ConfigError": "ollie.types",
    "Busy": "ollie.types",
    "InvalidValue": "ollie.types",
    "NotFound": "ollie.types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ollie' has no attribute {name!r}")

    return getattr(importlib.import_module(module), name)


__all__ = [*_LAZY, "__version__"]
