"""The spans and metrics of `ollie.telemetry`, and the request log: imported only when tracing is
on or requests are logged (`telemetry` itself stays a few checks)."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import __version__
from ..types import Usage
from .off import Off, capture_content, log, requests_log

if TYPE_CHECKING:
    from ..agent.runtime import Runtime
    from ..tools import ToolResult
    from ..types import Done, Message, ToolCall, Usage

# The conventions' provider names, where ollie's backend name differs or says less.
_PROVIDER_NAMES = {"local": "llama_cpp", "llamacpp": "llama_cpp", "copilot": "github_copilot"}
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)


def exporting() -> Telemetry | None:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed: "
            "pip install 'ollie-agents[otel]'; not tracing"
        )
        return None

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").strip()
    if protocol not in ("http/protobuf", ""):
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: ollie exports http/protobuf only; using it", protocol)
    resource = Resource.create({"service.version": __version__})  # with OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "ollie"}))  # when they name no service
    tracer_provider = TracerProvider(resource=resource)
    traces = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    span_exporter: SpanExporter | None = None
    if traces == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        span_exporter = ConsoleSpanExporter(out=sys.stderr)
    elif traces != "none":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()  # endpoint, headers, timeout: the OTEL_* variables
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    metrics = os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower()
    readers: list[MetricReader] = []
    if metrics == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr)))
    elif metrics != "none":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    on = Telemetry(tracer_provider, meter_provider, owned=True)
    atexit.register(on.shutdown)
    return on


def embedded() -> Telemetry | None:
    from opentelemetry import metrics, trace

    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None
    return Telemetry(provider, metrics.get_meter_provider(), owned=False)


class Telemetry:
    def __init__(self, tracer_provider: Any, meter_provider: Any, owned: bool):
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._providers = (tracer_provider, meter_provider)
        self._owned = owned
        self.trace, self.context = trace, context
        self.kind, self.status, self.code = SpanKind, Status, StatusCode
        self.tracer = tracer_provider.get_tracer("ollie", __version__)
        meter = meter_provider.get_meter("ollie", __version__)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens per model request, by type",
            explicit_bucket_boundaries_advisory=list(_TOKEN_BUCKETS),
        )
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Time of a model request, to the end of its answer",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self.turns = meter.create_counter("ollie.turns", unit="{turn}", description="Turns run")
        self.tool_calls = meter.create_counter("ollie.tool_calls", unit="{call}", description="Tool calls run")
        self.stage_time = meter.create_histogram(
            "ollie.sandbox.stage.duration",
            unit="s",
            description="Time of one sandboxed execute_code stage",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self.sessions = meter.create_up_down_counter(
            "ollie.sessions.active", unit="{session}", description="Sessions open in this process"
        )

    def span(self, name: str, kind: Any, attributes: dict[str, Any], parent: Any = None) -> Any:
        return self.tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes)

    def flush(self) -> None:
        for provider in self._providers:
            if self._owned:
                provider.force_flush()

    def shutdown(self) -> None:
        if self._owned:
            self._owned = False
            for provider in self._providers:
                provider.shutdown()


# ---- the points ollie records ------------------------------------------------------------------------------


def provider_name(backend: str) -> str:
    return _PROVIDER_NAMES.get(backend, backend)


def _common(rt: Runtime) -> dict[str, Any]:
    return {
        "gen_ai.provider.name": provider_name(rt.backend.name),
        "gen_ai.request.model": rt.backend.model,
    }


def _server(rt: Runtime) -> dict[str, Any]:
    """server.address and server.port of the backend's URL (never its credentials or path)."""
    url = getattr(rt.backend, "base_url", "")
    if not isinstance(url, str) or not url:
        return {}

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return {}
    return {"server.address": host, "server.port": port} if host else {}


def _usage_attributes(usage: Usage) -> dict[str, int]:
    """The conventions count cached input tokens in the input tokens; ollie counts them apart."""
    attrs = {
        "gen_ai.usage.input_tokens": usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cache_read_tokens:
        attrs["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        attrs["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    return attrs


def _usage_since(rt: Runtime, before: tuple[int, int, int, int]) -> Usage:
    u = rt.state.usage
    return Usage(
        input_tokens=u.input_tokens - before[0],
        output_tokens=u.output_tokens - before[1],
        cache_read_tokens=u.cache_read_tokens - before[2],
        cache_write_tokens=u.cache_write_tokens - before[3],
    )


def _counts(rt: Runtime) -> tuple[int, int, int, int]:
    u = rt.state.usage
    return (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens)


def _messages_json(messages: list[Message]) -> str:
    """Messages in the conventions' shape (role and parts), as JSON."""
    out = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        if m.role == "tool":
            parts.append({"type": "tool_call_response", "id": m.tool_call_id, "response": m.content})
        elif m.content:
            parts.append({"type": "text", "content": m.content})
        for c in m.tool_calls:
            parts.append({"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments})
        out.append({"role": m.role, "parts": parts})
    return json.dumps(out, ensure_ascii=False)


class Recorder(Off):
    """One open span and what its end records."""

    def __init__(self, on: Telemetry, cm: Any):
        self.on, self._cm = on, cm
        self.span: Any = None

    def __enter__(self) -> Recorder:
        self.span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.ended(exc[1])
        except Exception:  # what a span records never fails the turn
            log.exception("telemetry: recording the end of a span failed")
        finally:
            self._cm.__exit__(*exc)

    def ended(self, error: BaseException | None) -> None:
        if error is not None:
            self.span.set_attribute("error.type", type(error).__name__)

    def fail(self, kind: str, description: str = "") -> None:
        self.span.set_attribute("error.type", kind)
        self.span.set_status(self.on.status(self.on.code.ERROR, description[:500] or None))


class Turn(Recorder):
    def __init__(self, on: Telemetry, rt: Runtime, prompt: str):
        self.rt, self.before = rt, _counts(rt)
        attrs = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": rt.env.config.name,
            "gen_ai.conversation.id": rt.state.id,
            **_common(rt),
        }
        if capture_content():
            said = [{"role": "user", "parts": [{"type": "text", "content": prompt}]}]
            attrs["gen_ai.input.messages"] = json.dumps(said, ensure_ascii=False)
        parent = rt.trace_parent() if rt.trace_parent is not None else None
        super().__init__(on, on.span(f"invoke_agent {rt.env.config.name}", on.kind.INTERNAL, attrs, parent))

    def ended(self, error: BaseException | None) -> None:
        super().ended(error)
        self.span.set_attributes(_usage_attributes(_usage_since(self.rt, self.before)))
        if capture_content() and error is None and self.rt.state.reply:
            out = [{"role": "assistant", "parts": [{"type": "text", "content": self.rt.state.reply}]}]
            self.span.set_attribute("gen_ai.output.messages", json.dumps(out, ensure_ascii=False))
        attrs = {"gen_ai.agent.name": self.rt.env.config.name, **_common(self.rt)}
        if error is not None:
            attrs["error.type"] = type(error).__name__
        self.on.turns.add(1, attrs)


class RequestLog:
    """A model request in one line of the `ollie.requests` log (`ollie run --verbose`, the
    server's log): backend, model, time, tokens, how it ended or why it failed."""

    def __init__(self, rt: Runtime, attempt: int):
        self.rt, self.attempt, self.before, self.start = rt, attempt, _counts(rt), time.perf_counter()
        self.stop = ""

    def __enter__(self) -> RequestLog:
        return self

    def answered(self, message: Message, done: Done) -> None:
        self.stop = f", stop {done.stop_reason}" + (
            f", {len(message.tool_calls)} tool calls" if message.tool_calls else ""
        )

    def result(self, result: ToolResult) -> None:
        pass

    def exited(self, status: int | None, error: str = "") -> None:
        pass

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        rt, seconds = self.rt, time.perf_counter() - self.start
        try_ = f" (try {self.attempt + 1})" if self.attempt else ""
        head = f"{rt.backend.name} {rt.backend.model}{try_}: {seconds:.2f} s"
        if error is not None:
            requests_log.info("%s, failed: %s", head, str(error)[:300] or type(error).__name__)
            return
        u = _usage_since(rt, self.before)
        cached = f" ({u.cache_read_tokens} cached)" if u.cache_read_tokens else ""
        made = f", {u.cache_write_tokens} to cache" if u.cache_write_tokens else ""
        est = " [estimated]" if rt.state.usage.estimated else ""
        requests_log.info(
            "%s, %d in%s%s / %d out%s%s, session $%.4f",
            head,
            u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
            cached,
            made,
            u.output_tokens,
            est,
            self.stop,
            rt.state.meta.cost_session,
        )


class Chat(Recorder):
    def __init__(self, on: Telemetry, rt: Runtime, attempt: int, logged: RequestLog | None = None):
        self.rt, self.before, self.start = rt, _counts(rt), time.perf_counter()
        self.logged = logged
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", **_common(rt), **_server(rt)}
        if attempt:
            attrs["ollie.request.attempt"] = attempt + 1
        params = rt.state.params
        for key, name in (("temperature", "temperature"), ("top_p", "top_p"), ("max_tokens", "max_tokens")):
            value = getattr(params, key, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attrs[f"gen_ai.request.{name}"] = value
        if capture_content():
            attrs["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": rt.system_prompt()}])
            attrs["gen_ai.input.messages"] = _messages_json(list(rt.state.messages))
        super().__init__(on, on.span(f"chat {rt.backend.model}", on.kind.CLIENT, attrs))

    def answered(self, message: Message, done: Done) -> None:
        if self.logged is not None:
            self.logged.answered(message, done)
        self.span.set_attribute("gen_ai.response.finish_reasons", [done.stop_reason])
        if capture_content():
            self.span.set_attribute("gen_ai.output.messages", _messages_json([message]))

    def ended(self, error: BaseException | None) -> None:
        super().ended(error)
        usage = _usage_since(self.rt, self.before)
        self.span.set_attributes(_usage_attributes(usage))
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", **_common(self.rt), **_server(self.rt)}
        if error is not None:
            attrs["error.type"] = type(error).__name__
        self.on.duration.record(time.perf_counter() - self.start, attrs)
        if error is None:
            counted = _usage_attributes(usage)
            for kind, key in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
                self.on.tokens.record(counted[key], {**attrs, "gen_ai.token.type": kind})
        if self.logged is not None:
            self.logged.__exit__(None, error, None)


class Tool(Recorder):
    def __init__(self, on: Telemetry, rt: Runtime, call: ToolCall):
        self.rt, self.name = rt, call.name
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        if capture_content():
            attrs["gen_ai.tool.call.arguments"] = call.arguments
        super().__init__(on, on.span(f"execute_tool {call.name}", on.kind.INTERNAL, attrs))
        self.error = ""

    def __enter__(self) -> Tool:
        super().__enter__()
        # What a sub-agent or batch job this call's code starts or prompts runs under.
        self.rt.trace_tool = self.on.trace.set_span_in_context(self.span)
        return self

    def result(self, result: ToolResult) -> None:
        if capture_content():
            self.span.set_attribute("gen_ai.tool.call.result", result.text())
        if result.is_error:
            self.error = "tool_error"
            self.fail("tool_error", result.text())

    def ended(self, error: BaseException | None) -> None:
        super().ended(error)
        if self.rt.trace_tool is not None and self.on.trace.get_current_span(self.rt.trace_tool) is self.span:
            self.rt.trace_tool = None
        attrs = {"gen_ai.tool.name": self.name}
        if error is not None or self.error:
            attrs["error.type"] = type(error).__name__ if error is not None else self.error
        self.on.tool_calls.add(1, attrs)


class Stage(Recorder):
    def __init__(self, on: Telemetry, where: str, program: str):
        self.start, self.program = time.perf_counter(), os.path.basename(program)
        attrs = {"ollie.stage.where": where, "ollie.stage.program": self.program}
        super().__init__(on, on.span(f"stage {self.program}", on.kind.INTERNAL, attrs))
        self.error = ""

    def exited(self, status: int | None, error: str = "") -> None:
        if status is not None:
            self.span.set_attribute("process.exit.code", status)
        if error:
            self.error = "stage_failed"
            self.fail("stage_failed", error)

    def ended(self, error: BaseException | None) -> None:
        super().ended(error)
        attrs = {"ollie.stage.program": self.program}
        if error is not None or self.error:
            attrs["error.type"] = type(error).__name__ if error is not None else self.error
        self.on.stage_time.record(time.perf_counter() - self.start, attrs)


class Hook(Recorder):
    def __init__(self, on: Telemetry, event: str, index: int):
        attrs = {"ollie.hook.event": event, "ollie.hook.index": index}
        super().__init__(on, on.span(f"hook {event}", on.kind.INTERNAL, attrs))

    def exited(self, status: int | None, error: str = "") -> None:
        if status is not None:
            self.span.set_attribute("process.exit.code", status)
        if status not in (0, 2):
            self.fail("hook_failed", error)
