"""How metrics leave the process: the meter provider OTEL_METRICS_EXPORTER asks for, a Prometheus
registry, and the Temporal SDK's Runtime exporting its worker metrics the same way. The instruments
themselves are in onceflow/metrics.py."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("onceflow.metrics")

_configured = False
_registry: CollectorRegistry | None = None


def exporters() -> list[str]:
    names = os.environ.get("OTEL_METRICS_EXPORTER", "none").lower().split(",")
    chosen = [name.strip() for name in names if name.strip() and name.strip() != "none"]
    unknown = sorted(set(chosen) - {"otlp", "prometheus", "console"})
    if unknown:
        raise RuntimeError(
            f"OTEL_METRICS_EXPORTER={', '.join(unknown)} is not supported (use none, otlp, prometheus, console)"
        )
    return chosen


def configure_metrics(service_name: str, *, serve_prometheus: bool) -> CollectorRegistry | None:
    """Install the meter provider OTEL_METRICS_EXPORTER asks for; returns the Prometheus registry.

    `serve_prometheus`: with `prometheus`, serve it on OTEL_EXPORTER_PROMETHEUS_HOST:PORT (a worker);
    the operator API passes False and serves the registry itself at /metrics, exporter or not.
    Safe to call twice: the first call decides, as OpenTelemetry allows one provider per process.
    """
    global _configured, _registry
    if _configured:
        return _registry
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.resources import Resource

    chosen = exporters()
    readers: list[MetricReader] = []
    if "prometheus" in chosen or not serve_prometheus:
        _registry = _prometheus_registry(readers, serve=serve_prometheus and "prometheus" in chosen)
    if "otlp" in chosen:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:
            raise RuntimeError(
                "OTEL_METRICS_EXPORTER=otlp needs the otlp extra: pip install 'onceflow[otlp]'"
            ) from exc
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if "console" in chosen:
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    if readers:
        name = os.environ.get("OTEL_SERVICE_NAME", service_name)
        resource = Resource.create({"service.name": name})
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
        _configured = True  # nothing asked for yet: a later call (the API's) may still configure
    return _registry


def _prometheus_registry(readers: list[Any], *, serve: bool) -> CollectorRegistry:
    from onceflow.local.extras import require_extra

    require_extra("api", "opentelemetry.exporter.prometheus", "prometheus_client")
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    readers.append(PrometheusMetricReader(registry=registry, scope_info_enabled=False))
    if serve:
        host, port = _prometheus_address()
        start_http_server(port, addr=host, registry=registry)
        log.info("metrics for Prometheus on http://%s:%d/metrics", host, port)
    return registry


def _prometheus_address() -> tuple[str, int]:
    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    return host, int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))


def temporal_runtime() -> Runtime | None:
    """The Temporal SDK's Runtime, exporting its worker metrics as OTEL_METRICS_EXPORTER says.

    `prometheus`: the SDK serves them itself on OTEL_EXPORTER_PROMETHEUS_HOST at
    ONCEFLOW_TEMPORAL_METRICS_PORT (default 9465), named as Temporal documents them
    (temporal_worker_task_slots_available, ...), durations in seconds. `otlp`: to the OTLP endpoint.
    The SDK exports one way only: the first of the two listed. None: the SDK's default runtime.
    """
    from onceflow.runtime.config import env

    chosen = [name for name in exporters() if name in ("prometheus", "otlp")]
    if not chosen:
        return None
    config: PrometheusConfig | OpenTelemetryConfig
    if chosen[0] == "prometheus":
        host, _ = _prometheus_address()
        port = int(env("ONCEFLOW_TEMPORAL_METRICS_PORT"))
        config = PrometheusConfig(bind_address=f"{host}:{port}", durations_as_seconds=True)
        log.info("Temporal SDK metrics for Prometheus on http://%s:%d/metrics", host, port)
    else:
        config = OpenTelemetryConfig(
            url=_otlp_metrics_url(),
            headers=_otlp_headers(),
            http=os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") != "grpc",
            durations_as_seconds=True,
        )
    return Runtime(telemetry=TelemetryConfig(metrics=config))


def _otlp_metrics_url() -> str:
    explicit = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if explicit:
        return explicit
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318").rstrip("/")
    grpc = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "grpc"
    return base if grpc else f"{base}/v1/metrics"


def _otlp_headers() -> dict[str, str]:
    text = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or os.environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {name.strip(): value.strip() for name, value in pairs}
