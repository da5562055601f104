"""Provider presets: the OpenAI-compatible backend with a provider's URL, key, headers and body.

Each is registered by name (`--backend openrouter`, `OLLIE_BACKEND=copilot`) and takes the same
options as OpenAIBackend, which override the preset's (e.g. base_url=…).
"""

from __future__ import annotations

import os
from typing import Any

from ..types import ConfigError
from . import url_setting
from .openai import OpenAIBackend, with_v1

_EPHEMERAL = {"type": "ephemeral"}


def _key(name: str, variables: tuple[str, ...], options: dict[str, Any]) -> str:
    key = options.pop("api_key", None) or next((os.environ[v] for v in variables if os.environ.get(v)), None)
    if not key:
        raise ConfigError(f"{name}: no API key; set {' or '.join(variables)}")
    return key


# ---- OpenRouter ---------------------------------------------------------------------------------

OPENROUTER_URL = "https://openrouter.ai/api/v1"


def openrouter(model: str | None = None, **options: Any) -> OpenAIBackend:
    """OpenRouter reports each request's cost when asked (`usage: {include: true}`); Claude models
    there cache only what is marked, so the system prompt and the last tool are marked."""
    key = _key("openrouter", ("OLLIE_OPENROUTER_KEY", "OPENROUTER_API_KEY"), options)
    options.setdefault("base_url", OPENROUTER_URL)
    options.setdefault("headers", {"X-Title": "ollie"})
    options.setdefault("extra_body", {"usage": {"include": True}})
    options.setdefault("prepare", _cache_claude_prompt)
    return OpenAIBackend(model, api_key=key, name="openrouter", default_model="anthropic/claude-sonnet-4.5", **options)


def _cache_claude_prompt(body: dict[str, Any]) -> None:
    if "claude" not in str(body.get("model", "")).lower():
        return
    for msg in body["messages"]:
        if msg["role"] == "system" and isinstance(msg.get("content"), str):
            msg["content"] = [{"type": "text", "text": msg["content"], "cache_control": _EPHEMERAL}]
    if body.get("tools"):
        body["tools"][-1]["cache_control"] = _EPHEMERAL


# ---- GitHub Copilot -----------------------------------------------------------------------------

COPILOT_URL = "https://api.githubcopilot.com"
# The Copilot API serves only clients that say which editor and integration they are.
COPILOT_HEADERS = {
    "Editor-Version": "vscode/1.99.0",
    "Editor-Plugin-Version": "copilot-chat/0.26.0",
    "Copilot-Integration-Id": "vscode-chat",
    "User-Agent": "GitHubCopilotChat/0.26.0",
    "Openai-Intent": "conversation-panel",
}


def copilot(model: str | None = None, **options: Any) -> OpenAIBackend:
    key = _key("copilot", ("OLLIE_COPILOT_TOKEN",), options)
    options.setdefault("base_url", COPILOT_URL)  # no /v1: Copilot serves /chat/completions at its root
    options.setdefault("headers", COPILOT_HEADERS)
    return OpenAIBackend(model, api_key=key, name="copilot", default_model="gpt-4o", **options)


# ---- OpenAI-compatible servers on this machine --------------------------------------------------


def _local_server(name: str, port: int, model: str | None, options: dict[str, Any]) -> OpenAIBackend:
    """A local server: OLLIE_<NAME>_URL (without /v1) or 127.0.0.1:<port>; a key only if
    the server was started with one (OLLIE_<NAME>_KEY)."""
    var = name.upper()
    if "base_url" not in options:
        options.setdefault("setting", url_setting((f"OLLIE_{var}_URL",)))
    options.setdefault("base_url", with_v1(os.environ.get(f"OLLIE_{var}_URL") or f"http://127.0.0.1:{port}"))
    options.setdefault("key_vars", (f"OLLIE_{var}_KEY",))
    # llama.cpp and LM Studio answer with the model they have loaded whatever the name; vLLM
    # wants the name it serves (OLLIE_MODEL / --model).
    return OpenAIBackend(model, name=name, default_model="default", **options)


def llamacpp(model: str | None = None, **options: Any) -> OpenAIBackend:
    return _local_server("llamacpp", 8080, model, options)


def vllm(model: str | None = None, **options: Any) -> OpenAIBackend:
    return _local_server("vllm", 8000, model, options)


def lmstudio(model: str | None = None, **options: Any) -> OpenAIBackend:
    return _local_server("lmstudio", 1234, model, options)
