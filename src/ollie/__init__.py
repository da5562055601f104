"""ollie: a small core for agentic systems.

    from ollie import Core, CoreConfig, build_agent_env
    from ollie.tools import new_dispatcher_func
    from ollie.tools import execute

Names are imported on first use, so `import ollie` stays cheap.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Core": "ollie.agent.core",
    "CoreConfig": "ollie.agent.core",
    "build_agent_env": "ollie.agent.env",
    "AgentEnv": "ollie.agent.env",
    "Message": "ollie.types",
    "Event": "ollie.types",
    "ToolCall": "ollie.types",
    "Usage": "ollie.types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ollie' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [*_LAZY, "__version__"]
