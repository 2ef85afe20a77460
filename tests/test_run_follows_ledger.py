"""The run and the ledger never disagree for long: a paused run finds a settlement nobody told it
about, reconcilers past their deadline keep watching, search attributes drop settled keys, and the
`resolve` Update answers with the ledger's decision."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import ESCALATED_TO, UNRESOLVED_KEYS
from onceflow.sdk.payloads import AgentRunResult, Phase, ReconcileResult, ResolveSignal, SettleResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from onceflow.workflows.reconcile import reconcile_workflow_id
from tests.support.agents import credit_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, serving_api
from tests.support.waiting import eventually
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})


def _registry() -> AgentRegistry:
    agents = [
        # Nobody signals these: only the run's own re-read can find a decision.
        credit_agent("pause-recheck", "issue_credit_unreconciled", "pause", recheck_interval="1s"),
        # The run re-reads rarely; a reconciler past its 1 s deadline watches the ledger every 1 s.
        credit_agent(
            "pause-escalating",
            "issue_credit_unreconciled",
            "pause",
            reconcile_deadline="1s",
            escalation_owner="billing-oncall",
            recheck_interval="1h",
        ),
        credit_agent("pause-quiet", "issue_credit_unreconciled", "pause", recheck_interval="1h"),
        credit_agent("fail-fast", "issue_credit_unreconciled", "fail"),
    ]
    return AgentRegistry({a.name: a for a in agents})


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    async with running_worker(temporal_env.client, ledger, _registry()) as h:
        yield h


async def attribute(handle: WorkflowHandle[Any, Any], key: SearchAttributeKey[Any]) -> Any:
    return (await handle.describe()).typed_search_attributes.get(key)


async def paused_on_unknown_credit(
    harness: Harness, agent: str
) -> tuple[WorkflowHandle[AgentRunWorkflow, AgentRunResult], str]:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start(agent, ORDER)
    key = f"{handle.id}:call_1_0"

    async def paused() -> bool:
        return (await handle.query(AgentRunWorkflow.status)).phase == Phase.AWAITING_RECONCILIATION

    await eventually(paused, "the run to pause on the unknown credit")
    return handle, key


async def silence_reconciler(client: Client, key: str) -> None:
    """The reconciler would tell the run; stop it, as a lost signal or a deleted workflow would."""
    await client.get_workflow_handle(reconcile_workflow_id(key)).terminate(
        reason="test: nobody tells the run"
    )


async def settle_behind_the_runs_back(ledger: Ledger, key: str, credit_id: str = "cr_found") -> None:
    """A decision the run is never told about (its signal lost, or never sent)."""
    await ledger.settle(
        key,
        status=Status.COMPLETED,
        actor="operator:alice",
        reason="found in the billing console",
        result={"credit_id": credit_id},
    )


async def test_a_paused_run_finds_a_settlement_nobody_signalled(harness: Harness) -> None:
    handle, key = await paused_on_unknown_credit(harness, "pause-recheck")
    await silence_reconciler(harness.client, key)
    await settle_behind_the_runs_back(harness.ledger, key)
    result = await asyncio.wait_for(handle.result(), 15)
    assert "cr_found" in result.final
    assert DOWNSTREAM.send_attempts == 1
    assert await attribute(handle, UNRESOLVED_KEYS) is None
    # The model heard who settled it and why, beside the result.
    async with harness.ledger.connection("test") as conn:
        told = await conn.fetchval(
            "SELECT message->>'content' FROM conversation_messages WHERE run_id = $1 AND message->>'role' = 'tool'"
            " AND message->>'name' = 'issue_credit_unreconciled'",
            handle.id,
        )
    assert json.loads(told) == {
        "ok": True,
        "result": {"credit_id": "cr_found"},
        "settled_by": "operator:alice",
        "settlement_reason": "found in the billing console",
    }


async def test_a_paused_run_finds_the_owners_late_answer(harness: Harness) -> None:
    """The attempt that timed out answers after all, straight into the ledger; nobody signals."""
    handle, key = await paused_on_unknown_credit(harness, "pause-recheck")
    await silence_reconciler(harness.client, key)
    owner = (await harness.ledger.get(key, with_events=False)).owner
    assert owner is not None
    late = await harness.ledger.complete(key, owner=owner, result={"credit_id": "cr_late"})
    assert late.status is Status.COMPLETED and late.settled_by == owner
    result = await asyncio.wait_for(handle.result(), 15)
    assert "cr_late" in result.final
    assert DOWNSTREAM.send_attempts == 1


async def test_a_quiet_run_stays_paused_until_nudged(
    harness: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """The control for the test above: with an hour between re-reads, a silent settlement waits."""
    handle, key = await paused_on_unknown_credit(harness, "pause-quiet")
    await silence_reconciler(harness.client, key)
    await settle_behind_the_runs_back(harness.ledger, key)
    await asyncio.sleep(3)
    assert (await handle.query(AgentRunWorkflow.status)).phase == Phase.AWAITING_RECONCILIATION
    assert await attribute(handle, UNRESOLVED_KEYS) == [key]
    # A nudge (what the API's POST …/nudge sends) makes it read the ledger now.
    await handle.signal(AgentRunWorkflow.resolve, ResolveSignal(key=key, actor="operator:alice"))
    result = await asyncio.wait_for(handle.result(), 15)
    assert "cr_found" in result.final


async def test_a_reconciler_past_its_deadline_watches_the_ledger_and_clears_escalation(
    harness: Harness, temporal_env: WorkflowEnvironment
) -> None:
    handle, key = await paused_on_unknown_credit(harness, "pause-escalating")
    reconciler = temporal_env.client.get_workflow_handle(
        reconcile_workflow_id(key), result_type=ReconcileResult
    )

    async def escalated() -> bool:
        return await attribute(handle, ESCALATED_TO) == "billing-oncall"

    await eventually(escalated, "the run to show the escalation")
    assert await attribute(reconciler, UNRESOLVED_KEYS) == [key]
    assert await attribute(reconciler, ESCALATED_TO) == "billing-oncall"

    await settle_behind_the_runs_back(harness.ledger, key)
    result = await asyncio.wait_for(handle.result(), 15)  # the reconciler told it
    assert "cr_found" in result.final
    assert await attribute(handle, ESCALATED_TO) is None
    assert await attribute(handle, UNRESOLVED_KEYS) is None
    settled = await asyncio.wait_for(reconciler.result(), 10)
    assert settled.status is Status.COMPLETED
    assert await attribute(reconciler, UNRESOLVED_KEYS) is None
    assert await attribute(reconciler, ESCALATED_TO) is None


async def test_a_run_failed_on_an_unknown_call_leaves_the_key_to_its_reconciler(
    harness: Harness, temporal_env: WorkflowEnvironment
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("fail-fast", ORDER)
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), 20)
    key = f"{handle.id}:call_1_0"
    assert await attribute(handle, UNRESOLVED_KEYS) is None  # a closed run waits for nothing
    reconciler = temporal_env.client.get_workflow_handle(
        reconcile_workflow_id(key), result_type=ReconcileResult
    )

    async def listed_by_reconciler() -> bool:  # its first workflow task may still be on its way
        return await attribute(reconciler, UNRESOLVED_KEYS) == [key]

    await eventually(listed_by_reconciler, "the reconciler to list the key")
    await settle_behind_the_runs_back(harness.ledger, key)
    assert (await asyncio.wait_for(reconciler.result(), 15)).status is Status.COMPLETED
    assert await attribute(reconciler, UNRESOLVED_KEYS) is None


# -- the resolve Update --------------------------------------------------------------------------------


async def test_resolve_update_answers_with_the_ledgers_decision(harness: Harness) -> None:
    handle, key = await paused_on_unknown_credit(harness, "pause-quiet")
    answer = await handle.execute_update(
        "resolve",
        ResolveSignal(
            key=key,
            status="completed",
            reason="credit seen in billing",
            actor="bob",
            result={"credit_id": "cr_b"},
        ),
        result_type=SettleResult,
    )
    assert answer.refused is None
    assert answer.outcome.status is Status.COMPLETED
    assert answer.outcome.value == {"credit_id": "cr_b"}
    assert "cr_b" in (await asyncio.wait_for(handle.result(), 15)).final


async def test_a_late_resolve_update_is_told_who_decided_first(harness: Harness) -> None:
    handle, key = await paused_on_unknown_credit(harness, "pause-quiet")
    await silence_reconciler(harness.client, key)
    await settle_behind_the_runs_back(harness.ledger, key)
    answer = await handle.execute_update(
        "resolve",
        ResolveSignal(key=key, status="failed", reason="not in billing", actor="bob"),
        result_type=SettleResult,
    )
    assert answer.refused is not None and "operator:alice" in answer.refused
    assert answer.outcome.status is Status.COMPLETED  # the first decision stands, and the run acts on it
    assert "cr_found" in (await asyncio.wait_for(handle.result(), 15)).final
    assert (await harness.ledger.get(key, with_events=False)).settled_by == "operator:alice"


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"status": "completed"}, "needs a reason"),
        ({"status": "completed", "reason": "   "}, "needs a reason"),
        ({"key": "someone-else:call_1_0", "status": "failed", "reason": "x"}, "not a write call of this run"),
        ({"status": "failed", "reason": "x", "actor": " "}, "needs an actor"),
    ],
)
async def test_bad_resolve_updates_are_refused_before_they_enter_history(
    harness: Harness, request_fields: dict[str, Any], message: str
) -> None:
    handle, key = await paused_on_unknown_credit(harness, "pause-quiet")
    request = ResolveSignal.model_validate({"key": key, **request_fields})
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update("resolve", request, result_type=SettleResult)
    assert message in str(refused.value.cause)
    history = await handle.fetch_history()
    assert not [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert (await harness.ledger.get(key, with_events=False)).status is Status.INDETERMINATE
    assert (await handle.query(AgentRunWorkflow.status)).phase == Phase.AWAITING_RECONCILIATION


# -- the operator API's nudge ---------------------------------------------------------------------------


@pytest.fixture
async def api(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[OperatorApi]:
    DOWNSTREAM.reset()
    async with serving_api(temporal_env.client, ledger, _registry()) as served:
        yield served


async def test_the_api_nudges_a_run_to_read_the_ledger(api: OperatorApi) -> None:
    handle, key = await paused_on_unknown_credit(api.runs, "pause-quiet")
    await silence_reconciler(api.runs.client, key)
    await settle_behind_the_runs_back(api.ledger, key)
    async with await api.as_operator() as alice:
        response = await alice.post(f"/v1/tool-executions/{key}/nudge")
        assert response.status_code == 200, response.text
        assert response.json()["run_signalled"] is True
        assert response.json()["execution"]["status"] == "completed"
        assert "cr_found" in (await asyncio.wait_for(handle.result(), 15)).final
        async with await api.as_operator(tenant="globex") as other:
            assert (await other.post(f"/v1/tool-executions/{key}/nudge")).status_code == 404
        assert (await alice.post("/v1/tool-executions/no-such:call/nudge")).status_code == 404
