"""OpenTelemetry: Temporal's tracing interceptor, and an exporter chosen by the standard OTEL_* variables.

Nothing is exported unless OTEL_TRACES_EXPORTER says so: `console`, or `otlp` (with the `otlp` extra,
configured by OTEL_EXPORTER_OTLP_* as usual).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from temporalio.contrib.opentelemetry import TracingInterceptor

_configured = False


def _exporter(name: str) -> SpanExporter | None:
    if name in ("", "none"):
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(
                "OTEL_TRACES_EXPORTER=otlp needs the otlp extra: pip install 'onceflow[otlp]'"
            ) from exc
        return OTLPSpanExporter()
    raise RuntimeError(f"OTEL_TRACES_EXPORTER={name!r} is not supported (use none, console or otlp)")


def configure_tracing(service_name: str = "onceflow") -> None:
    """Install a tracer provider if OTEL_TRACES_EXPORTER asks for one. Safe to call twice."""
    global _configured
    if _configured:
        return
    exporter = _exporter(os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower())
    if exporter is not None:
        name = os.environ.get("OTEL_SERVICE_NAME", service_name)
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    _configured = True


def tracing_interceptor() -> TracingInterceptor:
    return TracingInterceptor()
