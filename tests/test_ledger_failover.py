"""The ledger on a real primary and standby that fails over (onceflow/local/replication.py).

Asynchronous replication loses the writes the primary acknowledged last: here they are held back
on purpose (the primary's WAL senders stopped), so the loss is certain rather than a race. The
test's own record is what the ledger acknowledged to it before the failover; after it, every such
call must either be on the promoted server as acknowledged or be a visible unknown call saying why,
and never read as "not sent".
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from onceflow.activities.sending import record_outcome
from onceflow.ledger import (
    CallIdentity,
    EventSource,
    Ledger,
    LedgerUnavailableError,
    SideEffect,
    Status,
    ToolExecutionRecord,
)
from onceflow.ledger.lost_writes import LOST_KIND
from onceflow.sdk.payloads import OwnerOutcome
from tests.support.replication import fail_over, replicated_ledger


async def _reserve(ledger: Ledger, owner: str, *, approval: bool = False) -> ToolExecutionRecord:
    call = CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call_1_0")
    reserved = await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments={"account_id": "acct_1", "amount_cents": 500},
        owner=owner,
        lease=timedelta(seconds=30),
        approval=approval,
    )
    assert reserved.may_send is not approval
    return reserved.record


async def _first_read(ledger: Ledger, key: str) -> ToolExecutionRecord | None:
    """The first read after a failover: a pooled connection to the dead primary may answer it with
    LedgerUnavailableError (as a worker's activity would meet it, and retry)."""
    try:
        return await ledger.find(key)
    except LedgerUnavailableError:
        return await ledger.find(key)


async def test_writes_lost_by_an_asynchronous_failover_become_visible_unknowns() -> None:
    async with replicated_ledger(synchronous=False) as (pair, dsn):
        ledger = await Ledger.connect(dsn, process="test-worker")
        try:
            assert ledger.timelines.current == 1
            kept = await _reserve(ledger, "owner-kept")  # replicated before the hold
            before = datetime.now(UTC)
            pair.hold_replication()
            # Acknowledged by the primary, never replicated: the test's own record of them.
            completed = await _reserve(ledger, "owner-a")
            completed = await ledger.complete(completed.key, owner="owner-a", result={"credit_id": "c1"})
            started = await _reserve(ledger, "owner-b")
            in_flight = await _reserve(ledger, "owner-c")  # its owner is still sending it
            waiting = await _reserve(ledger, "owner-d", approval=True)  # never sent
            fail_over(pair, lose_recent_writes=True)

            # The first connection to the promoted server meets timeline 2: the process reads again
            # what it saw acknowledged and restores what the failover lost.
            assert await _first_read(ledger, kept.key) is not None
            await ledger.failover_checks_done()
            assert ledger.timelines.current == 2
            for lost in (completed, started, in_flight):
                record = await ledger.get(lost.key)
                assert record.status is Status.INDETERMINATE, lost.key
                assert record.owner == lost.owner and record.attempt == lost.attempt
                event = record.events[-1]
                assert event.kind == LOST_KIND and event.to_status is Status.INDETERMINATE
                assert event.detail["acknowledged"]["status"] == lost.status.value
                assert "lost in a failover" in (record.error or "")
            # A call never sent is written back as it was: nothing about it is unknown.
            back = await ledger.get(waiting.key)
            assert back.status is Status.AWAITING_APPROVAL
            assert [e.kind for e in back.events] == [LOST_KIND]
            # The operator queue lists them, with why.
            page = await ledger.list_unresolved("t1", statuses=[Status.INDETERMINATE])
            listed = {item.key: item for item in page.records}
            assert {completed.key, started.key, in_flight.key} <= set(listed)
            assert all("lost in a failover" in (listed[k].error or "") for k in (completed.key, started.key))

            # The owner still sending one reports its answer: it settles the restored call.
            settled = await record_outcome(
                ledger,
                OwnerOutcome(
                    key=in_flight.key,
                    owner="owner-c",
                    tool="issue_credit",
                    tool_call_id="call_1_0",
                    status="completed",
                    value={"credit_id": "c3"},
                    reserved=in_flight,
                ),
            )
            assert settled.status is Status.COMPLETED

            # A failover is on record for calls attempted before it, not for later ones.
            switch = await ledger.failover_since(before)
            assert switch is not None and switch[0] == 2
            assert await ledger.failover_since(datetime.now(UTC) + timedelta(minutes=5)) is None
        finally:
            await ledger.close()


async def test_an_owner_whose_row_is_gone_after_a_failover_records_an_unknown_call() -> None:
    """The write activity's own view: its reservation was acknowledged, the failover lost it, and
    its outcome then finds no row (here in another process, the workflow's retrying ledger step,
    which knows nothing but the outcome it carries)."""
    async with replicated_ledger(synchronous=False) as (pair, dsn):
        owner_side = await Ledger.connect(dsn, process="worker-a")
        try:
            pair.hold_replication()
            reserved = await _reserve(owner_side, "worker-a/act-1#1")
            unprotected = await _reserve(owner_side, "worker-a/act-9#1")
        finally:
            await owner_side.close()
        fail_over(pair, lose_recent_writes=True)
        other = await Ledger.connect(dsn, process="worker-b")
        try:
            assert await other.find(reserved.key) is None  # lost: "no row" would say "never sent"
            # What happens when nobody restores a lost call: the ledger lets it be sent again.
            again = await other.reserve(
                CallIdentity(tenant="t1", run_id=unprotected.run_id, tool_call_id="call_1_0"),
                tool_name="issue_credit",
                side_effect=SideEffect.EXTERNAL,
                arguments={"account_id": "acct_1", "amount_cents": 500},
                owner="worker-b/act-10#1",
            )
            assert again.may_send
            outcome = await record_outcome(
                other,
                OwnerOutcome(
                    key=reserved.key,
                    owner=reserved.owner or "",
                    tool="issue_credit",
                    tool_call_id="call_1_0",
                    status="completed",
                    value={"credit_id": "c9"},
                    reserved=reserved,
                ),
            )
            assert outcome.status is Status.INDETERMINATE
            record = await other.get(reserved.key)
            assert record.status is Status.INDETERMINATE and record.attempt == reserved.attempt
            lost = [e for e in record.events if e.kind == LOST_KIND]
            assert len(lost) == 1 and lost[0].source is EventSource.OWNER
            assert lost[0].detail["reported"]["result"] == {"credit_id": "c9"}
            # Never sent again: a reservation of the key finds it in flight.
            again = await other.reserve(
                CallIdentity(tenant="t1", run_id=reserved.run_id, tool_call_id="call_1_0"),
                tool_name="issue_credit",
                side_effect=SideEffect.EXTERNAL,
                arguments={"account_id": "acct_1", "amount_cents": 500},
                owner="worker-b/act-2#1",
            )
            assert not again.may_send
        finally:
            await other.close()


@pytest.mark.slow
async def test_a_synchronous_standby_keeps_every_acknowledged_write() -> None:
    """The same writes under synchronous replication survive the failover as acknowledged."""
    async with replicated_ledger(synchronous=True) as (pair, dsn):
        ledger = await Ledger.connect(dsn, process="test-worker")
        try:
            acknowledged = []
            for n in range(20):
                record = await _reserve(ledger, f"owner-{n}")
                if n % 2:
                    record = await ledger.complete(record.key, owner=f"owner-{n}", result={"n": n})
                acknowledged.append(record)
            fail_over(pair)
            pair.rebuild_standby()  # commits wait for a synchronous standby again
            await _first_read(ledger, acknowledged[0].key)
            for record in acknowledged:
                found = await ledger.get(record.key)
                assert (found.status, found.attempt) == (record.status, record.attempt)
            await ledger.failover_checks_done()
            assert ledger.timelines.current == 2
            assert not [
                e for r in acknowledged for e in (await ledger.get(r.key)).events if e.kind == LOST_KIND
            ]
        finally:
            await ledger.close()
