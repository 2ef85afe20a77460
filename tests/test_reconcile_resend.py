"""Receiver dedup windows: an unknown call settled by sending it again with the same key, while the
receiver still honours the key, and never after.

Real parts: the session's Temporal dev server, a fresh PostgreSQL ledger, the example billing
service in its own process WITH its idempotency (a repeated key is answered with the first answer),
recording every request it receives per key, and a worker in this process. The tools (tests/support/
receiver_tools.py) ask billing to misbehave per request of a key. Credits applied are counted by
billing's effect counter; requests by its request record, which sees every request, replays too.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import FailureKind, Ledger, Status, ToolExecutionRecord
from onceflow.runtime.agents import build_registry
from tests.support.operator_api import serving_api
from tests.support.processes import ChildProcesses, billing_database, start_billing_service
from tests.support.receiver_tools import CLOSED_WINDOW, FAULTS_BY_KEY, HOOK_ASKED
from tests.support.waiting import eventually
from tests.workflow_harness import Harness, running_worker

FAST_ROUNDS = {"reconcile_initial_interval": "0.2s", "reconcile_max_interval": "1s"}


def _agent(tool: str, **policy: str) -> dict[str, Any]:
    return {
        "model": {
            "provider": "scripted",
            "script": [
                {
                    "tool_calls": [
                        {
                            "name": tool,
                            "arguments": {"account_id": "{{ input.account_id }}", "amount_cents": 700},
                        }
                    ]
                },
                {"final": "credit result: {{ results." + tool + " }}"},
            ],
        },
        "toolsets": ["receiver-billing"],
        "tool_policy": {"on_indeterminate": "pause", "reconcile_deadline": "60s", **FAST_ROUNDS, **policy},
    }


AGENTS = {
    "toolsets": {"receiver-billing": "tests.support.receiver_tools:toolset"},
    "agents": {
        "resend": _agent("issue_credit_resendable"),
        "resend-slow-rounds": _agent(
            "issue_credit_resendable", reconcile_initial_interval="1s", reconcile_max_interval="2s"
        ),
        "resend-after-hook": _agent("issue_credit_hooked"),
        "closed-window": _agent(
            "issue_credit_short_window",
            on_indeterminate="fail",
            reconcile_deadline="2s",
            escalation_owner="billing-oncall",
        ),
    },
}


@pytest.fixture(scope="module")
async def dedup_billing_url(
    tmp_path_factory: pytest.TempPathFactory, postgres_dsn: str
) -> AsyncIterator[str]:
    directory: Path = tmp_path_factory.mktemp("billing-dedup")
    processes = ChildProcesses(directory)
    async with billing_database(postgres_dsn) as database_url:
        try:
            yield await start_billing_service(processes, database_url, dedup=True)
        finally:
            processes.close()


@pytest.fixture
async def billing(dedup_billing_url: str) -> AsyncIterator[BillingClient]:
    async with BillingClient(dedup_billing_url) as client:
        assert await client.dedups()
        yield client


@pytest.fixture
async def harness(
    temporal_env: WorkflowEnvironment, ledger: Ledger, dedup_billing_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    monkeypatch.setenv("ONCEFLOW_BILLING_URL", dedup_billing_url)
    async with running_worker(temporal_env.client, ledger, build_registry(AGENTS)) as running:
        yield running


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


def account() -> str:
    return f"acct_{uuid.uuid4().hex[:8]}"


def kinds(record: ToolExecutionRecord) -> list[str]:
    return [e.kind for e in record.events]


@pytest.mark.parametrize("agent", ["resend", "resend-after-hook"])
async def test_unknown_credit_is_settled_by_a_resend_inside_the_window_with_one_effect(
    harness: Harness, ledger: Ledger, billing: BillingClient, agent: str
) -> None:
    run = run_id()
    key = f"{run}:call_0_0"
    # The first request is applied and then hangs past the tool's 1 s timeout; the resend is not.
    FAULTS_BY_KEY[key] = ["apply_then_hang", None]
    handle = await harness.start(agent, json.dumps({"account_id": account()}), run_id=run)
    result = await asyncio.wait_for(handle.result(), 60)

    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert record.settled_by == "reconciler"
    assert record.evidence["strategy"] == "resend_within_dedup_window"
    assert record.evidence["resend"] == 1
    assert "dedup window" in (record.reason or "")
    assert record.result["idempotency_key"] == key
    assert kinds(record) == ["reserved", "indeterminate", "resend", "settled"]
    resend = next(e for e in record.events if e.kind == "resend")
    assert (resend.source, resend.detail["dedup_window_seconds"]) == ("reconciler", 24 * 3600)
    if agent == "resend-after-hook":
        assert HOOK_ASKED[key] == 1  # asked first; it could not tell, so the resend settled it

    # Billing applied one credit for the key, and heard it twice: the hung request and the resend,
    # which it answered with the first request's credit.
    assert (await billing.effects()).count(key) == 1
    received = await billing.received(key)
    assert received.received == 2
    assert [r.outcome for r in received.requests] == ["applied", "answered"]
    assert record.result["credit_id"] in result.final


async def test_a_resend_that_times_out_leaves_the_call_unknown_for_the_next_round(
    harness: Harness, ledger: Ledger, billing: BillingClient
) -> None:
    run = run_id()
    key = f"{run}:call_0_0"
    # The first request is slow to apply (10 s), so is the first resend; the second resend is not.
    FAULTS_BY_KEY[key] = ["slow", "slow", None]
    handle = await harness.start("resend", json.dumps({"account_id": account()}), run_id=run)
    await asyncio.wait_for(handle.result(), 60)

    record = await ledger.get(key)
    assert record.status is Status.COMPLETED
    assert kinds(record) == [
        "reserved",
        "indeterminate",
        "resend",
        "resend_inconclusive",
        "resend",
        "settled",
    ]
    assert record.evidence["resend"] == 2
    assert (await billing.effects()).count(key) == 1
    assert (await billing.received(key)).received == 3


@pytest.mark.parametrize(
    ("first", "answer"),
    [
        ("apply_then_hang", "other_body"),  # applied, then the resend is told the key has another body
        ("apply_then_hang", "in_progress"),  # applied, then the resend is told the key is in progress
        ("fail_before_apply", "reject"),  # a rejection that says nothing of the key
    ],
)
async def test_a_refusal_of_the_resend_that_does_not_deny_the_key_leaves_the_call_unknown(
    harness: Harness, ledger: Ledger, billing: BillingClient, first: str, answer: str
) -> None:
    run = run_id()
    key = f"{run}:call_0_0"
    # The first answer is lost; the first resend is refused; the second is answered with the truth.
    FAULTS_BY_KEY[key] = [first, answer, None]
    handle = await harness.start("resend", json.dumps({"account_id": account()}), run_id=run)
    result = await asyncio.wait_for(handle.result(), 60)

    record = await ledger.get(key)
    assert record.status is Status.COMPLETED, (record.status, record.reason, kinds(record))
    assert kinds(record) == [
        "reserved",
        "indeterminate",
        "resend",
        "resend_inconclusive",
        "resend",
        "settled",
    ]
    inconclusive = next(e for e in record.events if e.kind == "resend_inconclusive")
    assert (inconclusive.detail["answer_kind"], inconclusive.detail["answered"]) == ("rejected", True)
    assert (await billing.effects()).count(key) == 1
    assert record.result["credit_id"] in result.final


async def test_a_resend_answered_no_record_of_the_key_settles_the_call_not_applied(
    harness: Harness, ledger: Ledger, billing: BillingClient
) -> None:
    run = run_id()
    key = f"{run}:call_0_0"
    # A 5xx answer may hide an effect (unknown); billing answers the resend that it has no credit for
    # the key and never will (the key is fenced): the example maps that to ToolKeyNotFoundError.
    FAULTS_BY_KEY[key] = ["fail_before_apply", "fenced"]
    handle = await harness.start("resend", json.dumps({"account_id": account()}), run_id=run)
    result = await asyncio.wait_for(handle.result(), 60)

    record = await ledger.get(key)
    assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.NOT_APPLIED)
    assert record.evidence["strategy"] == "resend_within_dedup_window"
    assert record.evidence["answer_kind"] == "no_record_of_key"
    assert "fenced" in record.evidence["answer"]
    assert (await billing.effects()).count(key) == 0
    assert (await billing.received(key)).received == 2
    assert '"took_effect": false' in result.final


async def test_an_operator_resolve_during_a_resend_is_refused_and_lands_after_it(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    dedup_billing_url: str,
    billing: BillingClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONCEFLOW_BILLING_URL", dedup_billing_url)
    run = run_id()
    key = f"{run}:call_0_0"
    # Every resend stays on the wire past the tool's 1 s timeout and never reaches billing.
    FAULTS_BY_KEY[key] = ["fail_before_apply", *["on_the_wire"] * 20]
    decision = {"status": "failed", "reason": "no credit in billing", "evidence": {"checked": "ledger"}}
    async with serving_api(temporal_env.client, ledger, build_registry(AGENTS)) as api:
        handle = await api.runs.start("resend-slow-rounds", json.dumps({"account_id": account()}), run_id=run)

        async def resending() -> bool:
            record = await ledger.find(key)
            return record is not None and "resend" in kinds(await ledger.get(key))

        await eventually(resending, "the reconciler to re-send the call")
        async with await api.as_operator() as alice:
            refused = await alice.post(f"/v1/tool-executions/{key}/resolve", json=decision)
            assert refused.status_code == 409, refused.text
            problem = refused.json()
            assert problem["type"] == "urn:onceflow:problem:resend-in-flight"
            assert (problem["resend"], problem["resend_by"]) == (1, "reconciler")
            assert problem["on_the_wire_until"] in problem["detail"]
            assert problem["no_resend_before"] in problem["detail"]
            assert (await ledger.get(key, with_events=False)).status is Status.INDETERMINATE

            # Asked again until it lands: every refusal meanwhile names a resend on the wire.
            for _ in range(300):
                answer = await alice.post(f"/v1/tool-executions/{key}/resolve", json=decision)
                if answer.status_code == 200:
                    break
                assert answer.json()["type"] == "urn:onceflow:problem:resend-in-flight", answer.text
                await asyncio.sleep(0.1)
            assert answer.status_code == 200, answer.text
        await asyncio.wait_for(handle.result(), 60)

    record = await ledger.get(key)
    assert (record.status, record.settled_by) == (Status.FAILED, "operator:alice")
    settled = next(e for e in record.events if e.kind == "settled")
    resends = [e for e in record.events if e.kind == "resend"]
    assert resends  # it was decided after the resend(s), in the quiet spell that followed one
    for resend in resends:
        assert datetime.fromisoformat(resend.detail["on_the_wire_until"]) <= settled.at
    assert (await billing.effects()).count(key) == 0


async def test_past_the_window_the_call_is_never_re_sent_and_escalates(
    harness: Harness, ledger: Ledger, billing: BillingClient
) -> None:
    run = run_id()
    key = f"{run}:call_0_0"
    FAULTS_BY_KEY[key] = ["apply_then_hang", None]
    handle = await harness.start("closed-window", json.dumps({"account_id": account()}), run_id=run)
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 60)

    async def escalated() -> bool:
        return (await ledger.get(key, with_events=False)).escalated_to == "billing-oncall"

    await eventually(escalated, "the reconciler to escalate the unknown call")
    record = await ledger.get(key)
    assert record.status is Status.INDETERMINATE  # nobody could say; a person must
    assert "resend" not in kinds(record)
    assert kinds(record).count("resend_window_closed") == 1
    closed = next(e for e in record.events if e.kind == "resend_window_closed")
    # Decided by the database's clock: at the reconciler's first round, the last moment a resend
    # could leave and still arrive inside the window had passed.
    assert datetime.fromisoformat(closed.detail["send_by"]) <= closed.at
    assert closed.detail["dedup_window_seconds"] == CLOSED_WINDOW.total_seconds()
    received = await billing.received(key)
    assert received.received == 1  # only the first request; the resend was never sent
    assert FAULTS_BY_KEY[key] == [None]
