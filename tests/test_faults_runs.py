"""Faults that come from people and from history, not from machines dying (issue #6, "more faults").

On the session's Temporal dev server and a fresh PostgreSQL ledger, with the example billing service
in a process of its own, honouring no idempotency key and recording every request it receives per
key, and a worker in this process:

- a Temporal reset of several finished runs back to their first workflow task: the reruns ask the
  ledger, get the recorded results, and nobody asks the billing service again;
- two operators racing to resolve the same unknown call, twenty times over: one wins, the loser is
  refused, the run acts on the winner's answer;
- a zombie attempt (its tool outlived its own timeout and Temporal's) finishing after its call was
  settled: its outcome is appended as `outcome_ignored` and the settled record does not change.

Covered elsewhere and not repeated here: one reset of one run with an in-process downstream
(test_agent_run_faults), two resolve signals at once from one client, once (test_agent_run), fifty
concurrent `Ledger.settle` races and a late owner outcome at the ledger level (test_ledger_settle).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.drill.sends import Reruns, Sends, judge_sends, reruns_by_key
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import AlreadySettledError, FailureKind, Ledger, Status, ToolExecutionRecord
from onceflow.runtime.agents import AgentRegistry, build_registry
from onceflow.sdk.payloads import AgentRunResult, Phase, ResolveSignal, SettleInput, SettleResult, ToolOutcome
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.fault_tools import AFTER_ANSWER, BEFORE_SEND, ZOMBIES
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.proxy import DroppingProxy
from tests.support.waiting import eventually
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


async def paused_on(handle: RunHandle, ledger: Ledger, key: str) -> bool:
    record = await ledger.find(key)
    if record is None or record.status is not Status.INDETERMINATE:
        return False
    status = await handle.query(AgentRunWorkflow.status)
    return status.phase is Phase.AWAITING_RECONCILIATION and [p.key for p in status.pending] == [key]


def without_events(record: ToolExecutionRecord) -> dict[str, Any]:
    return record.model_dump(exclude={"events"})


async def credit_requests(billing: BillingClient, keys: list[str]) -> dict[str, int]:
    """Credit requests billing received per key, counted on arrival, whatever it made of them."""
    received = await billing.received_counts()
    return {key: received.count(key) for key in keys}


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
