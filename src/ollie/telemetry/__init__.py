"""OpenTelemetry traces and metrics, after the GenAI semantic conventions (docs/tracing.md).

A turn is an `invoke_agent` span; under it each model request is a `chat` span, each tool call an
`execute_tool` span (each sandboxed stage of `execute_code` a `stage` span under it), each hook a
`hook` span and each compaction a `compact` span. A sub-agent's or batch job's turns are children
of the tool call of its parent that started or prompted it. Metrics: the conventions' token usage
and operation duration histograms, and ollie's turns, tool calls, stage durations and sessions.

Off unless asked for, at the cost of one check: the SDK and its exporter (the `otel` extra) are
imported only when the standard variables ask for an export (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_TRACES_EXPORTER`, ...), and the API only then or when
the program that embeds ollie has installed an SDK tracer provider of its own. One tracer provider
serves every session of the process. Message contents are recorded only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`; keys and headers never.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .off import OFF, Off, log, requests_log

if TYPE_CHECKING:
    from ..agent.runtime import Runtime
    from ..types import ToolCall
    from .spans import Recorder, RequestLog, Telemetry


_EXPORT_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


_on: Telemetry | None = None
_decided = False


def active() -> Telemetry | None:
    """The process's telemetry, set up on first use; None when off."""
    if not _decided:
        setup()
    return _on


def setup(force: bool = False) -> Telemetry | None:
    """Decide from the environment whether to trace, and set the exporters up (once per process;
    `force` decides again, shutting down what was set up: tests, and a server told to)."""
    global _on, _decided
    if _decided and not force:
        return _on
    if _on is not None:
        _on.shutdown()
    _decided, _on = True, None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if _asked_for_export():
        from .spans import exporting

        _on = exporting()
    elif "opentelemetry.trace" in sys.modules:  # the embedding program may have set a provider up
        from .spans import embedded

        _on = embedded()
    return _on


def flush() -> None:
    """Export what is buffered now (the server's stop, tests)."""
    if _on is not None:
        _on.flush()


def _asked_for_export() -> bool:
    if any(os.environ.get(v) for v in _EXPORT_VARS):
        return True
    return any(
        os.environ.get(v, "none").strip().lower() not in ("", "none")
        for v in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER")
    )


def _safely(make: Callable[[], Any]) -> Any:
    """A span to record, or nothing when it cannot be started: tracing never fails a turn."""
    try:
        return make()
    except Exception:
        log.exception("telemetry: a span could not be started; it is left out")
        return OFF


def turn(rt: Runtime, prompt: str) -> Recorder | Off:
    on = _on if _decided else active()
    if on is None:
        return OFF
    from .spans import Turn

    return _safely(lambda: Turn(on, rt, prompt))


def chat(rt: Runtime, attempt: int = 0) -> Recorder | RequestLog | Off:
    on = _on if _decided else active()
    logged = requests_log.isEnabledFor(logging.INFO)
    if on is None and not logged:
        return OFF
    from .spans import Chat, RequestLog

    request = RequestLog(rt, attempt) if logged else None
    if on is None:
        assert request is not None
        return request
    return _safely(lambda: Chat(on, rt, attempt, request))


def tool(rt: Runtime, call: ToolCall) -> Recorder | Off:
    on = _on if _decided else active()
    if on is None:
        return OFF
    from .spans import Tool

    return _safely(lambda: Tool(on, rt, call))


def stage(where: str, program: str) -> Recorder | Off:
    on = _on if _decided else active()
    if on is None:
        return OFF
    from .spans import Stage

    return _safely(lambda: Stage(on, where, program))


def hook(event: str, index: int) -> Recorder | Off:
    on = _on if _decided else active()
    if on is None:
        return OFF
    from .spans import Hook

    return _safely(lambda: Hook(on, event, index))


def compaction(reason: str) -> Any:
    on = _on if _decided else active()
    if on is None:
        return OFF
    return on.span("compact", on.kind.INTERNAL, {"ollie.compaction.reason": reason})


def sessions(delta: int) -> None:
    on = _on if _decided else active()
    if on is not None:
        on.sessions.add(delta)


# ---- carrying a trace across processes (Ray) ------------------------------------------------------------


def inject(ctx: Any) -> dict[str, str]:
    """`ctx` (a span context, as `Runtime.trace_tool` holds) as W3C trace-context headers."""
    on = _on if _decided else active()
    if on is None or ctx is None:
        return {}
    from opentelemetry.propagate import inject as _inject

    carrier: dict[str, str] = {}
    _inject(carrier, context=ctx)
    return carrier


def extract(carrier: dict[str, str]) -> Any:
    on = _on if _decided else active()
    if on is None or not carrier:
        return None
    from opentelemetry.propagate import extract as _extract

    return _extract(carrier)
