"""What the ledger's decision paths record, read back through this process's Prometheus registry,
and the queue's figures as the operator API's gauges read them (one query, real PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from onceflow.ledger import (
    CallIdentity,
    EventSource,
    Guard,
    Ledger,
    OutcomeIgnoredError,
    Reservation,
    SideEffect,
    Status,
)
from onceflow.ledger.queue import queue_figures
from onceflow.runtime.metrics_export import configure_metrics

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    """This process's registry (the first configuration wins; an in-process API makes the same)."""
    found = configure_metrics("onceflow-tests", serve_prometheus=False)
    assert found is not None
    return found


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    text = generate_latest(registry).decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


async def unknown_call(ledger: Ledger, *, tool: str, agent: str = "agent-a", tenant: str = "t1") -> str:
    call = CallIdentity(
        tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1", agent=agent
    )
    await ledger.reserve(
        call, tool_name=tool, side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner="w-1"
    )
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="activity timed out")
    return call.key


async def test_a_contradicting_late_outcome_counts_a_conflict_and_the_settle_its_wait(
    ledger: Ledger, registry: CollectorRegistry
) -> None:
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    key = await unknown_call(ledger, tool=tool)
    settled = "onceflow_call_unresolved_duration_seconds_count"
    assert value(registry, settled, tool=tool) == 0

    await ledger.settle(
        key, status=Status.FAILED, actor="operator:alice", reason="not found", source=EventSource.API
    )
    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="w-1", result={"credit_id": "cr_late"})

    assert value(registry, settled, tool=tool, settled_by="operator", from_status="indeterminate") == 1
    assert value(registry, "onceflow_conflict_flagged_total", tool=tool, reported_by="owner") == 1


async def test_a_late_answer_from_the_owner_settles_as_owner(
    ledger: Ledger, registry: CollectorRegistry
) -> None:
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    key = await unknown_call(ledger, tool=tool)
    await ledger.complete(key, owner="w-1", result={"ok": True})
    assert (
        value(registry, "onceflow_call_unresolved_duration_seconds_count", tool=tool, settled_by="owner") == 1
    )


async def test_escalating_counts_once(ledger: Ledger, registry: CollectorRegistry) -> None:
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    key = await unknown_call(ledger, tool=tool)
    for _ in range(2):
        await ledger.escalate(key, owner="oncall", actor="reconciler", reason="deadline passed")
    assert value(registry, "onceflow_call_escalated_total", tool=tool) == 1


async def test_a_repeated_reservation_is_a_replay(ledger: Ledger, registry: CollectorRegistry) -> None:
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    for _ in range(2):
        await ledger.reserve(
            call, tool_name=tool, side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner="w-1"
        )
    assert value(registry, "onceflow_call_replayed_total", tool=tool, status="started") == 1


async def test_queue_figures_count_unresolved_overdue_and_conflicts_per_tenant_and_tool(
    ledger: Ledger,
) -> None:
    await unknown_call(ledger, tool="issue_credit", agent="quick")
    await unknown_call(ledger, tool="issue_credit", agent="patient")
    await unknown_call(ledger, tool="issue_credit", agent="patient", tenant="t2")
    conflicted = await unknown_call(ledger, tool="void_credit", agent="patient")
    await ledger.settle(conflicted, status=Status.FAILED, actor="operator:alice", reason="not found")
    await ledger.record_late_outcome(conflicted, actor="reconciler", status=Status.COMPLETED)

    figures = await queue_figures(ledger, {"quick": 0.0, "patient": 3600.0}, default=3600.0)

    by = {(f.tenant, f.tool, f.status): f for f in figures}
    assert set(by) == {
        ("t1", "issue_credit", "indeterminate"),
        ("t2", "issue_credit", "indeterminate"),
        ("t1", "void_credit", "conflict"),
    }
    t1 = by["t1", "issue_credit", "indeterminate"]
    assert (t1.calls, t1.overdue) == (2, 1)  # only the `quick` agent's deadline (0 s) has passed
    assert t1.oldest_seconds > 0
    assert (
        by["t2", "issue_credit", "indeterminate"].calls,
        by["t2", "issue_credit", "indeterminate"].overdue,
    ) == (1, 0)
    assert by["t1", "void_credit", "conflict"].calls == 1

    # An agent nobody configured gets the default deadline.
    assert all(f.overdue == 0 for f in await queue_figures(ledger, {}, default=3600.0))


async def test_a_held_call_released_as_a_reuse_is_settled_by_the_guard(
    ledger: Ledger, registry: CollectorRegistry
) -> None:
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    run = f"run-{uuid.uuid4().hex[:8]}"

    async def reserve(call_id: str) -> Reservation:
        result = await ledger.reserve(
            CallIdentity(tenant="t1", run_id=run, tool_call_id=call_id),
            tool_name=tool,
            side_effect=SideEffect.EXTERNAL,
            arguments=ARGUMENTS,
            owner=f"owner-{call_id}",
            guard=Guard(intent="reuse"),
        )
        return result.outcome

    assert await reserve("c1") is Reservation.NEW
    await ledger.mark_indeterminate(f"{run}:c1", actor="inspector", reason="timed out")
    assert await reserve("c2") is Reservation.HELD
    assert await reserve("c2") is Reservation.HELD  # still waiting: no second verdict
    await ledger.settle(
        f"{run}:c1",
        status=Status.COMPLETED,
        actor="reconciler",
        reason="found",
        source=EventSource.RECONCILER,
    )
    assert await reserve("c2") is Reservation.REUSED

    assert value(registry, "onceflow_guard_verdict_total", tool=tool, verdict="hold") == 1
    assert value(registry, "onceflow_guard_verdict_total", tool=tool, verdict="reuse") == 1
    settled = "onceflow_call_unresolved_duration_seconds_count"
    assert value(registry, settled, tool=tool, settled_by="guard", from_status="held") == 1
    assert value(registry, settled, tool=tool, settled_by="hook", from_status="indeterminate") == 1
