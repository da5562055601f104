"""`ollie keys`: a provider's API key kept in `$OLLIE_CFG_PATH/env` (0600), which every ollie
command reads at start, and a running server again for each new session (`config.load_env_file`:
variables already set in the environment win). The terminal UI's first run writes there the
backend it found.

    ollie keys set anthropic     # asks for the key (never on the command line, which `ps` shows)
    ollie keys list              # which keys the file holds, masked
    ollie keys rm anthropic
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import config

PROVIDERS = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "copilot": "OLLIE_COPILOT_TOKEN",
}


def env_file() -> Path:
    return config.cfg_path() / "env"


def set_var(key: str, value: str, path: Path | None = None) -> Path:
    """Set `key=value` in the env file (replacing its line, keeping the others); the file is
    created 0600, and made 0600 if it was not."""
    path = path or env_file()
    if "\n" in value or "\r" in value:
        raise ValueError("a value cannot hold a newline")
    lines = _lines(path)
    pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*=")
    kept = [ln for ln in lines if not pattern.match(ln)]
    _write(path, [*kept, f"{key}={value}"])
    return path


def remove_var(key: str, path: Path | None = None) -> bool:
    path = path or env_file()
    lines = _lines(path)
    pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*=")
    kept = [ln for ln in lines if not pattern.match(ln)]
    if len(kept) == len(lines):
        return False
    _write(path, kept)
    return True


def list_vars(path: Path | None = None) -> list[tuple[str, str]]:
    """(key, masked value) of each provider key in the file."""
    out = []
    wanted = set(PROVIDERS.values())
    for ln in _lines(path or env_file()):
        key, sep, value = ln.strip().removeprefix("export ").partition("=")
        if sep and key.strip() in wanted:
            value = value.strip().strip("'\"")
            out.append((key.strip(), value[:4] + "..." + value[-2:] if len(value) > 10 else "***"))
    return out


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(ln + "\n" for ln in lines))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
