"""The operator API's side of metrics: /metrics for Prometheus, and the queue's gauges read from its
ledger (the one process that reports them, so nothing is summed across workers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from onceflow import metrics
from onceflow.ledger.queue import QueueFigure, queue_figures
from onceflow.runtime.agents import ToolPolicy
from onceflow.runtime.metrics_export import configure_metrics

if TYPE_CHECKING:
    from fastapi import FastAPI

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


def mount(app: FastAPI, *, ledger: Ledger, registry: AgentRegistry) -> None:
    """Serve /metrics on the operator API and read the queue's gauges from its ledger.

    Unauthenticated, like /healthz: Prometheus scrapes without a token, and the figures are counts,
    ages and tool and tenant names, never a payload, key or token.
    """
    from fastapi import Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    prometheus = configure_metrics("onceflow-operator-api", serve_prometheus=False)
    assert prometheus is not None

    metrics.watch_queue(QUEUE.figures)
    with contextlib.suppress(RuntimeError):  # built inside the server's loop: OTLP reads it too
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        QUEUE.watch(ledger, registry, asyncio.get_running_loop())
        # In a thread: the gauges' callbacks wait for their query to run on this loop.
        body = await asyncio.to_thread(generate_latest, prometheus)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


QUEUE = QueueGauges()
