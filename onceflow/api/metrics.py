"""The operator API's side of metrics: /metrics for Prometheus on a listener of its own, and the
queue's gauges read from its ledger (the one process that reports them, so nothing is summed across
workers), each tenant named as ONCEFLOW_METRICS_TENANT_LABEL says."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from onceflow import metrics
from onceflow.api.headers import SecurityHeaders
from onceflow.api.options import TenantLabel
from onceflow.ledger.queue import QueueFigure, queue_figures
from onceflow.runtime.agents import ToolPolicy
from onceflow.runtime.metrics_export import configure_metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from starlette.types import ASGIApp

    from onceflow.ledger import Ledger
    from onceflow.runtime.agents import AgentRegistry

log = logging.getLogger("onceflow.metrics")


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
        self.tenant_label = TenantLabel.NAME

    def watch(self, ledger: Ledger, registry: AgentRegistry, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._ledger, self._loop = ledger, loop
            self._deadlines = {
                name: agent.config.tool_policy.reconcile_deadline.total_seconds()
                for name, agent in registry.agents.items()
            }
            self._default_deadline = ToolPolicy().reconcile_deadline.total_seconds()
            self._read_at = 0.0

    def figures(self) -> list[QueueFigure]:
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
                self._figures = tenant_labelled(reading.result(timeout=10), self.tenant_label)
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


def tenant_labelled(figures: list[QueueFigure], label: TenantLabel) -> list[QueueFigure]:
    """The figures with each tenant named as ONCEFLOW_METRICS_TENANT_LABEL says: as it is, as the
    first 12 hex digits of its SHA-256, or not at all (summed over tenants; the oldest stays the
    oldest)."""
    if label is TenantLabel.NAME:
        return figures
    if label is TenantLabel.HASH:
        return [replace(f, tenant=hashlib.sha256(f.tenant.encode()).hexdigest()[:12]) for f in figures]
    summed: dict[tuple[str, str], QueueFigure] = {}
    for figure in figures:
        seen = summed.get((figure.tool, figure.status))
        summed[(figure.tool, figure.status)] = (
            replace(figure, tenant="")
            if seen is None
            else replace(
                seen,
                calls=seen.calls + figure.calls,
                oldest_seconds=max(seen.oldest_seconds, figure.oldest_seconds),
                overdue=seen.overdue + figure.overdue,
            )
        )
    return list(summed.values())


def start_metrics(ledger: Ledger, registry: AgentRegistry, tenant_label: TenantLabel) -> CollectorRegistry:
    """Make this process the one that reports the queue's gauges, read from `ledger`, with tenants
    named as `tenant_label` says; returns the registry /metrics serves (metrics_app)."""
    prometheus = configure_metrics("onceflow-operator-api", serve_prometheus=False)
    assert prometheus is not None
    QUEUE.tenant_label = tenant_label
    metrics.watch_queue(QUEUE.figures)
    with contextlib.suppress(RuntimeError):  # built inside the server's loop: OTLP reads it too
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())
    return prometheus


def metrics_app(prometheus: CollectorRegistry, ledger: Ledger, registry: AgentRegistry) -> ASGIApp:
    """GET /metrics and nothing else, for Prometheus, on a listener of its own (`onceflow api`
    serves it on ONCEFLOW_API_METRICS_HOST:PORT).

    No token: Prometheus scrapes without one. It is kept off the console's port because the queue's
    gauges name every tenant (unless ONCEFLOW_METRICS_TENANT_LABEL says otherwise); the figures are
    counts, ages, tool and tenant names, never a payload, key or token.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def metrics_endpoint(request: Request) -> Response:
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())
        # In a thread: the gauges' callbacks wait for their query to run on this loop.
        body = await asyncio.to_thread(generate_latest, prometheus)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return SecurityHeaders(Starlette(routes=[Route("/metrics", metrics_endpoint, methods=["GET"])]))


QUEUE = QueueGauges()
