"""Operators' decisions in the ledger: leases, approvals, escalation, compensation, and tokens."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from onceflow.ledger import (
    AlreadySettledError,
    CallIdentity,
    FailureKind,
    InvalidTransitionError,
    Ledger,
    OperatorTokens,
    PayloadMismatchError,
    ReasonRequiredError,
    RecordNotFoundError,
    Reservation,
    SideEffect,
    Status,
    TokenNotFoundError,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


def new_call(tenant: str = "t1", agent: str = "billing-assistant") -> CallIdentity:
    return CallIdentity(
        tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1", agent=agent
    )


async def reserve(
    ledger: Ledger,
    call: CallIdentity,
    *,
    owner: str = "worker-1",
    approval: bool = False,
    lease: timedelta | None = timedelta(minutes=5),
    arguments: dict[str, object] | None = None,
    tool: str = "issue_credit",
) -> Reservation:
    result = await ledger.reserve(
        call,
        tool_name=tool,
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS if arguments is None else arguments,
        owner=owner,
        approval=approval,
        lease=lease,
    )
    return result.outcome


# -- leases: "started, and its owner is gone" ---------------------------------------------------------


async def test_a_started_call_is_listed_and_settleable_only_after_its_lease_runs_out(ledger: Ledger) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    live, gone = new_call(tenant), new_call(tenant)
    await reserve(ledger, live, lease=timedelta(minutes=5))
    await reserve(ledger, gone, lease=timedelta(milliseconds=1))
    await asyncio.sleep(0.01)

    page = await ledger.list_unresolved(tenant)
    assert [r.key for r in page.records] == [gone.key]
    with pytest.raises(InvalidTransitionError):
        await ledger.settle(live.key, status=Status.FAILED, actor="op:alice", reason="stuck?")

    record = await ledger.settle(gone.key, status=Status.FAILED, actor="op:alice", reason="not in billing")
    assert record.status is Status.FAILED
    assert record.failure_kind is FailureKind.NOT_APPLIED
    events = (await ledger.get(gone.key)).events
    assert (events[-1].kind, events[-1].from_status, events[-1].actor) == (
        "settled",
        Status.STARTED,
        "op:alice",
    )


async def test_the_list_filters_by_tool_agent_and_escalation(ledger: Ledger) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    credit = new_call(tenant, agent="a1")
    refund = new_call(tenant, agent="a2")
    for call, tool in ((credit, "issue_credit"), (refund, "issue_refund")):
        await reserve(ledger, call, tool=tool)
        await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    await ledger.escalate(refund.key, owner="billing-oncall", actor="reconciler", reason="deadline")

    async def keys(**filters: object) -> list[str]:
        page = await ledger.list_unresolved(tenant, **filters)  # type: ignore[arg-type]
        return [r.key for r in page.records]

    assert await keys() == [credit.key, refund.key]
    assert await keys(tool="issue_refund") == [refund.key]
    assert await keys(agent="a1") == [credit.key]
    assert await keys(escalated=True) == [refund.key]
    assert await keys(escalated=False) == [credit.key]
    assert await keys(statuses=[Status.AWAITING_APPROVAL]) == []


# -- approvals ------------------------------------------------------------------------------------------


async def test_an_approved_call_is_claimed_once_with_its_payload(ledger: Ledger) -> None:
    call = new_call()
    assert await reserve(ledger, call, approval=True) is Reservation.AWAITING_APPROVAL
    # Before approval, asking again changes nothing.
    assert await reserve(ledger, call, approval=True, owner="worker-2") is Reservation.AWAITING_APPROVAL

    approved = await ledger.approve(call.key, actor="op:alice", reason="customer confirmed", tenant="t1")
    assert (approved.status, approved.approved_by) == (Status.AWAITING_APPROVAL, "op:alice")

    # A changed payload cannot ride on the approval.
    with pytest.raises(PayloadMismatchError):
        await reserve(ledger, call, approval=True, arguments={**ARGUMENTS, "amount_cents": 99_999})

    results = await asyncio.gather(
        *(reserve(ledger, call, approval=True, owner=f"worker-{i}") for i in range(10))
    )
    assert sorted(results).count(Reservation.NEW) == 1
    assert set(results) == {Reservation.NEW, Reservation.IN_FLIGHT}
    record = await ledger.get(call.key)
    assert record.status is Status.STARTED
    assert [e.kind for e in record.events] == [
        "reserved",
        "approved",
        "payload_mismatch_refused",
        "dispatched",
    ]


async def test_deny_is_final_and_names_the_decider_to_a_late_approver(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, approval=True)
    denied = await ledger.deny(call.key, actor="op:bob", reason="amount looks wrong")
    assert (denied.status, denied.failure_kind, denied.settled_by) == (
        Status.DENIED,
        FailureKind.DENIED,
        "op:bob",
    )

    with pytest.raises(AlreadySettledError) as caught:
        await ledger.approve(call.key, actor="op:alice")
    assert caught.value.settled_by == "op:bob"
    assert await reserve(ledger, call, approval=True) is Reservation.SETTLED


async def test_approve_and_deny_race_one_wins(ledger: Ledger) -> None:
    for _ in range(20):
        call = new_call()
        await reserve(ledger, call, approval=True)
        outcomes = await asyncio.gather(
            ledger.approve(call.key, actor="op:alice"),
            ledger.deny(call.key, actor="op:bob", reason="no"),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert len(errors) == 1 and isinstance(errors[0], AlreadySettledError)
        record = await ledger.get(call.key)
        assert [e.kind for e in record.events].count("approved") + [e.kind for e in record.events].count(
            "denied"
        ) == 1


async def test_approval_needs_the_right_tenant_and_deny_needs_a_reason(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call, approval=True)
    with pytest.raises(RecordNotFoundError):
        await ledger.approve(call.key, actor="op:mallory", tenant="other")
    with pytest.raises(ReasonRequiredError):
        await ledger.deny(call.key, actor="op:bob", reason="  ")
    record = await ledger.get(call.key)
    assert (record.status, record.approved_by) == (Status.AWAITING_APPROVAL, None)
    assert [e.kind for e in record.events] == ["reserved"]


# -- escalation and compensation --------------------------------------------------------------------


async def test_escalation_names_an_owner_once_and_leaves_the_outcome(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call)
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    first = await ledger.escalate(call.key, owner="billing-oncall", actor="reconciler", reason="deadline")
    again = await ledger.escalate(call.key, owner="someone-else", actor="reconciler", reason="deadline")
    assert (first.status, first.escalated_to) == (Status.INDETERMINATE, "billing-oncall")
    assert again.escalated_to == "billing-oncall" and again.escalated_at == first.escalated_at
    kinds = [e.kind for e in (await ledger.get(call.key)).events]
    assert kinds.count("escalated") == 1


async def test_only_a_completed_call_becomes_compensated(ledger: Ledger) -> None:
    call = new_call()
    await reserve(ledger, call)
    with pytest.raises(InvalidTransitionError):
        await ledger.mark_compensated(call.key, actor="op:alice", reason="refund")
    await ledger.complete(call.key, owner="worker-1", result={"credit_id": "cr_1"})
    record = await ledger.mark_compensated(
        call.key, actor="op:alice", reason="refund", evidence={"void": "v1"}
    )
    assert (record.status, record.result) == (Status.COMPENSATED, {"credit_id": "cr_1"})
    again = await ledger.mark_compensated(call.key, actor="op:alice", reason="refund")
    assert again.status is Status.COMPENSATED
    kinds = [e.kind for e in (await ledger.get(call.key)).events]
    assert kinds == ["reserved", "completed", "compensated"]


# -- tokens ------------------------------------------------------------------------------------------


async def test_tokens_are_stored_hashed_and_stop_working_when_revoked(ledger: Ledger) -> None:
    tokens = OperatorTokens(ledger)
    created, secret = await tokens.create(tenant="acme", operator="alice")
    assert secret.startswith("oft_") and len(secret) > 40

    found = await tokens.authenticate(secret)
    assert found is not None and (found.tenant, found.operator, found.id) == ("acme", "alice", created.id)
    assert await tokens.authenticate(secret + "x") is None
    assert await tokens.authenticate("not-a-token") is None
    async with ledger.connection("test") as conn:
        stored = await conn.fetchval("SELECT token_sha256 FROM operator_tokens WHERE id = $1", created.id)
        assert secret not in str(await conn.fetch("SELECT * FROM operator_tokens"))
    assert stored and len(stored) == 64

    revoked = await tokens.revoke(created.id)
    assert revoked.revoked_at is not None
    assert await tokens.authenticate(secret) is None
    assert (await tokens.revoke(created.id)).revoked_at == revoked.revoked_at
    with pytest.raises(TokenNotFoundError):
        await tokens.revoke("tok_missing")
    with pytest.raises(ReasonRequiredError):
        await tokens.create(tenant="", operator="alice")
