"""Every event says where it came from, and only the operator API may write an `operator:` actor."""

from __future__ import annotations

import uuid

import pytest

from onceflow.ledger import (
    CallIdentity,
    EventSource,
    Ledger,
    ProvenanceError,
    SideEffect,
    Status,
    unauthenticated_actor,
)


@pytest.mark.parametrize(
    ("source", "claimed", "recorded"),
    [
        (EventSource.SIGNAL, "alice", "signal:alice"),
        (EventSource.SIGNAL, "operator:alice", "signal:alice"),
        (EventSource.SIGNAL, " operator:alice ", "signal:alice"),
        (EventSource.SIGNAL, "signal", "signal"),
        (EventSource.SIGNAL, "", "signal"),
        (EventSource.SIGNAL, "reconciler", "signal:reconciler"),
        (EventSource.UPDATE, "operator:bob", "update:bob"),
        (EventSource.UPDATE, "signal:bob", "update:bob"),
    ],
)
def test_an_unauthenticated_name_is_recorded_under_the_door_it_came_through(
    source: EventSource, claimed: str, recorded: str
) -> None:
    assert unauthenticated_actor(source, claimed) == recorded


async def test_only_the_api_may_record_an_operator_and_a_refusal_changes_nothing(ledger: Ledger) -> None:
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    await ledger.reserve(
        call, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments={"a": 1}, owner="w1"
    )
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    before = await ledger.get(call.key)

    for source in (EventSource.SIGNAL, EventSource.UPDATE, EventSource.RECONCILER, EventSource.OWNER):
        with pytest.raises(ProvenanceError, match="only the operator API"):
            await ledger.settle(
                call.key, status=Status.FAILED, actor="operator:alice", reason="forged", source=source
            )
    assert await ledger.get(call.key) == before

    record = await ledger.settle(
        call.key, status=Status.FAILED, actor="signal:alice", reason="typed", source=EventSource.SIGNAL
    )
    assert record.settled_by == "signal:alice"
    events = (await ledger.get(call.key)).events
    assert [(e.kind, e.source) for e in events] == [
        ("reserved", EventSource.OWNER),
        ("indeterminate", EventSource.INSPECTOR),
        ("settled", EventSource.SIGNAL),
    ]
