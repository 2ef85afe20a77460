"""The runs the people-and-history fault tests drive (tests/test_faults_runs.py,
tests/test_faults_operators.py): their agents (a scripted lookup, then one or two credits through the
billing service in a process of its own), a worker in this process, and what billing received. The
orders (`new_order`, `account_of`) serve the infrastructure fault tests as well."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry, build_registry
from onceflow.sdk.payloads import AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.proxy import DroppingProxy
from tests.workflow_harness import Harness, running_worker

RunHandle = WorkflowHandle[AgentRunWorkflow, AgentRunResult]

LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "{{ input.order_id }}"}}
CREDIT = {
    "name": "issue_credit",
    "arguments": {
        "account_id": "{{ results.lookup_order.account_id }}",
        "amount_cents": "{{ results.lookup_order.amount_cents }}",
    },
}
SMALL_CREDIT = {
    "name": "issue_credit",
    "arguments": {"account_id": "{{ results.lookup_order.account_id }}", "amount_cents": 100},
}


def _agent(toolset: str, writes: list[dict[str, Any]], **policy: str) -> dict[str, Any]:
    return {
        "model": {
            "provider": "scripted",
            "script": [
                {"tool_calls": [LOOKUP]},
                {"tool_calls": writes},
                {"final": "credit result: {{ results.issue_credit }}"},
            ],
        },
        "toolsets": [toolset],
        "tool_policy": {"on_indeterminate": "pause", **policy},
    }


AGENTS = {
    "toolsets": {
        "process-billing": "tests.support.billing_tools:toolset",
        "faults-manual": "tests.support.fault_tools:manual",
        "faults-zombie": "tests.support.fault_tools:zombie",
    },
    "agents": {
        # Two writes in one turn: two keys per run.
        "two-credits": _agent("process-billing", [CREDIT, SMALL_CREDIT]),
        # No reconcile hook: an unknown credit waits for an operator. Its reconciler only looks
        # now and then, so twenty of them stay out of the way.
        "credit-by-operator": _agent(
            "faults-manual",
            [CREDIT],
            reconcile_deadline="1m",
            reconcile_initial_interval="10s",
            reconcile_max_interval="20s",
        ),
        "credit-zombie": _agent(
            "faults-zombie",
            [CREDIT],
            reconcile_deadline="1m",
            reconcile_initial_interval="0.2s",
            reconcile_max_interval="1s",
        ),
    },
}


@pytest.fixture
async def harness(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    proxy: DroppingProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Harness]:
    # The tools run in this process and read the billing URL when they are called.
    monkeypatch.setenv("ONCEFLOW_BILLING_URL", proxy.url)
    registry: AgentRegistry = build_registry(AGENTS)
    async with running_worker(temporal_env.client, ledger, registry) as running:
        yield running


def new_order() -> str:
    return f"ord_{uuid.uuid4().hex[:10]}"


def account_of(order: str) -> str:
    return "acct_" + order.removeprefix("ord_")


def order_input(order: str) -> str:
    return json.dumps({"order_id": order})


async def credit_requests(billing: BillingClient, keys: list[str]) -> dict[str, int]:
    """Credit requests billing received per key, counted on arrival, whatever it made of them."""
    received = await billing.received_counts()
    return {key: received.count(key) for key in keys}
