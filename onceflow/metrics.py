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
  localhost:9464; the operator API always serves /metrics, on a listener of its own,
  ONCEFLOW_API_METRICS_HOST:PORT) and `console`; default none. The Temporal SDK's own worker
  metrics go out the same way through its Runtime (temporal_runtime).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation


class Call(Protocol):
    """What the instruments read of a ledger record (onceflow.ledger.ToolExecutionRecord): this
    module sits below the ledger, which records through it, and imports none of it."""

    @property
    def tool_name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def settled_at(self) -> datetime | None: ...


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
# Keyed by EventSource's values (a StrEnum: its members look these up).
SETTLED_BY = {
    "reconciler": "hook",  # the reconcile hook, or a resend inside the dedup window
    "api": "operator",
    "compensation": "operator",
    "signal": "signal",  # a resolve signal or update: a person, not authenticated
    "update": "signal",
    "guard": "guard",
    "owner": "owner",
    "deadline": "deadline",
}


def record_send(tool: str, outcome: str, *, resend: bool = False) -> None:
    CALL_SENT.add(1, {"tool": tool, "outcome": outcome, "resend": resend})


def record_replay(record: Call) -> None:
    CALL_REPLAYED.add(1, {"tool": record.tool_name, "status": str(record.status)})


def record_guard_verdict(tool: str, verdict: str) -> None:
    GUARD_VERDICT.add(1, {"tool": tool, "verdict": verdict})


def record_conflict(record: Call, source: str) -> None:
    CONFLICT_FLAGGED.add(1, {"tool": record.tool_name, "reported_by": SETTLED_BY.get(source, str(source))})


def record_escalation(record: Call) -> None:
    CALL_ESCALATED.add(1, {"tool": record.tool_name})


def record_settled(record: Call, from_status: str, source: str, since: datetime | None) -> None:
    """`record` was just settled from `from_status`, which it had been in since `since` (None: no
    event says when it got there, so since it was written)."""
    if record.settled_at is None:
        return
    UNRESOLVED_DURATION.record(
        max((record.settled_at - (since or record.created_at)).total_seconds(), 0.0),
        {
            "tool": record.tool_name,
            "from_status": str(from_status),
            "settled_by": SETTLED_BY.get(source, str(source)),
        },
    )


# -- the queue's gauges: read by one process, the operator API, which says how (watch_queue) ---------


class QueueFigure(Protocol):
    """One row of the queue in figures (onceflow.ledger.queue.QueueFigure)."""

    @property
    def tenant(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def oldest_seconds(self) -> float: ...
    @property
    def overdue(self) -> int: ...


def _no_queue() -> Sequence[QueueFigure]:
    return []


_queue_source: Callable[[], Sequence[QueueFigure]] = _no_queue


def watch_queue(source: Callable[[], Sequence[QueueFigure]]) -> None:
    """Where the queue's gauges read their figures from, once per collection (the operator API's
    ledger: onceflow/api/metrics.py). Processes that never call this report no queue figures."""
    global _queue_source
    _queue_source = source


def _observe(field: str, *, conflicts: bool) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        for figure in _queue_source():
            if (figure.status == "conflict") != conflicts:
                continue
            # No tenant at all when the API is told to name none (ONCEFLOW_METRICS_TENANT_LABEL).
            attributes = (
                {"tenant": figure.tenant, "tool": figure.tool} if figure.tenant else {"tool": figure.tool}
            )
            if not conflicts:
                attributes["status"] = figure.status
            value = getattr(figure, field)
            if field != "overdue" or figure.status == "indeterminate":
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
