"""The data every layer shares: messages, tool calls, usage, stream chunks, events and errors.

Nothing here imports anything heavy; every other module of ollie may import this one.
"""

from __future__ import annotations

import json
import math
import re
from copy import deepcopy
from dataclasses import dataclass, field, fields
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with each lone surrogate (what a JSON "\\ud800" escape decodes to) replaced by U+FFFD:
    it is no Unicode, cannot be written as UTF-8, and providers refuse a request that holds one.
    A split pair is joined."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def valid_value(value: Any) -> Any:
    """`valid_text` over the strings of a JSON value (recursive: for values of bounded depth)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list):
        return [valid_value(v) for v in value]
    if isinstance(value, dict):
        return {valid_value(k): valid_value(v) for k, v in value.items()}
    return value


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text exactly as the model wrote it; parsed when dispatched


@dataclass(slots=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str = ""  # role "tool": the call this result answers
    name: str = ""  # role "tool": the tool's name (some providers want it)
    is_error: bool = False  # role "tool": the result is an error
    # Provider state that must round-trip (e.g. Anthropic thinking blocks with signatures).
    provider_data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        if self.name:
            d["name"] = self.name
        if self.is_error:
            d["is_error"] = True
        if self.provider_data:
            d["provider_data"] = self.provider_data
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=[ToolCall(**c) for c in d.get("tool_calls") or ()],
            tool_call_id=d.get("tool_call_id", ""),
            name=d.get("name", ""),
            is_error=d.get("is_error", False),
            provider_data=d.get("provider_data") or {},
        )


@dataclass(slots=True)
class Usage:
    """Tokens a request (or a session) took. `input_tokens` leaves out the cached ones, which are
    counted apart (`cache_read_tokens`, `cache_write_tokens`), as Anthropic reports them: a backend
    of yours whose provider counts them in (OpenAI's `prompt_tokens`) subtracts them, or its cost
    and context size count them twice."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    requests: int = 0
    cost: float | None = None  # USD, when the provider reports it (OpenRouter)
    estimated: bool = False  # token counts are our estimate, not the provider's

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.requests += other.requests
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost
        self.estimated = self.estimated or other.estimated

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, in field order (what `dataclasses.asdict` gives, at a tenth of its
        cost: the usage event and the metadata carry it for every request)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "requests": self.requests,
            "cost": self.cost,
            "estimated": self.estimated,
        }

    def not_numbers(self) -> list[str]:
        """The fields that are no numbers (a malformed answer's usage), by name; `cost` may be None."""
        return [k for k, v in self.to_dict().items() if not isinstance(v, (int, float)) and (k, v) != ("cost", None)]


@dataclass(frozen=True, slots=True)
class Cost:
    """What the session spent, in US dollars."""

    last: float  # the last request
    session: float  # every request of the session
    price_known: bool  # False: the model's price is unknown and it was counted as $0


@dataclass(frozen=True, slots=True)
class ContextSize:
    """How full the context window is: the next request's estimated tokens against the window."""

    estimate: int
    window: int

    @property
    def percent(self) -> int:
        return 100 * self.estimate // max(self.window, 1)


# ---- what a backend streams -------------------------------------------------------------------


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a tool call. Pieces with the same index belong to one call; the call's
    position among the turn's calls is its index, whatever order the pieces arrive in.
    Backends pass on the id, name and arguments as the API sent them, whatever their type: the
    Core makes a well-formed call of them (and a malformed one gets an error result)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class UsageChunk:
    usage: Usage


# Why the answer ended. `content_filter` and `refusal` (the provider withheld or stopped the
# answer) and `other` (a reason ollie does not know) end the turn with an error: they are no answer.
StopReason = Literal["stop", "tool_calls", "length", "content_filter", "refusal", "other"]


@dataclass(slots=True)
class Done:
    """The stream's last chunk. A stream that ends without one was dropped."""

    stop_reason: StopReason = "stop"
    provider_data: dict[str, Any] = field(default_factory=dict)  # stored on the assistant message
    reason: str = ""  # the provider's own word for why it stopped, when it is not plain "stop"


Chunk = TextDelta | ReasoningDelta | ToolCallDelta | UsageChunk | Done


@dataclass(slots=True)
class ToolSpec:
    """A tool as offered to a model."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(slots=True)
class GenerationParams:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: list[str] | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # "low" | "medium" | "high"
    reasoning_budget: int | None = None  # thinking tokens (Anthropic)

    def set(self, key: str, value: Any) -> None:
        """Set one parameter from text or a value; raises ValueError naming the key."""
        if key not in GENERATION_PARAM_TYPES:
            raise InvalidValue(f"unknown generation parameter {key!r}; known: {', '.join(GENERATION_PARAM_TYPES)}")
        kind = GENERATION_PARAM_TYPES[key]
        if value is None or value == "":
            setattr(self, key, None)
            return
        try:
            if kind is list and isinstance(value, str):
                value = [s for s in value.split(",") if s]
            elif kind is dict and isinstance(value, str):
                value = json.loads(value)
            elif kind in (int, float, str):
                value = kind(value)
        except (TypeError, ValueError) as e:
            raise InvalidValue(f"{key}: expected {kind.__name__}, got {value!r}") from e
        if why := _out_of_range(key, value):
            raise InvalidValue(f"{key}: {why}, got {value!r}")
        setattr(self, key, value)

    def restore(self, stored: dict[str, Any]) -> None:
        """Set what a session stored, leaving out what `set` now refuses (a value stored before it
        was checked, a parameter of another version): a session always opens."""
        for key, value in stored.items():
            try:
                self.set(key, value)
            except InvalidValue:
                continue

    def nonempty(self) -> dict[str, Any]:
        """The parameters that are set, by name, in field order; lists and dicts copied (as
        `asdict` would, at a fifteenth of its cost: 1.8 µs, not 30; this runs for every request)."""
        out: dict[str, Any] = {}
        for key in GENERATION_PARAM_TYPES:
            value = getattr(self, key)
            if value is not None:
                out[key] = deepcopy(value) if isinstance(value, (list, dict)) else value
        return out


GENERATION_PARAM_TYPES: dict[str, type] = {  # in GenerationParams' field order
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "repetition_penalty": float,
    "max_tokens": int,
    "max_completion_tokens": int,
    "stop": list,
    "response_format": dict,
    "reasoning_effort": str,
    "reasoning_budget": int,
}
# What every provider refuses, checked when set (a NaN is not even JSON: every request would fail).
_AT_LEAST = {"temperature": 0.0, "repetition_penalty": 0.0, "max_tokens": 1, "max_completion_tokens": 1}
_AT_MOST = {"top_p": 1.0, "min_p": 1.0}


def _out_of_range(key: str, value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    low = _AT_LEAST.get(key, 0.0 if key in _AT_MOST else None)
    if low is not None and value < low:
        return f"must be at least {low}"
    high = _AT_MOST.get(key)
    if high is not None and value > high:
        return f"must be at most {high}"
    return ""


assert list(GENERATION_PARAM_TYPES) == [f.name for f in fields(GenerationParams)]
assert list(Usage().to_dict()) == [f.name for f in fields(Usage)]


# ---- what a frontend receives ------------------------------------------------------------------

EventKind = Literal[
    "user",  # text: the prompt that starts a turn
    "assistant",  # text: a delta of the answer
    "reasoning",  # text: a delta of the model's reasoning (never stored in history)
    "call",  # name, text: the arguments JSON
    "tool",  # name, text: the result; data["is_error"]
    "usage",  # data: the session's Usage as a dict
    "retry",  # text: why; data["seconds"]: seconds left (once a second)
    "limitretry",  # the same for a rate limit
    "maxsteps",  # the step budget ran out
    "error",  # text: what went wrong
    "info",  # text: a notice
    "state",  # text: the new state
    "done",  # the turn ended (successfully or not)
]


@dataclass(slots=True)
class Event:
    kind: EventKind
    text: str = ""
    name: str = ""
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.text:
            d["text"] = self.text
        if self.name:
            d["name"] = self.name
        if self.data:
            d["data"] = self.data
        return d


# ---- errors ------------------------------------------------------------------------------------
# One root: a frontend catches OllieError and shows the message; the file server maps the classes
# below to errno values (Busy: EBUSY; InvalidValue, NotFound and ConfigError: EINVAL).


class OllieError(Exception):
    """Base of ollie's own errors; the message is meant for the user."""


class ConfigError(OllieError):
    """A configuration file or variable is wrong; the message names it and the fix."""


class InvalidValue(OllieError, ValueError):
    """A value given to ollie is wrong (a cwd that is no directory, an unknown parameter, a bad
    session name); the message names the value and what is expected."""


class NotFound(OllieError, LookupError):
    """What was asked for does not exist (a model the backend does not list)."""


class Busy(OllieError):
    """Refused while a turn runs (switching the backend, changing the cwd, compacting, …)."""


class TurnError(OllieError):
    """The turn cannot go on (the message says why); completed work is kept."""

    kind = "turn"


class StoppedError(TurnError):
    """The model's answer ended for a reason that is no answer: a content filter, a refusal, or a
    stop reason ollie does not know. What it had said is kept; its tool calls are not run."""

    def __init__(self, stop_reason: str, reason: str, provider: str):
        self.kind = stop_reason
        words = {
            "content_filter": "was withheld by the provider's content filter",
            "refusal": "was stopped: the model refused",
        }
        what = words.get(stop_reason, f"stopped for a reason ollie does not know ({reason or stop_reason!r})")
        super().__init__(f"{provider}: the answer {what}; what it said so far is kept, its tool calls were not run")


class BackendError(OllieError):
    """A backend request failed. `kind` is the taxonomy hooks and the loop use."""

    kind = "unknown"

    def __init__(self, message: str, *, provider: str = "", status: int | None = None):
        self.provider = provider
        self.status = status
        prefix = provider + (f" (HTTP {status})" if status else "")
        super().__init__(f"{prefix}: {message}" if prefix else message)


class RateLimitError(BackendError):
    kind = "rate_limit"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class TransientError(BackendError):
    """5xx, network failure, or a stream that ended without its final chunk: worth retrying."""

    kind = "transient"


class ContextOverflowError(BackendError):
    kind = "context_overflow"


class ToolUnsupportedError(BackendError):
    kind = "tool_unsupported"
