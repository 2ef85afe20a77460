"""Metrics: every instrument onceflow records, how they leave the process, and the queue's gauges.

Names follow OpenTelemetry's conventions (dotted, singular, the unit on the instrument). Prometheus
spells them with underscores, the unit as a suffix and `_total` on counters: `onceflow.call.sent`
is scraped as `onceflow_call_sent_total`, `onceflow.call.unresolved.duration` (s) as
`onceflow_call_unresolved_duration_seconds_bucket`. docs/operations.md lists them all.

- Counters and the histogram are recorded where the thing happens: the ledger's decision paths and
  the write activities, in the worker and in the operator API alike.
- The queue's gauges (unresolved calls, the oldest one's age, overdue unknown calls, open conflicts)
  are read from the ledger by the operator API alone, with one SQL query per collection
  (ledger/queue.py); a worker never reports them, so nothing is summed across workers.
- Export: OTEL_METRICS_EXPORTER, a comma-separated list of `otlp` (the `otlp` extra; configured by
  OTEL_EXPORTER_OTLP_*), `prometheus` (a worker serves OTEL_EXPORTER_PROMETHEUS_HOST:PORT, default
  localhost:9464; the operator API always serves /metrics) and `console`; default none. The Temporal
  SDK's own worker metrics go out the same way through its Runtime (temporal_runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

from onceflow.ledger.records import ToolExecutionRecord
from onceflow.ledger.status import EventSource, Status

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from onceflow.ledger import Ledger
    from onceflow.ledger.queue import QueueFigure
    from onceflow.runtime.agents import AgentRegistry

log = logging.getLogger("onceflow.metrics")

_meter = metrics.get_meter("onceflow")

# -- recorded where it happens (worker and API) -----------------------------------------------------

CALL_SENT = _meter.create_counter(
    "onceflow.call.sent",
    unit="{call}",
    description="Write calls sent to their tool, by how the send ended: completed, failed or "
    "indeterminate (no answer). `resend`: sent again by the reconciler inside a dedup window.",
)
CALL_REPLAYED = _meter.create_counter(
    "onceflow.call.replayed",
    unit="{call}",
    description="Reservations answered from the ledger without sending: the call was already recorded "
    "(a retried activity, a repeated reservation), by the status found.",
)
GUARD_VERDICT = _meter.create_counter(
    "onceflow.guard.verdict",
    unit="{call}",
    description="Calls a guard did not let through as asked: hold (waits for another call), "
    "reuse (the same intent's recorded result) or refuse (budget, busy entity, lineage).",
)
CONFLICT_FLAGGED = _meter.create_counter(
    "onceflow.conflict.flagged",
    unit="{conflict}",
    description="Settled calls contradicted by a late definite outcome (the decision stands).",
)
CALL_ESCALATED = _meter.create_counter(
    "onceflow.call.escalated",
    unit="{call}",
    description="Unknown calls escalated to their policy's owner at the reconcile deadline.",
)
UNRESOLVED_DURATION = _meter.create_histogram(
    "onceflow.call.unresolved.duration",
    unit="s",
    description="How long a call stayed unresolved (unknown, held or awaiting approval) until it was "
    "settled, by who settled it: hook, operator, guard, owner (a late answer), signal or deadline.",
    explicit_bucket_boundaries_advisory=[
        1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800,
    ],
)  # fmt: skip

# Who settled a call, by the door the decision came through.
SETTLED_BY = {
    EventSource.RECONCILER: "hook",  # the reconcile hook, or a resend inside the dedup window
    EventSource.API: "operator",
    EventSource.COMPENSATION: "operator",
    EventSource.SIGNAL: "signal",  # a resolve signal or update: a person, not authenticated
    EventSource.UPDATE: "signal",
    EventSource.GUARD: "guard",
    EventSource.OWNER: "owner",
    EventSource.DEADLINE: "deadline",
}


def record_send(tool: str, outcome: str, *, resend: bool = False) -> None:
    CALL_SENT.add(1, {"tool": tool, "outcome": outcome, "resend": resend})


def record_replay(record: ToolExecutionRecord) -> None:
    CALL_REPLAYED.add(1, {"tool": record.tool_name, "status": record.status.value})


def record_guard_verdict(tool: str, verdict: str) -> None:
    GUARD_VERDICT.add(1, {"tool": tool, "verdict": verdict})


def record_conflict(record: ToolExecutionRecord, source: EventSource) -> None:
    CONFLICT_FLAGGED.add(1, {"tool": record.tool_name, "reported_by": SETTLED_BY.get(source, source.value)})


def record_escalation(record: ToolExecutionRecord) -> None:
    CALL_ESCALATED.add(1, {"tool": record.tool_name})


def record_settled(
    record: ToolExecutionRecord, from_status: Status, source: EventSource, since: datetime | None
) -> None:
    """`record` was just settled from `from_status`, which it had been in since `since` (None: no
    event says when it got there, so since it was written)."""
    if record.settled_at is None:
        return
    UNRESOLVED_DURATION.record(
        max((record.settled_at - (since or record.created_at)).total_seconds(), 0.0),
        {
            "tool": record.tool_name,
            "from_status": from_status.value,
            "settled_by": SETTLED_BY.get(source, source.value),
        },
    )


# -- the queue, read from the ledger by the operator API ---------------------------------------------


class QueueGauges:
    """The source of the queue's gauges: the API's ledger, read once per collection.

    Collections run off the event loop (the /metrics route collects in a thread; an OTLP reader
    has its own), so a callback runs the query on the loop and waits for it. The four gauges are
    called one after another in one collection; they share a reading younger than `_FRESH`.
    """

    _FRESH = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledger: Ledger | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: dict[str, float] = {}
        self._default_deadline = 3600.0
        self._figures: list[QueueFigure] = []
        self._read_at = 0.0

    def watch(self, ledger: Ledger, registry: AgentRegistry, loop: asyncio.AbstractEventLoop) -> None:
        from onceflow.runtime.agents import ToolPolicy

        with self._lock:
            self._ledger, self._loop = ledger, loop
            self._deadlines = {
                name: agent.config.tool_policy.reconcile_deadline.total_seconds()
                for name, agent in registry.agents.items()
            }
            self._default_deadline = ToolPolicy().reconcile_deadline.total_seconds()
            self._read_at = 0.0

    def figures(self) -> list[QueueFigure]:
        from onceflow.ledger.queue import queue_figures

        loop = self._loop
        if loop is not None and _on_loop(loop):  # cannot wait for the loop from inside it
            return self._figures
        with self._lock:
            if self._ledger is None or self._loop is None:
                return []
            if time.monotonic() - self._read_at < self._FRESH:
                return self._figures
            query = queue_figures(self._ledger, self._deadlines, self._default_deadline)
            try:
                reading = asyncio.run_coroutine_threadsafe(query, self._loop)
            except RuntimeError:  # the loop is closed: the process is stopping
                query.close()
                return []
            try:
                self._figures = reading.result(timeout=10)
            except Exception as exc:  # the ledger away: no figures rather than stale ones
                reading.cancel()
                log.warning("queue gauges not read from the ledger: %s", exc)
                self._figures = []
            self._read_at = time.monotonic()
            return self._figures


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


QUEUE = QueueGauges()


def _observe(field: str, *, conflicts: bool) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        for figure in QUEUE.figures():
            if (figure.status == "conflict") != conflicts:
                continue
            attributes = {"tenant": figure.tenant, "tool": figure.tool}
            if not conflicts:
                attributes["status"] = figure.status
            value = getattr(figure, field)
            if field != "overdue" or figure.status == Status.INDETERMINATE:
                yield Observation(value, attributes)

    return callback


_meter.create_observable_gauge(
    "onceflow.call.unresolved.count",
    [_observe("calls", conflicts=False)],
    unit="{call}",
    description="Calls nobody can vouch for yet, by tenant, tool and status: indeterminate, started "
    "(its owner's lease ran out), awaiting_approval, held. Read from the ledger by the operator API.",
)
_meter.create_observable_gauge(
    "onceflow.call.unresolved.oldest_age",
    [_observe("oldest_seconds", conflicts=False)],
    unit="s",
    description="Age of the oldest unresolved call, by tenant, tool and status: since it entered that "
    "status.",
)
_meter.create_observable_gauge(
    "onceflow.call.overdue.count",
    [_observe("overdue", conflicts=False)],
    unit="{call}",
    description="Indeterminate calls unknown for longer than their agent's reconcile_deadline.",
)
_meter.create_observable_gauge(
    "onceflow.conflict.open.count",
    [_observe("calls", conflicts=True)],
    unit="{conflict}",
    description="Calls with an open conflict (not yet acknowledged), by tenant and tool.",
)


# -- export -------------------------------------------------------------------------------------------

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


# -- the operator API's /metrics ---------------------------------------------------------------------


def mount(app: FastAPI, *, ledger: Ledger, registry: AgentRegistry) -> None:
    """Serve /metrics on the operator API and read the queue's gauges from its ledger.

    Unauthenticated, like /healthz: Prometheus scrapes without a token, and the figures are counts,
    ages and tool and tenant names, never a payload, key or token.
    """
    from fastapi import Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    prometheus = configure_metrics("onceflow-operator-api", serve_prometheus=False)
    assert prometheus is not None

    with contextlib.suppress(RuntimeError):  # built inside the server's loop: OTLP reads it too
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())
        # In a thread: the gauges' callbacks wait for their query to run on this loop.
        body = await asyncio.to_thread(generate_latest, prometheus)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
