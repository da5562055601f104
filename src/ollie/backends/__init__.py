"""LLM backends: the protocol, and a registry of backends by name, imported only when used."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from ..types import (
    BackendError,
    Chunk,
    ConfigError,
    ContextOverflowError,
    GenerationParams,
    Message,
    RateLimitError,
    ToolSpec,
    ToolUnsupportedError,
    TransientError,
)


@runtime_checkable
class Backend(Protocol):
    """An LLM. `stream` yields chunks and ends with `Done`; a stream that ends without `Done`
    was dropped. Errors are raised as the `BackendError` subclasses in `ollie.types`."""

    name: str  # the registry name, e.g. "openai"
    model: str

    def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]: ...

    async def models(self) -> list[str]: ...

    async def context_length(self) -> int | None: ...

    async def aclose(self) -> None: ...


# name -> "module:factory", relative to this package; the factory takes (model=None, **options).
_REGISTRY: dict[str, str] = {
    "scripted": ".scripted:ScriptedBackend.from_options",
    "openai": ".openai:OpenAIBackend.from_options",
    "anthropic": ".anthropic:AnthropicBackend.from_options",
    "ollama": ".ollama:OllamaBackend.from_options",
    "local": ".local:LocalBackend.from_options",
    "openrouter": ".presets:openrouter",
    "copilot": ".presets:copilot",
    "llamacpp": ".presets:llamacpp",
    "vllm": ".presets:vllm",
    "lmstudio": ".presets:lmstudio",
}


def register(name: str, target: str | Callable[..., Backend]) -> None:
    """Register a backend: `target` is a factory or "package.module:attr.attr" imported on use."""
    _REGISTRY[name] = target  # type: ignore[assignment]


def names() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str, model: str | None = None, **options: Any) -> Backend:
    """Build the backend registered as `name`; an unknown name lists the known ones."""
    target: Any = _REGISTRY.get(name)
    if target is None:
        raise ConfigError(f"unknown backend {name!r}; known backends: {', '.join(names())}")
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        obj: Any = importlib.import_module(module, __name__)
        for part in attr.split("."):
            obj = getattr(obj, part)
        target = obj
    return target(model=model, **options)


def default_name() -> str:
    """OLLIE_BACKEND, else the provider whose key is set, else the embedded local model."""
    if name := os.environ.get("OLLIE_BACKEND"):
        return name
    for var, name in (
        ("OLLIE_ANTHROPIC_KEY", "anthropic"),
        ("ANTHROPIC_API_KEY", "anthropic"),
        ("OLLIE_OPENROUTER_KEY", "openrouter"),
        ("OPENROUTER_API_KEY", "openrouter"),
        ("OLLIE_COPILOT_TOKEN", "copilot"),
        ("OLLIE_OPENAI_KEY", "openai"),
        ("OPENAI_API_KEY", "openai"),
        ("OLLIE_OPENAI_URL", "openai"),
    ):
        if os.environ.get(var) and name in _REGISTRY:
            return name
    return "local"


# ---- mapping HTTP failures onto the error taxonomy, shared by every HTTP backend ----------------

_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded|prompt is too long|too many tokens|maximum context length"
    r"|context window|exceeds the context",
    re.I,
)
_NO_TOOLS = re.compile(
    r"does not support tools|tools? (are|is) not supported|tool use is not supported"
    r"|does not support function|function calling is not",
    re.I,
)


def http_error(provider: str, status: int | None, message: str, retry_after: str | None = None) -> BackendError:
    """The BackendError for an HTTP failure: 429 → rate limit; a known phrase below 500 → context
    overflow / tool unsupported; ≥500 or no status (the network, an error sent mid-stream) →
    transient; else a plain error."""
    kw: dict[str, Any] = {"provider": provider, "status": status}
    if status == 429:
        return RateLimitError(message, retry_after=parse_retry_after(retry_after), **kw)
    if (status is None or status < 500) and _OVERFLOW.search(message):
        return ContextOverflowError(message, **kw)
    if status is None or status >= 500 or status in (408, 409):
        return TransientError(message, **kw)
    if status in (400, 404, 422) and _NO_TOOLS.search(message):
        return ToolUnsupportedError(message, **kw)
    return BackendError(message, **kw)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import time
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
