"""Helpers of the tool script tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import ollie

DEFAULTS = Path(ollie.__file__).parent / "defaults" / "tools"
TOOLKIT = DEFAULTS / "_toolkit.py"  # the code the default scripts share: no tool itself


def toolkit() -> ModuleType:
    """The scripts' shared module, loaded in this process (as the scripts import it, by its name)."""
    spec = importlib.util.spec_from_file_location("_toolkit_under_test", TOOLKIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
