"""/metrics is not on the console's port: the operator API serves it on a listener of its own, and
names each tenant as ONCEFLOW_METRICS_TENANT_LABEL says (name, hash or none). A real listener over a
real ledger; the API's own port answers /metrics with 404."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from onceflow.api.metrics import metrics_app, start_metrics, tenant_labelled
from onceflow.api.options import ApiOptions, TenantLabel
from onceflow.ledger import Ledger
from onceflow.ledger.queue import QueueFigure
from onceflow.runtime.agents import AgentRegistry
from tests.support.operator_api import OperatorApi, unknown_call
from tests.support.processes import free_port

GAUGE = "onceflow_call_unresolved_count"


@asynccontextmanager
async def listening(ledger: Ledger, label: TenantLabel) -> AsyncIterator[str]:
    registry = AgentRegistry({})
    app = metrics_app(start_metrics(ledger, registry, label), ledger, registry)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve(), name=f"metrics-{uuid.uuid4().hex[:6]}")
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def unresolved(text: str) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == GAUGE
    }


@pytest.mark.parametrize("label", list(TenantLabel))
async def test_the_queue_names_tenants_as_configured_on_its_own_listener(
    ledger: Ledger, label: TenantLabel
) -> None:
    for tenant in ("acme", "acme", "globex"):
        await unknown_call(ledger, tenant=tenant)
    async with listening(ledger, label) as url, httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(f"{url}/metrics")
        assert answer.status_code == 200
        assert (await http.get(f"{url}/console")).status_code == 404  # nothing else is served there
    found = unresolved(answer.text)
    common = frozenset({("status", "indeterminate"), ("tool", "issue_credit")})
    if label is TenantLabel.NAME:
        assert found == {common | {("tenant", "acme")}: 2, common | {("tenant", "globex")}: 1}
    elif label is TenantLabel.HASH:
        named = {hashlib.sha256(t.encode()).hexdigest()[:12]: n for t, n in (("acme", 2), ("globex", 1))}
        assert found == {common | {("tenant", h)}: n for h, n in named.items()}
        assert "acme" not in answer.text and "globex" not in answer.text
    else:
        assert found == {common: 3}
        assert "tenant=" not in answer.text


def test_with_no_tenant_the_figures_are_summed_and_the_oldest_stays_the_oldest() -> None:
    figures = [
        QueueFigure("a", "t", "indeterminate", calls=2, oldest_seconds=5, overdue=1),
        QueueFigure("b", "t", "indeterminate", calls=3, oldest_seconds=9, overdue=0),
        QueueFigure("b", "t", "held", calls=1, oldest_seconds=1, overdue=0),
    ]
    summed = {(f.tool, f.status): f for f in tenant_labelled(figures, TenantLabel.NONE)}
    assert summed["t", "indeterminate"] == QueueFigure("", "t", "indeterminate", 5, 9, 1)
    assert summed["t", "held"].calls == 1
    assert tenant_labelled(figures, TenantLabel.NAME) is figures


async def test_the_consoles_port_serves_no_metrics(operator_api: OperatorApi) -> None:
    answer = await operator_api.http.get("/metrics")
    assert answer.status_code == 404


def test_the_api_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_API_METRICS_PORT", raising=False)
    assert ApiOptions.from_env().metrics_port == 9466
    for name, value, words in (
        ("ONCEFLOW_METRICS_TENANT_LABEL", "initials", "name, hash or none"),
        ("ONCEFLOW_API_METRICS_PORT", "http", "a port number"),
        ("ONCEFLOW_CONSOLE_IDLE_TIMEOUT", "0s", "a duration above zero"),
        ("ONCEFLOW_CONSOLE_SESSION_LIFETIME", "soon", "a duration above zero"),
        ("ONCEFLOW_SIGNAL_KEY", "short", "at least 32 characters"),
    ):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(ValueError, match=words):
                ApiOptions.from_env()
    monkeypatch.setenv("ONCEFLOW_METRICS_TENANT_LABEL", "Hash")
    monkeypatch.setenv("ONCEFLOW_API_METRICS_PORT", "0")
    options = ApiOptions.from_env()
    assert (options.tenant_label, options.metrics_port) == (TenantLabel.HASH, 0)
