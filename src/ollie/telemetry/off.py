"""What telemetry is when off, and what the recorders (`spans`) share: imported by both."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tools import ToolResult
    from ..types import Done, Message

log = logging.getLogger("ollie.telemetry")
requests_log = logging.getLogger("ollie.requests")  # a line per model request: `ollie run --verbose`


class Off:
    """What every instrument point gets when telemetry is off: a context manager that records
    nothing (one shared object: no allocation per call). A recorder's (`spans.Recorder`) base:
    what a kind of span does not record, it takes from here."""

    __slots__ = ()

    def __enter__(self) -> Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def answered(self, message: Message, done: Done) -> None:
        pass

    def result(self, result: ToolResult) -> None:
        pass

    def exited(self, status: int | None, error: str = "") -> None:
        pass


OFF = Off()


def capture_content() -> bool:
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
    return value in ("true", "1", "yes", "span_only", "span_and_event")
