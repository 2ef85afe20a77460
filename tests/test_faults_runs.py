"""Faults that come from history, not from machines dying (issue #6, "more faults").

On the session's Temporal dev server and a fresh PostgreSQL ledger, with the example billing service
in a process of its own, honouring no idempotency key and recording every request it receives per
key, and a worker in this process:

- a Temporal reset of several finished runs back to their first workflow task: the reruns ask the
  ledger, get the recorded results, and nobody asks the billing service again;
- a zombie attempt (its tool outlived its own timeout and Temporal's) finishing after its call was
  settled: its outcome is appended as `outcome_ignored` and the settled record does not change.

Faults that come from people, two operators racing to resolve the same unknown call, are in
test_faults_operators. Covered elsewhere and not repeated here: one reset of one run with an
in-process downstream (test_agent_run_faults), two resolve signals at once from one client, once
(test_agent_run), fifty concurrent `Ledger.settle` races and a late owner outcome at the ledger level
(test_ledger_settle).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from onceflow.drill.sends import Reruns, Sends, judge_sends, reruns_by_key
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import FailureKind, Status, ToolExecutionRecord
from onceflow.sdk.payloads import ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.fault_runs import RunHandle, account_of, credit_requests, harness, new_order, order_input
from tests.support.fault_tools import AFTER_ANSWER, BEFORE_SEND, ZOMBIES
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.waiting import eventually
from tests.workflow_harness import Harness

__all__ = ["harness"]  # the fixture, used by name


def without_events(record: ToolExecutionRecord) -> dict[str, Any]:
    return record.model_dump(exclude={"events"})


async def order_reads(billing: BillingClient, orders: list[str]) -> dict[str, int]:
    """Order lookups billing received per order."""
    return {order: (await billing.received_counts("GET", f"/orders/{order}")).total for order in orders}


# -- 5. a Temporal reset of finished runs to before their writes ---------------------------------------


async def test_resetting_finished_runs_to_their_first_workflow_task_sends_nothing_again(
    harness: Harness, billing: BillingClient
) -> None:
    client = harness.client
    orders = [new_order() for _ in range(4)]
    handles = [await harness.start("two-credits", order_input(order)) for order in orders]
    firsts = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 30)
    keys = {h.id: [f"{h.id}:call_1_0", f"{h.id}:call_1_1"] for h in handles}
    every_key = [k for pair in keys.values() for k in pair]
    recorded = {key: await harness.ledger.get(key) for key in every_key}
    assert all(r.status is Status.COMPLETED for r in recorded.values())
    effects = await billing.effects()
    assert {key: effects.count(key) for key in every_key} == dict.fromkeys(every_key, 1)
    assert await credit_requests(billing, every_key) == dict.fromkeys(every_key, 1)
    assert await order_reads(billing, orders) == dict.fromkeys(orders, 1)

    # Reset each finished run to its very first workflow task: before every activity it ran.
    resets: list[RunHandle] = []
    for handle in handles:
        first_run_id = handle.result_run_id
        assert first_run_id is not None
        events = await history_events(client, handle.id, first_run_id)
        reset_point = workflow_task_completed_after(events, 0)
        assert reset_point < min(r.scheduled_event_id for r in activity_runs(events))
        new_run_id = await reset_run(
            client,
            handle.id,
            first_run_id,
            reset_point,
            "test: run it all again from the first workflow task",
        )
        assert new_run_id != first_run_id
        resets.append(client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run_id))
    seconds = await asyncio.wait_for(asyncio.gather(*(h.result() for h in resets)), 30)

    # Nobody asked the billing service for a credit again; the reads did run again.
    assert await credit_requests(billing, every_key) == dict.fromkeys(every_key, 1)
    assert await order_reads(billing, orders) == dict.fromkeys(orders, 2)
    effects = await billing.effects()
    assert {key: effects.count(key) for key in every_key} == dict.fromkeys(every_key, 1)
    for first, second, reset in zip(firsts, seconds, resets, strict=True):
        assert second.final == first.final
        assert [c.key for c in second.calls] == [c.key for c in first.calls]
        assert [c.status for c in second.calls] == ["ok", "completed", "completed"]
        assert reset.run_id is not None
        writes = [
            r
            for r in activity_runs(await history_events(client, reset.id, reset.run_id))
            if r.activity_type == "run_write_tool"
        ]
        assert len(writes) == 2
        for write, key in zip(writes, keys[reset.id], strict=True):
            outcome = _completed_outcome(client, write.closed)
            assert (outcome.key, outcome.status, outcome.replayed) == (key, Status.COMPLETED, True)
            assert outcome.value == recorded[key].result
    for key, before in recorded.items():
        after = await harness.ledger.get(key)
        assert without_events(after) == without_events(before)
        assert after.events[: len(before.events)] == before.events
        assert all(e.to_status is None for e in after.events[len(before.events) :])


async def test_a_reset_resends_only_the_call_that_was_not_attempted_and_the_count_allows_just_that(
    harness: Harness, billing: BillingClient
) -> None:
    # Billing refuses the first credit at the door (423): the ledger says failed, not attempted.
    order = new_order()
    await billing.set_account_fault(account_of(order), "locked", times=1)
    handle = await harness.start("credit-by-operator", order_input(order))
    await asyncio.wait_for(handle.result(), 30)
    key = f"{handle.id}:call_1_0"
    first = await harness.ledger.get(key)
    assert (first.status, first.failure_kind, first.attempt) == (Status.FAILED, FailureKind.NOT_ATTEMPTED, 1)

    # A reset replays the run: the same call, the same key, reserved again out of `failed`.
    first_run_id = handle.result_run_id
    assert first_run_id is not None
    events = await history_events(harness.client, handle.id, first_run_id)
    new_run_id = await reset_run(
        harness.client, handle.id, first_run_id, workflow_task_completed_after(events, 0), "test: again"
    )
    again = harness.client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run_id)
    await asyncio.wait_for(again.result(), 30)
    record = await harness.ledger.get(key)
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)

    # Billing received the key twice, refused then applied; the drill's rule allows exactly that.
    sent = [(r.outcome, r.status_code) for r in (await billing.received(key)).requests]
    assert sent == [("refused", 423), ("applied", 201)]
    history = [
        {
            "key": key,
            "kind": e.kind,
            "from_status": e.from_status,
            "to_status": e.to_status,
            "reason": e.reason,
        }
        for e in record.events
    ]
    reruns = reruns_by_key(history)
    assert reruns == {key: Reruns(after_not_attempted=1)}
    assert judge_sends(len(sent), reruns[key]) == Sends(received=2, legit_resends=1, extra=0)
    # One more request would be a key sent twice.
    assert judge_sends(3, reruns[key]).extra == 1


def _completed_outcome(client: Client, closed: Any) -> ToolOutcome:
    assert closed is not None and closed.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    payload = closed.activity_task_completed_event_attributes.result.payloads[0]
    outcome: ToolOutcome = client.data_converter.payload_converter.from_payload(payload, ToolOutcome)
    return outcome


# -- 7. a late completion from a zombie attempt after its call was settled ---------------------------------


@pytest.mark.parametrize(
    ("point", "settled_as", "reported"),
    [
        # The credit landed; the zombie holds the answer while the reconciler finds the credit.
        (AFTER_ANSWER, Status.COMPLETED, "completed"),
        # Nothing was sent; the reconciler fences the key, then the zombie sends and is refused.
        (BEFORE_SEND, Status.FAILED, "failed"),
    ],
)
async def test_a_zombie_attempts_outcome_after_its_call_was_settled_is_recorded_and_ignored(
    harness: Harness, billing: BillingClient, point: str, settled_as: Status, reported: str
) -> None:
    order = new_order()
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    key = f"{run_id}:call_1_0"
    ZOMBIES.arm(key, point)
    try:
        handle = await harness.start("credit-zombie", order_input(order), run_id=run_id)
        await asyncio.wait_for(ZOMBIES.wait_held(key), 20)
        # Temporal gives up on the attempt (tool timeout + margin), the ledger calls the call
        # unknown, the reconcile hook settles it and the run finishes, all while the zombie lingers.
        result = await asyncio.wait_for(handle.result(), 30)
        settled = await harness.ledger.get(key)
        assert settled.status is settled_as
        assert settled.settled_by == "reconciler"
        assert [e.to_status for e in settled.events if e.to_status] == [
            Status.STARTED,
            Status.INDETERMINATE,
            settled_as,
        ]
        assert result.calls[-1].status == settled_as.value
        writes = [
            r
            for r in activity_runs(await history_events(harness.client, handle.id))
            if r.activity_type == "run_write_tool"
        ]
        assert [w.closed.event_type for w in writes if w.closed] == [
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
        ]
        effects_when_settled = (await billing.effects()).count(key)

        ZOMBIES.release(key)

        async def zombie_reported() -> bool:
            return any(e.kind == "outcome_ignored" for e in (await harness.ledger.get(key)).events)

        await eventually(zombie_reported, "the zombie's outcome to reach the ledger")
    finally:
        ZOMBIES.release(key)

    after = await harness.ledger.get(key)
    assert without_events(after) == without_events(settled)
    assert after.events[: len(settled.events)] == settled.events
    [ignored] = after.events[len(settled.events) :]
    assert ignored.kind == "outcome_ignored"
    assert ignored.actor == settled.owner  # the zombie is the call's owner, and still too late
    assert (ignored.from_status, ignored.to_status) == (settled_as, None)
    assert ignored.detail["reported"] == reported
    assert ZOMBIES.cancellations_ignored[key] >= 1  # it really outlived its own timeout
    credit = await billing.find_credit(key)
    # The zombie's one request is the only one billing ever received for the key: applied before
    # the call was settled, or refused by the fence after it.
    sent = [(r.outcome, r.status_code) for r in (await billing.received(key)).requests]
    assert sent == ([("applied", 201)] if settled_as is Status.COMPLETED else [("refused", 409)])
    if settled_as is Status.COMPLETED:
        assert ignored.detail["result"] == settled.result == credit
        assert effects_when_settled == (await billing.effects()).count(key) == 1
    else:
        assert settled.failure_kind is FailureKind.NOT_APPLIED
        assert ignored.detail["failure_kind"] == FailureKind.REJECTED.value
        assert "fenced" in ignored.detail["error"]
        assert credit is None
        assert effects_when_settled == (await billing.effects()).count(key) == 0
