"""Retention: old settled calls can be purged or archived; nothing younger, nothing unresolved,
no open conflict, and the database itself refuses every other delete."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from onceflow.cli.commands import app
from onceflow.ledger import CallIdentity, Ledger, SideEffect, Status, purge_settled, queries
from onceflow.ledger.retention import parse_age

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}
OLD = timedelta(days=100)


async def call(ledger: Ledger, run_id: str | None = None, tool_call_id: str = "call-1") -> str:
    identity = CallIdentity(
        tenant="t1", run_id=run_id or f"run-{uuid.uuid4().hex[:8]}", tool_call_id=tool_call_id
    )
    await ledger.reserve(
        identity, tool_name="issue_credit", side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner="w1"
    )
    return identity.key


async def completed(ledger: Ledger, **kw: str) -> str:
    key = await call(ledger, **kw)
    await ledger.complete(key, owner="w1", result={"credit_id": "cr_1"})
    return key


async def age(database_url: str, key: str, by: timedelta = OLD) -> None:
    """Make a call look settled (and its events written) `by` ago. Only tests rewrite history."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE tool_executions SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval,"
            " settled_at = settled_at - $2::interval WHERE key = $1",
            key,
            by,
        )
        async with conn.transaction():
            # The events' `at` is evidence too; the append-only trigger is lifted for this alone.
            await conn.execute(
                "ALTER TABLE tool_execution_events DISABLE TRIGGER tool_execution_events_append_only"
            )
            await conn.execute(
                "UPDATE tool_execution_events SET at = at - $2::interval WHERE key = $1", key, by
            )
            await conn.execute(
                "ALTER TABLE tool_execution_events ENABLE TRIGGER tool_execution_events_append_only"
            )
    finally:
        await conn.close()


async def test_purge_takes_old_settled_calls_with_their_events_and_nothing_else(
    ledger: Ledger, database_url: str
) -> None:
    old = await completed(ledger)
    await age(database_url, old)
    young = await completed(ledger)
    unresolved = await call(ledger)
    await ledger.mark_indeterminate(unresolved, actor="inspector", reason="timed out")
    await age(database_url, unresolved)
    conflicted = await call(ledger)
    await ledger.mark_indeterminate(conflicted, actor="inspector", reason="timed out")
    await ledger.settle(conflicted, status=Status.FAILED, actor="operator:alice", reason="not seen")
    await ledger.record_late_outcome(conflicted, actor="reconciler", status=Status.COMPLETED)
    await age(database_url, conflicted)
    # One old call in a run that has a young one: the run's keys stay together.
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    sibling_old = await completed(ledger, run_id=run_id, tool_call_id="call-1")
    await age(database_url, sibling_old)
    await completed(ledger, run_id=run_id, tool_call_id="call-2")

    dry = await purge_settled(ledger, older_than=timedelta(days=90), dry_run=True)
    assert (dry.calls, dry.events, dry.dry_run) == (1, 2, True)
    assert await ledger.find(old) is not None

    report = await purge_settled(ledger, older_than=timedelta(days=90), batch_size=1)
    assert (report.calls, report.events) == (1, 2)
    assert await ledger.find(old) is None
    for kept in (young, unresolved, conflicted, sibling_old):
        assert await ledger.find(kept) is not None, kept

    again = await purge_settled(ledger, older_than=timedelta(days=90))
    assert (again.calls, again.events) == (0, 0)


async def test_an_acknowledged_conflict_ages_out_from_its_acknowledgement(
    ledger: Ledger, database_url: str
) -> None:
    key = await call(ledger)
    await ledger.mark_indeterminate(key, actor="inspector", reason="timed out")
    await ledger.settle(key, status=Status.FAILED, actor="operator:alice", reason="not seen")
    await ledger.record_late_outcome(key, actor="reconciler", status=Status.COMPLETED)
    await ledger.acknowledge_conflict(
        key,
        actor="operator:bob",
        status=Status.FAILED,
        reason="checked by hand",
        evidence={"billing": "none"},
    )
    await age(database_url, key)

    assert (await purge_settled(ledger, older_than=timedelta(days=90))).calls == 1


async def test_archive_moves_the_record_and_its_events(ledger: Ledger, database_url: str) -> None:
    key = await completed(ledger)
    await age(database_url, key)

    report = await purge_settled(ledger, older_than=timedelta(days=90), archive=True)

    assert (report.calls, report.events, report.archived) == (1, 2, True)
    conn = await asyncpg.connect(database_url)
    try:
        archived = await conn.fetchrow("SELECT * FROM tool_executions_archive WHERE key = $1", key)
        events = await conn.fetch("SELECT event FROM tool_execution_events_archive WHERE key = $1", key)
    finally:
        await conn.close()
    assert archived is not None and archived["run_id"] == key.split(":")[0]
    assert '"status": "completed"' in archived["record"]
    assert len(events) == 2
    assert await ledger.find(key) is None


async def test_the_database_refuses_deletes_outside_a_purge(ledger: Ledger, database_url: str) -> None:
    old = await completed(ledger)
    await age(database_url, old)
    young = await completed(ledger)
    conn = await asyncpg.connect(database_url)
    try:
        # No purge cutoff set: events and rows are append-only / not deletable.
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute(queries.DELETE_EVENTS, [old])
        with pytest.raises(asyncpg.RaiseError, match="only by a purge"):
            await conn.execute("DELETE FROM tool_executions WHERE key = $1", young)
        with pytest.raises(asyncpg.RaiseError, match="TRUNCATE refused"):
            await conn.execute("TRUNCATE tool_executions CASCADE")
        # A session that sets the cutoff still cannot reach younger evidence ...
        async with conn.transaction():
            await conn.execute(
                queries.SET_PURGE_CUTOFF, await conn.fetchval("SELECT now() - interval '90 days'")
            )
            with pytest.raises(asyncpg.RaiseError, match="append-only"):
                await conn.execute(queries.DELETE_EVENTS, [young])
        # ... nor move the cutoff to yesterday-or-later.
        async with conn.transaction():
            await conn.execute(queries.SET_PURGE_CUTOFF, await conn.fetchval("SELECT now()"))
            with pytest.raises(asyncpg.RaiseError, match="at least one day"):
                await conn.execute(queries.DELETE_EVENTS, [old])
        # The cutoff is transaction-local: gone after commit.
        async with conn.transaction():
            await conn.execute(
                queries.SET_PURGE_CUTOFF, await conn.fetchval("SELECT now() - interval '90 days'")
            )
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await conn.execute(queries.DELETE_EVENTS, [old])
        counts = await conn.fetchval(
            "SELECT count(*) FROM tool_execution_events WHERE key = ANY($1)", [old, young]
        )
    finally:
        await conn.close()
    assert counts == 4


@pytest.mark.parametrize("text", ["90", "12h", "0d", "1w", "-3d", ""])
def test_a_retention_age_must_be_a_day_or_more_with_a_unit(text: str) -> None:
    with pytest.raises(ValueError):
        parse_age(text)


def test_retention_ages_parse() -> None:
    assert parse_age("90d") == timedelta(days=90)
    assert parse_age("36h") == timedelta(hours=36)


async def test_purge_command_counts_and_reads_the_retention_from_the_environment(
    temporal_env: WorkflowEnvironment, ledger: Ledger, database_url: str
) -> None:
    key = await completed(ledger)
    await age(database_url, key, by=timedelta(days=40))
    runner = CliRunner()
    # The command asks Temporal which runs' conversations may go (test_conversation_retention.py).
    temporal = {"TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host}

    def purge(*args: str, **env: str) -> Result:
        # The command runs its own event loop, so it gets a thread of its own.
        return runner.invoke(app, ["ledger", "purge", *args], env={**temporal, **env})

    kept = await asyncio.to_thread(purge, "--database-url", database_url)
    assert kept.exit_code == 0, kept.output
    assert "purged 0 settled calls" in kept.output  # the default is 90 days

    refused = await asyncio.to_thread(purge, "--database-url", database_url, "--older-than", "2h")
    assert refused.exit_code == 2 and "at least 1 day" in refused.output

    env = {"ONCEFLOW_RETENTION": "30d", "ONCEFLOW_DATABASE_URL": database_url}
    dry = await asyncio.to_thread(purge, "--dry-run", "--json", **env)
    assert dry.exit_code == 0, dry.output
    assert '"calls": 1' in dry.output and '"dry_run": true' in dry.output

    done = await asyncio.to_thread(purge, **env)
    assert done.exit_code == 0, done.output
    assert "purged 1 settled calls and 2 events" in done.output
    assert await ledger.find(key) is None
