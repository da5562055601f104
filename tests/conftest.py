"""Every test runs with its own ollie directories and without the developer's keys or backend."""

from __future__ import annotations

import pytest

pytest_plugins = ["agent_helpers", "fs_helpers", "sandbox_helpers", "view_helpers"]  # cores, fs_server, home, run, h

_CLEARED = (
    "OLLIE_BACKEND",
    "OLLIE_MODEL",
    "OLLIE_OPENAI_URL",
    "OLLIE_OPENAI_KEY",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OLLIE_ANTHROPIC_KEY",
    "ANTHROPIC_API_KEY",
    "OLLIE_ANTHROPIC_URL",
    "ANTHROPIC_BASE_URL",
    "OLLIE_MAX_SESSION_COST",
    "OLLIE_AGENTS_PATH",
    "OLLIE_SKILLS_PATH",
    "OLLAMA_HOST",
    "OLLIE_OLLAMA_URL",
)


@pytest.fixture(autouse=True)
def ollie_dirs(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("ollie")
    for var, sub in (
        ("OLLIE_CFG_PATH", "cfg"),
        ("OLLIE_DATA_PATH", "data"),
        ("OLLIE_TMP_PATH", "tmp"),
        ("OLLIE_TOOLS_PATH", "cfg/tools"),
    ):
        (root / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(var, str(root / sub))
    for var in _CLEARED:
        monkeypatch.delenv(var, raising=False)
    return root
