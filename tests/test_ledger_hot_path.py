"""The per-call path (reserve, then the owner's outcome): its records, spans, connections and
durability."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import asyncpg
import pydantic
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from onceflow.ledger import (
    CallIdentity,
    FailureKind,
    Ledger,
    LedgerUnavailableError,
    RecordNotFoundError,
    Reservation,
    ReserveResult,
    SideEffect,
    Status,
    ToolExecutionRecord,
)

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}
CREDIT = {"credit_id": "cr_1", "amount_cents": 500}


def new_call() -> CallIdentity:
    return CallIdentity(tenant="t1", run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call-1")


async def reserve(
    ledger: Ledger, call: CallIdentity, *, owner: str = "worker-1", lease: timedelta | None = None
) -> ReserveResult:
    return await ledger.reserve(
        call,
        tool_name="issue_credit",
        side_effect=SideEffect.EXTERNAL,
        arguments=ARGUMENTS,
        owner=owner,
        lease=lease,
    )


@pytest.fixture(scope="module")
def exported_spans() -> Iterator[InMemorySpanExporter]:
    """Spans finished while this module runs (the global provider is set once per process; see
    tests/test_tracing.py)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another kind of tracer provider is installed"
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    # Stop the exporter, not its processor: a stopped processor logs a warning for every later span.
    exporter.shutdown()


# -- records ------------------------------------------------------------------------------------------


async def test_reserve_and_complete_return_typed_frozen_records(ledger: Ledger) -> None:
    call = new_call()
    reserved = await reserve(ledger, call)
    record = reserved.record
    assert reserved.outcome is Reservation.NEW
    assert isinstance(record, ToolExecutionRecord)
    assert record.status is Status.STARTED
    assert record.side_effect is SideEffect.EXTERNAL
    assert record.payload == {"tool": "issue_credit", "arguments": ARGUMENTS}
    assert isinstance(record.created_at, datetime) and record.created_at.tzinfo is not None
    assert (record.attempt, record.owner, record.result, record.events) == (1, "worker-1", None, [])

    completed = await ledger.complete(call.key, owner="worker-1", result=CREDIT, result_reference="cr_1")
    assert completed.status is Status.COMPLETED
    assert completed.result == CREDIT
    assert (completed.result_reference, completed.settled_by) == ("cr_1", "worker-1")
    assert isinstance(completed.settled_at, datetime)
    assert completed == await ledger.get(call.key, with_events=False)
    with pytest.raises(pydantic.ValidationError):
        completed.status = Status.FAILED


# -- spans ----------------------------------------------------------------------------------------------


async def test_each_operation_is_one_span_with_its_key_tool_and_status(
    ledger: Ledger, exported_spans: InMemorySpanExporter
) -> None:
    exported_spans.clear()
    call = new_call()
    outer = trace.get_current_span()
    await reserve(ledger, call)
    await ledger.complete(call.key, owner="worker-1", result=CREDIT)
    assert trace.get_current_span() is outer  # each span's context was left again

    spans = [s for s in exported_spans.get_finished_spans() if s.name.startswith("ledger.")]
    assert [s.name for s in spans] == ["ledger.reserve", "ledger.complete"]
    for span, status in zip(spans, ("started", "completed"), strict=True):
        attributes = dict(span.attributes or {})
        assert attributes["onceflow.key"] == call.key
        assert attributes["onceflow.tool"] == "issue_credit"
        assert attributes["onceflow.status"] == status
        assert span.status.status_code is StatusCode.UNSET
    assert dict(spans[0].attributes or {})["onceflow.outcome"] == "new"


async def test_a_failed_operation_ends_its_span_with_the_error(
    ledger: Ledger, exported_spans: InMemorySpanExporter
) -> None:
    exported_spans.clear()
    with pytest.raises(RecordNotFoundError):
        await ledger.get("run-none:call-1")
    (span,) = [s for s in exported_spans.get_finished_spans() if s.name == "ledger.get"]
    assert span.status.status_code is StatusCode.ERROR
    assert "RecordNotFoundError" in (span.status.description or "")
    assert [e.name for e in span.events] == ["exception"]


# -- connections ----------------------------------------------------------------------------------------


async def test_a_cancelled_statement_does_not_leave_its_connection_to_the_next_call(
    database_url: str,
) -> None:
    ledger = await Ledger.connect(database_url, min_size=1, max_size=1)
    try:

        async def stuck() -> None:
            async with ledger.connection("test") as conn:
                await conn.execute("SELECT pg_sleep(30)")

        task = asyncio.create_task(stuck())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The one slot is free again, on a fresh connection: the cancelled one may still be busy.
        reserved = await asyncio.wait_for(reserve(ledger, new_call()), 10)
        assert reserved.may_send
    finally:
        await ledger.close()


async def test_concurrent_calls_share_at_most_max_size_connections(database_url: str) -> None:
    ledger = await Ledger.connect(database_url, min_size=0, max_size=2)
    try:
        calls = [new_call() for _ in range(20)]
        results = await asyncio.gather(*(reserve(ledger, call) for call in calls))
        assert all(r.may_send for r in results)
        await asyncio.gather(*(ledger.complete(c.key, owner="worker-1", result=CREDIT) for c in calls))
        conn = await asyncpg.connect(database_url)
        try:
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
        assert others <= 2
    finally:
        await ledger.close()


async def test_a_closed_or_unreachable_ledger_is_unavailable(database_url: str) -> None:
    ledger = await Ledger.connect(database_url)
    await ledger.close()
    with pytest.raises(LedgerUnavailableError):
        await reserve(ledger, new_call())
    with pytest.raises(LedgerUnavailableError):
        await Ledger.connect("postgresql://nobody@127.0.0.1:1/nothing")


# -- durability -------------------------------------------------------------------------------------

# A deferred trigger runs at commit, just before the commit record is written, so it sees the
# synchronous_commit that this transaction's commit obeys.
NOTE_COMMIT_MODES = """
CREATE TABLE commit_modes (id bigserial PRIMARY KEY, kind text NOT NULL, mode text NOT NULL);
CREATE FUNCTION note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO commit_modes (kind, mode) VALUES (NEW.kind, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER note_commit_mode AFTER INSERT ON tool_execution_events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note_commit_mode();
"""


async def commit_modes(database_url: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT kind, mode FROM commit_modes ORDER BY id")
    finally:
        await conn.close()
    return [(r["kind"], r["mode"]) for r in rows]


async def one_of_each_outcome(ledger: Ledger) -> None:
    completed, failed, after = new_call(), new_call(), new_call()
    await reserve(ledger, completed)
    await ledger.complete(completed.key, owner="worker-1", result=CREDIT)
    await reserve(ledger, failed)
    await ledger.fail(failed.key, owner="worker-1", kind=FailureKind.REJECTED, error="account closed")
    await reserve(ledger, after)


@pytest.fixture
async def noting_commit_modes(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(NOTE_COMMIT_MODES)
    finally:
        await conn.close()
    return database_url


async def test_every_ledger_write_waits_for_its_flush(noting_commit_modes: str) -> None:
    ledger = await Ledger.connect(noting_commit_modes, min_size=1, max_size=1)
    try:
        await one_of_each_outcome(ledger)
    finally:
        await ledger.close()
    assert await commit_modes(noting_commit_modes) == [
        ("reserved", "on"),
        ("completed", "on"),
        ("reserved", "on"),
        ("failed", "on"),
        ("reserved", "on"),
    ]


async def test_a_lost_completion_leaves_the_call_started_never_sent_again_and_settleable(
    ledger: Ledger,
) -> None:
    """The owner sent the call and died before recording it: the completion never arrives."""
    call = new_call()
    await reserve(ledger, call, lease=timedelta(milliseconds=50))

    again = await reserve(ledger, call, owner="worker-2")
    assert again.outcome is Reservation.IN_FLIGHT and not again.may_send

    await asyncio.sleep(0.2)  # the owner's lease runs out
    page = await ledger.list_unresolved("t1")
    assert [r.key for r in page.records] == [call.key]
    settled = await ledger.settle(
        call.key,
        status=Status.COMPLETED,
        actor="reconciler",
        reason="credit cr_1 found under the call's key",
        result=CREDIT,
    )
    assert settled.status is Status.COMPLETED and settled.result == CREDIT
