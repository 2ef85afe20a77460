"""The write path's edges, against the real ledger: an attempt past its deadline reserves nothing, an
inspector leaves a call inside its owner's lease alone, the guards hold whatever isolation level the
database defaults to, and the ledger's connections say so (and keep TCP keepalives on)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from onceflow.activities.ledger_steps import LedgerActivities
from onceflow.ledger import (
    AttemptExpiredError,
    CallIdentity,
    EventSource,
    FailureKind,
    Guard,
    Ledger,
    Reservation,
    SideEffect,
    Status,
    canonical_payload,
    migrate,
)
from onceflow.ledger.connections import KEEPALIVES
from onceflow.local.postgres import create_database, drop_database
from onceflow.sdk.payloads import CallRef
from tests.support.ledger_guards import CREDIT, reserve, run_id

PAST = datetime(2000, 1, 1, tzinfo=UTC)


def _identity(call: str = "c1") -> CallIdentity:
    return CallIdentity(tenant="t1", run_id=run_id(), tool_call_id=call)


@pytest.mark.parametrize("guarded", [True, False])
async def test_an_attempt_past_its_deadline_reserves_nothing(ledger: Ledger, guarded: bool) -> None:
    """A new key, and a key that failed without effect (open to a retry): neither is reserved by an
    attempt whose workflow has given up on it, and the row is left as it was."""
    call = _identity()
    kwargs = {
        "tool_name": "issue_credit",
        "side_effect": SideEffect.EXTERNAL,
        "arguments": CREDIT,
        "guard": Guard() if guarded else None,
    }
    with pytest.raises(AttemptExpiredError):
        await ledger.reserve(call, owner="stale", not_after=PAST, **kwargs)  # type: ignore[arg-type]
    assert await ledger.find(call.key) is None

    first = await ledger.reserve(call, owner="w1", **kwargs)  # type: ignore[arg-type]
    told = await ledger.fail(call.key, owner="w1", kind=FailureKind.NOT_ATTEMPTED, error="503")
    with pytest.raises(AttemptExpiredError):
        await ledger.reserve(call, owner="stale", not_after=PAST, **kwargs)  # type: ignore[arg-type]
    after = await ledger.get(call.key)
    assert (after.status, after.owner, after.attempt) == (Status.FAILED, "w1", told.attempt)
    assert [e.kind for e in after.events] == ["reserved", "failed"]
    # Within its deadline, the same attempt reserves as ever.
    within = datetime.now(UTC) + timedelta(minutes=1)
    again = await ledger.reserve(call, owner="w2", not_after=within, **kwargs)  # type: ignore[arg-type]
    assert again.outcome is Reservation.RETRY and first.record.attempt + 1 == again.record.attempt


@pytest.mark.parametrize("guarded", [True, False])
async def test_an_attempt_that_began_before_a_failure_was_settled_does_not_retry_it(
    ledger: Ledger, guarded: bool
) -> None:
    """F4 of the protocol model: a reset replaced the execution while its attempt ran; the new
    execution's attempt was lost and an operator settled the call failed, which the model was told.
    The old attempt, inside its deadline, then reserves: the failure answers for itself, nothing is
    re-reserved or sent. An attempt that began after the failure (a retry the workflow decided on,
    or a reset's re-issue) retries it as before."""
    call = _identity()
    kwargs = {
        "tool_name": "issue_credit",
        "side_effect": SideEffect.EXTERNAL,
        "arguments": CREDIT,
        "guard": Guard() if guarded else None,
    }
    stale_began = datetime.now(UTC)
    await ledger.reserve(call, owner="new-execution", **kwargs)  # type: ignore[arg-type]
    await ledger.mark_indeterminate(call.key, actor="new-execution", reason="no answer in time")
    told = await ledger.settle(
        call.key, status=Status.FAILED, actor="operator:ann", reason="not in billing", evidence={"checked": 1}
    )
    stale = await ledger.reserve(
        call,
        owner="old-execution",
        not_after=datetime.now(UTC) + timedelta(minutes=1),
        began_at=stale_began,
        **kwargs,  # type: ignore[arg-type]
    )
    assert stale.outcome is Reservation.SETTLED and not stale.may_send
    after = await ledger.get(call.key)
    assert (after.status, after.owner, after.attempt, after.settled_at) == (
        Status.FAILED,
        "new-execution",
        told.attempt,
        told.settled_at,
    )
    assert [e.kind for e in after.events][-1] != "reserved"

    decided_after = await ledger.reserve(
        call,
        owner="retry",
        began_at=datetime.now(UTC),
        **kwargs,  # type: ignore[arg-type]
    )
    assert decided_after.outcome is Reservation.RETRY and decided_after.may_send


async def test_an_inspector_leaves_a_call_inside_its_owners_lease_alone(ledger: Ledger) -> None:
    """`started` with a live lease may be on the wire: it stays started; past its lease it is unknown.
    The owner itself may always say it does not know."""
    live = _identity()
    await ledger.reserve(
        live,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=CREDIT,
        owner="w1",
        lease=timedelta(minutes=1),
        guard=Guard(),
    )
    key = live.key
    record = await ledger.mark_indeterminate(key, actor="inspector", reason="lost", lease_ended=True)
    assert record.status is Status.STARTED
    assert [e.kind for e in (await ledger.get(key)).events] == ["reserved"]
    owned = await ledger.mark_indeterminate(key, actor="w1", reason="timed out", source=EventSource.OWNER)
    assert owned.status is Status.INDETERMINATE

    call = _identity()
    await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=CREDIT,
        owner="w1",
        lease=timedelta(0),
    )
    ended = await ledger.mark_indeterminate(call.key, actor="inspector", reason="lost", lease_ended=True)
    assert ended.status is Status.INDETERMINATE


async def test_twins_waiting_on_the_intent_lock_are_decided_one_after_the_other_under_repeatable_read(
    postgres_dsn: str, template_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database whose default isolation is REPEATABLE READ: each statement of the guarded
    reservation would see the snapshot taken before its locks were waited for, and two twins waiting
    on one intent lock would both find no twin and both be sent. The ledger's connections run READ
    COMMITTED whatever the default, and migrate says the default is not what the guards need."""
    name = f"onceflow_test_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(postgres_dsn, name, template="onceflow_test_template")
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f"ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'")
        with caplog.at_level(logging.WARNING, logger="onceflow.ledger"):
            await migrate(dsn)
        assert "repeatable read" in caplog.text
        ledgers = [await Ledger.connect(dsn, max_size=2) for _ in range(2)]
        try:
            run = run_id()
            sha = canonical_payload("issue_credit", CREDIT).sha256
            [lock] = Guard().locks(tenant="t1", run_id=run, tool_name="issue_credit", payload_sha256=sha)
            holder = await asyncpg.connect(dsn)
            try:
                await holder.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", lock)
                racing = [
                    asyncio.create_task(reserve(ledgers[i], run, f"c{i}", Guard(), owner=f"w{i}"))
                    for i in (0, 1)
                ]
                await _both_wait_on_a_lock(holder, name)
                await holder.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", lock)
                outcomes = sorted(r.outcome.value for r in await asyncio.gather(*racing))
            finally:
                await holder.close()
            assert outcomes == [Reservation.HELD.value, Reservation.NEW.value]
        finally:
            for ledger in ledgers:
                await ledger.close()
    finally:
        await admin.close()
        await drop_database(postgres_dsn, name)


async def _both_wait_on_a_lock(conn: asyncpg.Connection, database: str) -> None:
    for _ in range(200):
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'", database
        )
        if waiting == 2:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the two reservations never both waited on the intent lock")


async def test_ledger_connections_run_read_committed_with_keepalives(ledger: Ledger) -> None:
    """What every ledger connection sets for itself (ledger/connections.py). Over a Unix socket PostgreSQL
    reports keepalives as 0 whatever is set, so the source says they were set; over TCP they apply."""
    async with ledger.connection("test_settings") as conn:
        rows = await conn.fetch(
            "SELECT name, setting, source FROM pg_settings WHERE name = ANY($1::text[])",
            ["default_transaction_isolation", *KEEPALIVES],
        )
        isolation = await conn.fetchval("SHOW transaction_isolation")
    settings = {r["name"]: (r["setting"], r["source"]) for r in rows}
    assert settings["default_transaction_isolation"] == ("read committed", "session")
    assert isolation == "read committed"
    for name in KEEPALIVES:
        assert settings[name][1] == "session", f"{name} is not set by the ledger"


async def test_inspecting_a_call_reserved_by_an_attempt_whose_answer_was_lost_releases_it(
    ledger: Ledger,
) -> None:
    """Attempt 1 reserved and lost the answer; attempt 2, which knew it, died before reserving. The
    run's inspection, told attempt 1's token, finds the call `started` under it: never sent, so it
    is released as not attempted and the run sends it again (found by the model of issue 40, F2).
    Under any other owner a call inside its lease is left alone."""
    steps = LedgerActivities(ledger)
    lost, other = _identity("c1"), _identity("c2")
    for call, owner in ((lost, "attempt-1"), (other, "attempt-9")):
        await ledger.reserve(
            call,
            tool_name="issue_credit",
            side_effect=SideEffect.EXTERNAL,
            arguments=CREDIT,
            owner=owner,
            lease=timedelta(minutes=1),
            guard=Guard(),
        )
    ref = CallRef(key=lost.key, tool="issue_credit", tool_call_id="c1", unsent_owners=["attempt-1"])
    assert await steps.inspect_call(ref) is None
    released = await ledger.get(lost.key)
    assert (released.status, released.failure_kind) == (Status.FAILED, FailureKind.NOT_ATTEMPTED)
    untouched = await steps.inspect_call(
        CallRef(key=other.key, tool="issue_credit", tool_call_id="c2", unsent_owners=["attempt-1"])
    )
    assert untouched is not None and untouched.status is Status.STARTED
