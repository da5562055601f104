"""LLM backends: the protocol, and a registry of backends by name, imported only when used."""

from __future__ import annotations

import importlib
import json
import os
import re
import time
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
    ReasoningDelta,
    TextDelta,
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


_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_value(text: str) -> Any:
    """`json.loads(text)`, the same value or the same error, at half its cost for a stream's
    usual event (one JSON value, nothing around it), read by the decoder's C scanner directly:
    a streamed answer parses some fifty of these a request. Anything else (whitespace around it,
    more after it, no JSON) goes through json.loads, which says what is wrong."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def coalesce(chunks: list[Chunk]) -> list[Chunk]:
    """`chunks` with each run of text pieces (or of reasoning pieces) joined into one: what one
    read of a stream brought is then one chunk for the loop to handle (an event, a write to the
    chat log), not one per token; the pieces arrive as fast, and a loop that is behind reads more
    of them at once, so its work per chunk shrinks as its load grows. A run is joined once at its
    end (a piece added at a time made its text again at each: some fifty pieces a read)."""
    if len(chunks) < 2:
        return chunks
    out: list[Chunk] = []
    run: list[TextDelta | ReasoningDelta] = []
    for chunk in chunks:
        if isinstance(chunk, (TextDelta, ReasoningDelta)) and isinstance(chunk.text, str):
            if run and type(run[0]) is not type(chunk):
                _close(run, out)
            run.append(chunk)
            continue
        if run:
            _close(run, out)
        out.append(chunk)  # a call, usage, an end; or a piece that is not text (the loop's to refuse)
    if run:
        _close(run, out)
    return out


def _close(run: list[TextDelta | ReasoningDelta], out: list[Chunk]) -> None:
    """The run's pieces as one, onto `out`; the run emptied."""
    out.append(run[0] if len(run) == 1 else type(run[0])("".join(piece.text for piece in run)))
    run.clear()


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


# An error's `type` (Anthropic's words, and others') → the HTTP status it stands for, when the error
# comes without one: an `error` event mid-stream, or a JSON error answered with a 200.
ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def error_message(body: Any, loose: bool = False) -> str | None:
    """The message of an API's JSON error: `error.message`, or `error` as a string; with `loose`
    (the body of an error status) also a top-level `message` or `detail` string (vLLM, FastAPI)."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str) and err:
        return err
    if loose or body.get("object") == "error" or body.get("type") == "error":
        for key in ("message", "detail"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    return None


def error_status(body: Any) -> int | None:
    """The HTTP status a JSON error names (`code` or `status`, as OpenRouter and vLLM give it), or
    the one its `type` stands for; None if it names none."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    for where in (err, body):
        if isinstance(where, dict):
            for key in ("code", "status"):
                value = where.get(key)
                if isinstance(value, int) and 400 <= value <= 599:
                    return value
            if (status := ERROR_TYPE_STATUS.get(str(where.get("type")))) is not None:
                return status
    return None


_ARGUMENTS: dict[str, dict[str, Any]] = {}  # text -> object, for the texts of at most 4 KiB last parsed
_ARGUMENTS_KEPT = 1024


def object_arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the JSON object Anthropic's and Ollama's APIs want (they refuse a
    history that holds anything else, on every later request): what makes no object is sent as it
    was written, {"_raw": text}. Short texts are parsed once, since the whole history goes out
    with every request (parsing it cost Ollama a tenth of a request's CPU); the object is shared,
    so never edit it."""
    if (hit := _ARGUMENTS.get(text)) is not None:
        return hit
    from ..textcalls import BadArguments, parse_arguments  # noqa: PLC0415 (`ollie backends` loads no types)

    try:
        value = parse_arguments(text)
    except BadArguments:
        value = {"_raw": text}
    if len(text) <= 4096:
        if len(_ARGUMENTS) >= _ARGUMENTS_KEPT:
            del _ARGUMENTS[next(iter(_ARGUMENTS))]  # the oldest
        _ARGUMENTS[text] = value
    return value


def parse_url(provider: str, url: str, setting: str = "") -> Any:
    """A backend's base URL, parsed (an `_http.URL`); a ConfigError naming the backend, the URL and
    where it came from when it is no http(s) URL."""
    from . import _http

    try:
        return _http.URL.parse(url)
    except ValueError as e:
        raise ConfigError(f"{provider}: URL {url!r}: {e}" + (f" ({setting})" if setting else "")) from None


def url_setting(variables: tuple[str, ...]) -> str:
    """Where a backend's URL came from, for a message whose fix is in it: the first of `variables`
    that is set, else the default."""
    for var in variables:
        if os.environ.get(var):
            return f"the URL comes from {var}"
    return f"the URL is the default; set {variables[0]} for another"


def transport_error(provider: str, e: Exception, setting: str = "") -> BackendError:
    """One wording for one failure below the API, whichever backend met it: which URL, what went
    wrong, and what to check (`e` is an `_http.HTTPError`; `setting` says where the URL came
    from, added when the fix is in the URL). Failures worth retrying (a timeout, a dropped
    connection) are TransientErrors; the rest (no such host, refused, TLS, a proxy, a redirect
    not followed, an answer that is not the stream asked for) are BackendErrors, reported at once.
    A JSON error answered with a 200 is the API's error, classed as an error status would be."""
    body = getattr(e, "body", None)
    if (message := error_message(body)) is not None:
        text = f"{getattr(e, 'where', '')} answered with an error instead of a stream: {message}"
        status = error_status(body)  # classes the error, but is no status the server sent
        if status is None:
            return (ContextOverflowError if _OVERFLOW.search(message) else BackendError)(text, provider=provider)
        return type(http_error(provider, status, message))(text, provider=provider)
    text = str(e)
    check = getattr(e, "check", "")
    if setting and getattr(e, "about_url", False):
        check = f"{check} ({setting})" if check else setting
    if check:
        text += f"; {check}"
    return (TransientError if getattr(e, "transient", True) else BackendError)(text, provider=provider)


async def status_error(provider: str, response: Any) -> BackendError:
    """An answer of status >= 300 as the BackendError its status and body make: the API's own
    error message when the body is JSON; else what the body is (an HTML page and its title, the
    start of a text) and the URL, since such an answer may not come from the API at all."""
    from . import _http

    try:
        raw = await response.read_some(1024 * 1024)
    except _http.HTTPError:
        raw = b""
    try:
        body = json.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else None
    except (ValueError, RecursionError):
        body = None
    message = error_message(body, loose=True)
    if message is None:
        ctype = response.headers.get("content-type", "").lower()
        if "html" in ctype or raw.lstrip()[:1] == b"<":
            title = _http.html_title(raw)
            what = f"an HTML page{f' ({title!r})' if title else ''}"
        elif raw.strip():
            what = _http.snippet(raw)
        else:
            what = "no message"
        message = f"Error code: {response.status}: {what} from {response.where}"
    return http_error(provider, response.status, message, response.headers.get("retry-after"))


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime

    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
