"""Faults that come from people (issue #6, "more faults"): two operators racing to resolve the same
unknown call, twenty times over: one wins, the loser is refused, the run acts on the winner's answer.

On the session's Temporal dev server and a fresh PostgreSQL ledger, with the example billing service
in a process of its own, honouring no idempotency key and recording every request it receives per
key, and a worker in this process. Faults that come from history (resets, a zombie attempt) are in
test_faults_runs; two resolve signals at once from one client, once, in test_agent_run; fifty
concurrent `Ledger.settle` races at the ledger level in test_ledger_settle.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import AlreadySettledError, FailureKind, Ledger, Status, ToolExecutionRecord
from onceflow.sdk.payloads import AgentRunResult, Phase, ResolveSignal, SettleInput, SettleResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.fault_runs import RunHandle, account_of, credit_requests, harness, new_order, order_input
from tests.support.history import activity_runs, history_events
from tests.support.waiting import eventually
from tests.workflow_harness import Harness

__all__ = ["harness"]  # the fixture, used by name


async def paused_on(handle: RunHandle, ledger: Ledger, key: str) -> bool:
    record = await ledger.find(key)
    if record is None or record.status is not Status.INDETERMINATE:
        return False
    status = await handle.query(AgentRunWorkflow.status)
    return status.phase is Phase.AWAITING_RECONCILIATION and [p.key for p in status.pending] == [key]


def _settle_result(client: Client, closed: Any) -> SettleResult:
    """What a `settle_call` step (one resolve signal's ledger step) answered."""
    assert closed is not None and closed.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    payload = closed.activity_task_completed_event_attributes.result.payloads[0]
    result: SettleResult = client.data_converter.payload_converter.from_payload(payload, SettleResult)
    return result


# -- 6. two operators racing to resolve the same unknown call --------------------------------------------


async def _paused_runs(harness: Harness, billing: BillingClient, count: int) -> list[tuple[RunHandle, str]]:
    """`count` runs, each paused on a credit that was applied but whose answer was lost."""
    orders = [new_order() for _ in range(count)]
    for order in orders:
        # The service applies the credit, then drops the connection: the call is unknown at once.
        await billing.set_account_fault(account_of(order), "drop", times=1)
    handles = await asyncio.gather(*(harness.start("credit-by-operator", order_input(o)) for o in orders))
    runs = [(h, f"{h.id}:call_1_0") for h in handles]

    async def all_paused() -> bool:
        return all(await asyncio.gather(*(paused_on(h, harness.ledger, k) for h, k in runs)))

    await eventually(all_paused, f"{count} runs to pause on an unknown credit")
    effects = await billing.effects()
    assert [effects.count(key) for _, key in runs] == [1] * count
    assert await credit_requests(billing, [key for _, key in runs]) == {key: 1 for _, key in runs}
    return runs


async def _second_client(temporal_env: WorkflowEnvironment) -> Client:
    """Another operator's own connection to Temporal."""
    first = temporal_env.client
    return await Client.connect(
        first.service_client.config.target_host,
        namespace=first.namespace,
        data_converter=pydantic_data_converter,
    )


def _resolves(key: str, credit: dict[str, Any] | None) -> tuple[ResolveSignal, ResolveSignal]:
    alice = ResolveSignal(
        key=key,
        status="completed",
        reason="found the credit in the billing console",
        actor="op-alice",
        evidence={"credit_id": (credit or {}).get("credit_id")},
        result=credit,
    )
    bob = ResolveSignal(key=key, status="failed", reason="no credit on the statement", actor="op-bob")
    return alice, bob


async def _resolve_attempts(client: Client, workflow_id: str) -> dict[str, HistoryEvent]:
    """Per actor: how that actor's `resolve` signal's ledger step ended, from the run's history."""
    events = await history_events(client, workflow_id)
    actors = {
        e.event_id: client.data_converter.payload_converter.from_payload(
            e.activity_task_scheduled_event_attributes.input.payloads[0], SettleInput
        ).signal.actor
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "settle_call"
    }
    return {
        actors[run.scheduled_event_id]: run.closed
        for run in activity_runs(events)
        if run.scheduled_event_id in actors and run.closed is not None
    }


def _check_loser_refused(client: Client, closed: HistoryEvent, record: ToolExecutionRecord) -> None:
    """The losing attempt reached the ledger and was refused: it was handed the winner's answer and
    told it was refused, naming the winner."""
    settled = _settle_result(client, closed)
    assert settled.outcome.status == record.status
    assert record.settled_by is not None
    assert settled.refused is not None and record.settled_by in settled.refused


def _check_run_acted_on(record: ToolExecutionRecord, result: AgentRunResult, credit: dict[str, Any]) -> None:
    settles = [e for e in record.events if e.kind == "settled"]
    assert len(settles) == 1, record.events
    assert settles[0].actor == record.settled_by
    # The model heard one answer for the call, the winner's, and then gave its final answer.
    assert result.turns == 3
    assert result.calls[-1].key == record.key
    assert result.calls[-1].status == record.status.value
    # Resolve signals are recorded as `signal:<name>`; Bob may also settle the ledger directly.
    if record.settled_by == "signal:op-alice":
        assert record.status is Status.COMPLETED
        assert record.result == credit
        assert credit["credit_id"] in result.final
    else:
        assert record.settled_by in ("op-bob", "signal:op-bob")
        assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.NOT_APPLIED)
        assert credit["credit_id"] not in result.final


async def test_two_operators_racing_resolve_signals_one_wins_and_the_run_acts_on_it(
    harness: Harness, billing: BillingClient, temporal_env: WorkflowEnvironment
) -> None:
    runs = await _paused_runs(harness, billing, 20)
    bobs_client = await _second_client(temporal_env)
    winners: Counter[str | None] = Counter()
    for handle, key in runs:
        credit = await billing.find_credit(key)
        assert credit is not None
        alice, bob = _resolves(key, credit)
        await asyncio.gather(
            handle.signal(AgentRunWorkflow.resolve, alice),
            bobs_client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id).signal(
                AgentRunWorkflow.resolve, bob
            ),
        )
        result = await asyncio.wait_for(handle.result(), 20)
        record = await harness.ledger.get(key)
        _check_run_acted_on(record, result, credit)
        winners[record.settled_by] += 1
        # Both attempts reached the ledger: the winner's settled the call, the loser's was refused.
        attempts = await _resolve_attempts(harness.client, handle.id)
        assert record.settled_by is not None
        signalled_by = record.settled_by.removeprefix("signal:")  # the name the signal carried
        loser = "op-bob" if signalled_by == "op-alice" else "op-alice"
        winner = _settle_result(harness.client, attempts[signalled_by])
        assert (winner.outcome.status, winner.refused) == (record.status, None)
        _check_loser_refused(harness.client, attempts[loser], record)
        # Whoever lost, nothing was sent again.
        assert (await billing.received(key)).received == 1
        assert (await billing.effects()).count(key) == 1
    assert sum(winners.values()) == len(runs)


async def test_an_operator_signal_racing_a_direct_settle_one_wins_and_the_run_acts_on_it(
    harness: Harness, billing: BillingClient
) -> None:
    # Alice resolves through the run; Bob settles the ledger directly, as the operator API does.
    runs = await _paused_runs(harness, billing, 10)
    for handle, key in runs:
        credit = await billing.find_credit(key)
        assert credit is not None
        alice, bob = _resolves(key, credit)
        _, bobs = await asyncio.gather(
            handle.signal(AgentRunWorkflow.resolve, alice),
            harness.ledger.settle(key, status=Status.FAILED, actor=bob.actor, reason=bob.reason or ""),
            return_exceptions=True,
        )
        result = await asyncio.wait_for(handle.result(), 20)
        record = await harness.ledger.get(key)
        _check_run_acted_on(record, result, credit)
        if record.settled_by == "signal:op-alice":
            # The direct loser hears who won and when.
            assert isinstance(bobs, AlreadySettledError), bobs
            assert (bobs.settled_by, bobs.settled_at) == ("signal:op-alice", record.settled_at)
        else:
            assert isinstance(bobs, ToolExecutionRecord), bobs
        assert (await billing.received(key)).received == 1
        assert (await billing.effects()).count(key) == 1


async def test_the_losing_resolve_signal_is_shown_as_refused_naming_the_winner(
    harness: Harness, billing: BillingClient, temporal_env: WorkflowEnvironment
) -> None:
    [(handle, key)] = await _paused_runs(harness, billing, 1)
    credit = await billing.find_credit(key)
    alice, bob = _resolves(key, credit)
    bobs_client = await _second_client(temporal_env)
    await asyncio.gather(
        handle.signal(AgentRunWorkflow.resolve, alice),
        bobs_client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id).signal(
            AgentRunWorkflow.resolve, bob
        ),
    )
    await asyncio.wait_for(handle.result(), 20)
    record = await harness.ledger.get(key)
    loser = "op-bob" if record.settled_by == "signal:op-alice" else "op-alice"
    refused = (await handle.query(AgentRunWorkflow.status)).last_resolve_error
    assert refused is not None, f"{loser}'s resolve left no trace on the run"
    assert record.settled_by is not None and record.settled_by in refused
