"""The agent: `open_session` builds a ready `Core` in one call.

    async with ollie.open_session(backend="anthropic", cwd="src") as core:
        await core.submit("what does this code do?")
        print(core.reply)

Where things are: `opening` (`open_session`), `core.Core` (the API frontends drive), `loop` (one
turn), `state` (the session's state and its rules), `commands` (the command table), `compaction`,
`hooks`, `env` (an agent's tool servers and prompt), `extensions` (what a program adds to each
session; `open_session` adds the plans, `ollie.plans`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy_names

if TYPE_CHECKING:
    from .core import Core, CoreConfig
    from .opening import Opening, open_session

# Loaded on first use, so that importing one module of the agent (its session store, for
# `ollie sessions`) does not build all of it.
_OPENING, _CORE = f"{__name__}.opening", f"{__name__}.core"
__getattr__ = lazy_names(__name__, {"open_session": _OPENING, "Opening": _OPENING, "Core": _CORE, "CoreConfig": _CORE})


__all__ = ["Core", "CoreConfig", "Opening", "open_session"]
