"""Metrics end to end: the demo's scenarios on the embedded stack (worker and operator API as real
processes, exporting as OTEL_METRICS_EXPORTER=prometheus says), then one call left unknown and one
left waiting for approval; the three endpoints are scraped and must show what those runs imply.
Every metric the Grafana dashboard and the alert rules name must be one of those scraped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from onceflow.cli.demo import CREDIT_CALL, SCENARIOS, TENANT, Demo, run_scenario
from onceflow.cli.dev import DevStack, StackConfig
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import EventSource, Ledger, OperatorTokens, Status
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings
from onceflow.sdk.payloads import Phase

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy/grafana/dashboards/onceflow.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
# The metric names an expression uses: ours and the Temporal SDK's, as Prometheus spells them.
METRIC_NAME = re.compile(r"\b(?:onceflow|temporal)_[a-z0-9_]+\b")


# The manual credit agent, but with a reconcile deadline that passes during the test.
DEADLINE_AGENT = "billing-assistant-deadline"


def agents_file(directory: Path) -> Path:
    """The project's agents.yaml plus DEADLINE_AGENT."""
    agents = yaml.safe_load((ROOT / "agents.yaml").read_text())
    quick = dict(agents["agents"]["billing-assistant-manual"])
    quick["tool_policy"] = {
        "on_indeterminate": "pause",
        "reconcile_deadline": "2s",
        "reconcile_initial_interval": "1s",
        "reconcile_max_interval": "1s",
        "escalation_owner": "billing-oncall",
    }
    agents["agents"][DEADLINE_AGENT] = quick
    path = directory / "agents.yaml"
    path.write_text(yaml.safe_dump(agents, sort_keys=False))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Scrape:
    """(name, labels, value) of every sample one endpoint served."""

    samples: list[tuple[str, dict[str, str], float]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            [
                (s.name, s.labels, s.value)
                for family in text_string_to_metric_families(text)
                for s in family.samples
            ]
        )

    def names(self) -> set[str]:
        return {name for name, _, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
        return sum(value for n, have, value in self.samples if n == name and labels.items() <= have.items())


@dataclass
class Scraped:
    api: Scrape
    worker: Scrape
    sdk: Scrape
    api_text: str


@pytest.fixture(scope="module")
async def scraped(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scraped]:
    data_dir = tmp_path_factory.mktemp("metrics-stack")
    worker_port, sdk_port, api_port, api_metrics_port = free_port(), free_port(), free_port(), free_port()
    config = StackConfig(
        data_dir, free_port(), free_port(), free_port(), api_port, api_metrics_port=api_metrics_port
    )
    with pytest.MonkeyPatch.context() as env:
        for name in ("TEMPORAL_ADDRESS", "ONCEFLOW_DATABASE_URL"):
            env.delenv(name, raising=False)
        env.setenv("OTEL_METRICS_EXPORTER", "prometheus")
        env.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
        env.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(worker_port))
        env.setenv("ONCEFLOW_TEMPORAL_METRICS_PORT", str(sdk_port))
        env.setenv("ONCEFLOW_AGENTS", str(agents_file(data_dir)))
        stack = DevStack(config)
        info = await stack.start()
        try:
            for name, value in info.environment().items():
                env.setenv(name, value)
            ledger = await Ledger.connect(info.database_url)
            try:
                _, token = await OperatorTokens(ledger).create(tenant=TENANT, operator="metrics-test")
                client = await connect(Settings.from_env())
                headers = {"Authorization": f"Bearer {token}"}
                async with (
                    BillingClient(info.billing_url) as billing,
                    httpx.AsyncClient(base_url=info.api_url or "", headers=headers, timeout=30) as api,
                ):
                    demo = Demo(info, client, ledger, billing, api)
                    for scenario in SCENARIOS:
                        report = await run_scenario(scenario, demo)
                        assert report.ok, report.problems
                    await _leave_the_queue_busy(demo)
                    async with httpx.AsyncClient(timeout=10) as plain:  # no token: Prometheus has none
                        # Not on the console's port: on the API's own metrics listener.
                        assert (await plain.get(f"{info.api_url}/metrics")).status_code == 404
                        assert info.api_metrics_url == f"http://127.0.0.1:{api_metrics_port}/metrics"
                        api_text = (await plain.get(info.api_metrics_url)).text
                        worker_text = (await plain.get(f"http://127.0.0.1:{worker_port}/metrics")).text
                        sdk_text = (await plain.get(f"http://127.0.0.1:{sdk_port}/metrics")).text
            finally:
                await ledger.close()
        finally:
            await stack.stop()
    for name, text in (("api", api_text), ("worker", worker_text), ("sdk", sdk_text)):
        (data_dir / f"{name}.prom").write_text(text)  # kept with the stack's logs, for a failure
    yield Scraped(Scrape.parse(api_text), Scrape.parse(worker_text), Scrape.parse(sdk_text), api_text)


async def _leave_the_queue_busy(demo: Demo) -> None:
    """Left so while the endpoints are scraped: a credit nobody knows about, past its reconcile
    deadline and escalated; one waiting for approval; and one in conflict: settled failed by an
    operator, then contradicted by a late reconcile answer that this test writes to the ledger
    itself (so the counter of that flag is in this process; tests/test_metrics_ledger.py checks
    it), while the open conflict is the ledger's, read by the API like any other."""
    for account in ("acct_metrics_unknown", "acct_metrics_conflict"):
        await demo.billing.set_account_fault(account, "fail_before_apply", delay_seconds=15, times=1)
    await demo.start(DEADLINE_AGENT, "ord_metrics_unknown", "metrics-unknown")
    await demo.start("billing-assistant-approval", "ord_metrics_waiting", "metrics-waiting")
    await demo.start("billing-assistant-manual", "ord_metrics_conflict", "metrics-conflict")
    await demo.wait_for_phase("metrics-waiting", Phase.AWAITING_APPROVAL)
    await demo.wait_for_phase("metrics-conflict", Phase.AWAITING_RECONCILIATION)
    conflict = f"metrics-conflict:{CREDIT_CALL}"
    await demo.operator(
        conflict, "resolve", {"status": "failed", "reason": "no credit found", "evidence": {"lookup": "none"}}
    )
    late = await demo.ledger.record_late_outcome(
        conflict, actor="reconciler", status=Status.COMPLETED, source=EventSource.RECONCILER
    )
    assert late.has_conflict
    await demo.wait_for_phase("metrics-unknown", Phase.AWAITING_RECONCILIATION)
    unknown = f"metrics-unknown:{CREDIT_CALL}"
    async with asyncio.timeout(60):
        while (record := await demo.ledger.find(unknown)) is None or record.escalated_at is None:
            await asyncio.sleep(0.3)
    await asyncio.sleep(1)  # past the deadline by the ledger's clock too


def test_the_queue_gauges_show_the_unknown_call_and_the_waiting_approval(scraped: Scraped) -> None:
    api = scraped.api
    unknown = {"tenant": TENANT, "tool": "issue_credit", "status": "indeterminate"}
    assert api.value("onceflow_call_unresolved_count", **unknown) == 1
    assert api.value("onceflow_call_unresolved_count", status="awaiting_approval") == 1
    assert api.value("onceflow_call_unresolved_count", status="held") == 0
    assert api.value("onceflow_call_unresolved_oldest_age_seconds", **unknown) > 0
    assert api.value("onceflow_call_overdue_count", **unknown) == 1  # its 2 s deadline passed
    assert api.value("onceflow_conflict_open_count", tenant=TENANT, tool="issue_credit") == 1
    # The queue is the API's to report, once; a worker never reports it.
    assert not {n for n in scraped.worker.names() if "unresolved_count" in n or "overdue" in n}


def test_sends_settles_and_guard_verdicts_are_counted_where_they_happened(scraped: Scraped) -> None:
    worker, api = scraped.worker, scraped.api
    sent = "onceflow_call_sent_total"
    # Unknown: lost-response, never-landed, asked-again, the call left unknown and the conflict.
    assert worker.value(sent, tool="issue_credit", outcome="indeterminate", resend="false") == 5
    # Completed: the credit later compensated and the approved one; then the compensation itself.
    assert worker.value(sent, tool="issue_credit", outcome="completed") == 2
    assert worker.value(sent, tool="void_credit", outcome="completed") == 1
    assert worker.value(sent, tool="issue_credit", outcome="failed") == 1  # the locked account
    # The reconcile hook settled lost-response and asked-again, in the worker.
    settled = "onceflow_call_unresolved_duration_seconds_count"
    assert worker.value(settled, settled_by="hook", from_status="indeterminate") == 2
    assert worker.value(settled, settled_by="operator") == 0
    # The operator settled never-landed and the conflict's call, and denied one approval: the API.
    assert api.value(settled, settled_by="operator", from_status="indeterminate") == 2
    assert api.value(settled, settled_by="operator", from_status="awaiting_approval") == 1
    assert api.value("onceflow_call_unresolved_duration_seconds_sum", settled_by="operator") > 0
    # asked-again: the repeat got the first credit back from the intent guard.
    assert worker.value("onceflow_guard_verdict_total", tool="issue_credit", verdict="reuse") == 1
    assert worker.value("onceflow_call_escalated_total", tool="issue_credit") == 1


def test_the_temporal_sdk_reports_worker_health(scraped: Scraped) -> None:
    sdk = scraped.sdk
    assert sdk.value("temporal_worker_task_slots_available", worker_type="ActivityWorker") > 0
    assert sdk.value("temporal_activity_schedule_to_start_latency_count") > 0


def test_every_metric_the_dashboard_and_the_alerts_name_is_exported(scraped: Scraped) -> None:
    exported = scraped.api.names() | scraped.worker.names() | scraped.sdk.names()
    named = set(METRIC_NAME.findall(ALERTS.read_text()))
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert expressions, "the dashboard has no queries"
    named |= {name for expr in expressions for name in METRIC_NAME.findall(expr)}
    assert len(named) >= 8, named
    assert named <= exported, f"named but not exported: {sorted(named - exported)}"


def test_metrics_reveal_no_payload_key_or_token(scraped: Scraped) -> None:
    text = scraped.api_text
    assert "metrics-" not in text  # no run id, so no key
    assert "acct_metrics_unknown" not in text and "ord_metrics" not in text  # no arguments
    assert "Bearer" not in text


def test_the_compose_stack_scrapes_the_api_the_worker_and_the_sdk() -> None:
    config = (ROOT / "deploy/prometheus/prometheus.yml").read_text()
    for target in ("operator-api:9466", "port: 9464", "port: 9465"):
        assert target in config
    assert os.path.basename(ALERTS) in config
