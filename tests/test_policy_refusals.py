"""A downstream's refusal on policy grounds is final: recorded `failed/policy_refused`, never sent
again, and the model is told so.

Real parts: the session's Temporal dev server, a fresh PostgreSQL ledger, the example billing
service in its own process (the conftest's, honouring no idempotency key, so a second send of a key
would show as a second request and a second credit), and a worker in this process. The billing
service refuses any credit above its authorization limit (50000 cents) with a `policy/` problem.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.policy import DEFAULT_CREDIT_LIMIT_CENTS
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.runtime.agents import build_registry
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.workflow_harness import Harness, running_worker

OVER_LIMIT = DEFAULT_CREDIT_LIMIT_CENTS + 40_000


BIG_CREDIT = {"account_id": "{{ input.account_id }}", "amount_cents": OVER_LIMIT}


def _agent(script: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": {"provider": "scripted", "script": script},
        "toolsets": ["receiver-billing"],
        "tool_policy": {"on_indeterminate": "pause"},
    }


AGENTS = {
    "toolsets": {"receiver-billing": "tests.support.receiver_tools:toolset"},
    "agents": {
        "big-credit": _agent(
            [
                {
                    "tool_calls": [
                        {
                            "name": "issue_credit",
                            "arguments": {"account_id": "{{ input.account_id }}", "amount_cents": OVER_LIMIT},
                        }
                    ]
                },
                {"final": "told: {{ results.issue_credit }}"},
            ]
        ),
        # A model that does not listen: told the credit is final, it asks for it again (a new id).
        "big-credit-twice": _agent(
            [
                {"tool_calls": [{"name": "issue_credit", "arguments": BIG_CREDIT}]},
                {"tool_calls": [{"name": "issue_credit", "arguments": BIG_CREDIT}]},
                {"final": "told: {{ results.issue_credit }}"},
            ]
        ),
        "statement": _agent(
            [
                {"tool_calls": [{"name": "account_statement", "arguments": {"account_id": "acct_review"}}]},
                {"final": "told: {{ results.account_statement }}"},
            ]
        ),
    },
}


@pytest.fixture
async def harness(
    temporal_env: WorkflowEnvironment, ledger: Ledger, billing_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    monkeypatch.setenv("ONCEFLOW_BILLING_URL", billing_url)
    async with running_worker(temporal_env.client, ledger, build_registry(AGENTS)) as running:
        yield running


def told(final: str) -> dict[str, Any]:
    """The tool message the model was given, as the scripted model quoted it."""
    assert final.startswith("told: "), final
    message: dict[str, Any] = json.loads(final.removeprefix("told: "))
    return message


async def test_credit_above_the_limit_is_policy_refused_final_and_sent_once(
    harness: Harness, ledger: Ledger, billing: BillingClient
) -> None:
    assert not await billing.dedups()  # the conftest's service: a second send would apply again
    account = f"acct_{uuid.uuid4().hex[:8]}"
    handle = await harness.start("big-credit", json.dumps({"account_id": account}))
    result = await asyncio.wait_for(handle.result(), 60)
    key = f"{handle.id}:call_0_0"

    record = await ledger.get(key)
    assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.POLICY_REFUSED)
    assert "authorization limit" in (record.error or "")
    message = told(result.final)
    assert message["final"] is True
    assert message["took_effect"] is False
    assert message["reason"] == "policy_refused"
    assert "do not make this call again" in message["note"]

    received = await billing.received(key)
    assert received.received == 1
    assert [(r.status_code, r.outcome) for r in received.requests] == [(403, "refused")]
    assert (await billing.effect(key)).applied == 0

    # Reset the finished run to just after the model asked for the credit: the rerun reserves the
    # key again, the ledger never hands a final refusal out again, so billing hears nothing more
    # and the model is told the same.
    client = harness.client
    assert handle.result_run_id is not None
    events = await history_events(client, handle.id, handle.result_run_id)
    first_model = next(r for r in activity_runs(events) if r.activity_type == "call_model")
    assert first_model.closed is not None
    reset_point = workflow_task_completed_after(events, first_model.closed.event_id)
    new_run = await reset_run(client, handle.id, handle.result_run_id, reset_point, "test: before the credit")
    rerun = await asyncio.wait_for(
        client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run).result(), 60
    )
    rerun_writes = [
        r
        for r in activity_runs(await history_events(client, handle.id, new_run))
        if r.activity_type == "run_write_tool"
    ]
    assert len(rerun_writes) == 1  # the write activity did run again; the ledger kept the tool from sending
    assert told(rerun.final) == message
    assert (await billing.received(key)).received == 1
    record = await ledger.get(key)
    assert (record.status, record.failure_kind, record.attempt) == (
        Status.FAILED,
        FailureKind.POLICY_REFUSED,
        1,
    )


async def test_the_same_refused_call_asked_again_under_a_new_id_is_refused_without_sending(
    harness: Harness, ledger: Ledger, billing: BillingClient
) -> None:
    account = f"acct_{uuid.uuid4().hex[:8]}"
    handle = await harness.start("big-credit-twice", json.dumps({"account_id": account}))
    result = await asyncio.wait_for(handle.result(), 60)
    first, again = f"{handle.id}:call_0_0", f"{handle.id}:call_1_0"
    assert (await ledger.get(first)).failure_kind is FailureKind.POLICY_REFUSED
    record = await ledger.get(again)
    assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.GUARD_REFUSED)
    assert "refused by the receiver on policy grounds" in (record.error or "")
    assert told(result.final)["final"] is True
    assert (await billing.received(first)).received == 1
    assert (await billing.received(again)).received == 0


async def test_a_read_refused_on_policy_grounds_is_told_final(harness: Harness) -> None:
    handle = await harness.start("statement", "{}")
    result = await asyncio.wait_for(handle.result(), 60)
    message = told(result.final)
    assert message["final"] is True
    assert message["reason"] == "policy_refused"
    assert "under review" in message["error"]
