"""A ledger step whose commit went through but whose answer was lost is retried by Temporal: the
retry must find its own write and say "done", not record that it was ignored or refused."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from onceflow.ledger import (
    AlreadySettledError,
    CallIdentity,
    FailureKind,
    Ledger,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    SideEffect,
    Status,
)
from onceflow.ledger.records import RepeatedDecision
from tests.support.pg_proxy import AnswerDroppingProxy

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


async def started(ledger: Ledger, owner: str = "worker-1", approval: bool = False) -> str:
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner=owner,
        approval=approval,
    )
    return call.key


async def kinds(ledger: Ledger, key: str) -> list[str]:
    return [e.kind for e in (await ledger.get(key)).events]


async def test_complete_repeated_by_its_owner_returns_the_record_without_an_ignored_event(
    ledger: Ledger,
) -> None:
    key = await started(ledger)
    first = await ledger.complete(
        key, owner="worker-1", result={"credit_id": "cr_1"}, result_reference="cr_1"
    )
    again = await ledger.complete(
        key, owner="worker-1", result={"credit_id": "cr_1"}, result_reference="cr_1"
    )

    assert again == first
    assert await kinds(ledger, key) == ["reserved", "completed"]


async def test_fail_repeated_by_its_owner_returns_the_record_without_an_ignored_event(ledger: Ledger) -> None:
    key = await started(ledger)
    first = await ledger.fail(key, owner="worker-1", kind=FailureKind.NOT_ATTEMPTED, error="no session")
    again = await ledger.fail(key, owner="worker-1", kind=FailureKind.NOT_ATTEMPTED, error="no session")

    assert again == first
    assert await kinds(ledger, key) == ["reserved", "failed"]


async def test_a_late_outcome_applied_once_is_not_ignored_when_repeated(ledger: Ledger) -> None:
    key = await started(ledger)
    await ledger.mark_indeterminate(key, actor="worker-1", reason="no answer in 1s")
    first = await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_1"})
    again = await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_1"})

    assert again == first and first.status is Status.COMPLETED
    assert await kinds(ledger, key) == ["reserved", "indeterminate", "late_completed"]


async def test_a_different_outcome_from_the_owner_is_still_ignored(ledger: Ledger) -> None:
    key = await started(ledger)
    await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_1"})

    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_other"})
    with pytest.raises(OutcomeIgnoredError):
        await ledger.complete(key, owner="worker-2", result={"credit_id": "cr_1"})

    assert await kinds(ledger, key) == ["reserved", "completed", "outcome_ignored", "outcome_ignored"]


async def test_settle_repeated_by_the_same_actor_is_not_refused(ledger: Ledger) -> None:
    key = await started(ledger)
    await ledger.mark_indeterminate(key, actor="inspector", reason="timed out")
    decision = {
        "status": Status.COMPLETED,
        "actor": "operator:alice",
        "reason": "found it",
        "evidence": {"ticket": "OPS-1"},
        "result": {"credit_id": "cr_1"},
    }
    first = await ledger.settle(key, **decision)  # type: ignore[arg-type]
    again = await ledger.settle(key, **decision)  # type: ignore[arg-type]

    assert isinstance(again, RepeatedDecision) and again.model_dump() == first.model_dump()
    assert await kinds(ledger, key) == ["reserved", "indeterminate", "settled"]
    # Anything else than the very same decision is a second decision, and refused.
    for change in ({"actor": "operator:bob"}, {"reason": "found it again"}, {"status": Status.FAILED}):
        with pytest.raises(AlreadySettledError):
            await ledger.settle(key, **{**decision, **change})  # type: ignore[arg-type]


async def test_approve_and_deny_repeated_by_the_same_actor_are_not_refused(ledger: Ledger) -> None:
    approved = await started(ledger, approval=True)
    first = await ledger.approve(approved, actor="operator:alice", reason="ok")
    repeated = await ledger.approve(approved, actor="operator:alice", reason="ok")
    assert isinstance(repeated, RepeatedDecision) and repeated.model_dump() == first.model_dump()
    with pytest.raises(AlreadySettledError):
        await ledger.approve(approved, actor="operator:bob")
    assert await kinds(ledger, approved) == ["reserved", "approved"]

    denied = await started(ledger, approval=True)
    first = await ledger.deny(denied, actor="operator:bob", reason="too much")
    repeated = await ledger.deny(denied, actor="operator:bob", reason="too much")
    assert isinstance(repeated, RepeatedDecision) and repeated.model_dump() == first.model_dump()
    with pytest.raises(AlreadySettledError):
        await ledger.deny(denied, actor="operator:bob", reason="changed my mind")
    assert await kinds(ledger, denied) == ["reserved", "denied"]


async def test_complete_whose_answer_was_lost_on_the_wire_is_retried_cleanly(
    ledger: Ledger, database_url: str
) -> None:
    """The real thing: the server commits, the connection dies before the answer arrives."""
    key = await started(ledger)
    async with AnswerDroppingProxy(database_url, marker=b"SET status = 'completed'") as proxy:
        through_proxy = await Ledger.connect(proxy.dsn, max_size=1)
        try:
            with pytest.raises(LedgerUnavailableError):
                await through_proxy.complete(key, owner="worker-1", result={"credit_id": "cr_1"})
        finally:
            await through_proxy.close()
        assert proxy.dropped == 1

    committed = await ledger.find(key)
    assert committed is not None and committed.status is Status.COMPLETED
    retried = await ledger.complete(key, owner="worker-1", result={"credit_id": "cr_1"})
    assert retried.status is Status.COMPLETED
    assert await kinds(ledger, key) == ["reserved", "completed"]


async def test_settle_whose_answer_was_lost_on_the_wire_is_retried_cleanly(
    ledger: Ledger, database_url: str
) -> None:
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")
    await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner="worker-1",
        lease=timedelta(0),
    )
    async with AnswerDroppingProxy(database_url, marker=b"COMMIT") as proxy:
        through_proxy = await Ledger.connect(proxy.dsn, max_size=1)
        try:
            with pytest.raises(LedgerUnavailableError):
                await through_proxy.settle(
                    call.key, status=Status.FAILED, actor="operator:alice", reason="not in billing"
                )
        finally:
            await through_proxy.close()
        assert proxy.dropped == 1

    retried = await ledger.settle(
        call.key, status=Status.FAILED, actor="operator:alice", reason="not in billing"
    )
    assert (retried.status, retried.settled_by) == (Status.FAILED, "operator:alice")
    assert await kinds(ledger, call.key) == ["reserved", "settled"]
