"""Retention of stored conversations: a run's conversation goes with the run once nothing can read it
again (closed, past the retention age, its history no longer kept for a reset), never while the run
or a reset could still need it; the database refuses every other delete."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from onceflow import ToolContext, Toolset, external
from onceflow.cli.commands import app
from onceflow.ledger import Ledger, Status
from onceflow.ledger.conversations import Conversations
from onceflow.ledger.retention import RunEnd, RunEnds, purge_conversations, purge_conversations_before
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.runtime.run_ends import namespace_retention, temporal_run_ends
from tests.workflow_harness import running_worker

OLD = timedelta(days=100)
AGE = timedelta(days=90)
waiting = Toolset("waiting")


@waiting.tool(external(approval=True))
async def refund(order_id: str, context: ToolContext) -> dict[str, Any]:
    """Refund an order (an operator approves it first)."""
    return {"refunded": order_id}


def _agent(name: str, script: list[dict[str, Any]]) -> Agent:
    config = AgentConfig.model_validate(
        {"model": {"provider": "scripted", "script": script}, "toolsets": ["waiting"]}
    )
    return Agent(name, config, {t.name: t for t in waiting.tools})


async def _messages(database_url: str, run_id: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM conversation_messages WHERE run_id = $1", run_id)
        )
    finally:
        await conn.close()


async def _age(database_url: str, run_id: str, by: timedelta = OLD) -> None:
    """Make a run's messages look written `by` ago. Only tests rewrite history."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE conversation_messages SET created_at = created_at - $2::interval WHERE run_id = $1",
            run_id,
            by,
        )
    finally:
        await conn.close()


async def _stored(ledger: Ledger, run_id: str, count: int = 3) -> None:
    messages = [{"role": "user", "content": f"message {n}"} for n in range(count)]
    await Conversations(ledger).extend(tenant="acme", run_id=run_id, head=None, length=0, messages=messages)


def test_a_conversation_is_past_use_only_once_closed_before_the_cutoff_and_its_history_gone() -> None:
    now = datetime.fromisoformat("2026-12-04T12:00:00+00:00")
    cutoff = now - AGE
    assert RunEnd().past_use(cutoff=cutoff, now=now)  # the namespace no longer has it
    long_ago = now - timedelta(days=200)
    assert RunEnd(closed_at=long_ago, history_until=long_ago + timedelta(days=7)).past_use(
        cutoff=cutoff, now=now
    )
    # Closed long ago, but the namespace keeps the history (a reset could replay its model turns).
    assert not RunEnd(closed_at=long_ago, history_until=now + timedelta(hours=1)).past_use(
        cutoff=cutoff, now=now
    )
    # Closed inside the retention age.
    recent = now - timedelta(days=1)
    assert not RunEnd(closed_at=recent, history_until=recent).past_use(cutoff=cutoff, now=now)


async def test_temporal_says_which_runs_are_closed_and_until_when_a_reset_could_come(
    temporal_env: WorkflowEnvironment, ledger: Ledger, database_url: str
) -> None:
    registry = AgentRegistry(
        {
            "done": _agent("done", [{"final": "nothing to do"}]),
            "asks": _agent("asks", [{"tool_calls": [{"name": "refund", "arguments": {"order_id": "o1"}}]}]),
        }
    )
    retention = await namespace_retention(temporal_env.client)
    assert retention > timedelta(0)
    never_ran = f"run-{uuid.uuid4().hex[:10]}"
    async with running_worker(temporal_env.client, ledger, registry) as h:
        finished = await h.start("done", "{}")
        await finished.result()
        paused = await h.start("asks", "{}")
        key = f"{paused.id}:call_0_0"
        for _ in range(200):  # the run waits for an operator's approval
            record = await ledger.find(key)
            if record is not None and record.status is Status.AWAITING_APPROVAL:
                break
            await asyncio.sleep(0.1)
        else:
            described = await paused.describe()
            raise AssertionError(
                f"{key} never waited for approval: {described.status} {await ledger.find(key)}"
            )
        await _stored(ledger, never_ran)  # a run whose history the namespace no longer has
        for run_id in (finished.id, paused.id, never_ran):
            assert await _messages(database_url, run_id) > 0
            await _age(database_url, run_id)

        run_ends: RunEnds = await temporal_run_ends(temporal_env.client)
        ends = await run_ends([finished.id, paused.id, never_ran])
        assert set(ends) == {finished.id, never_ran}  # the paused run is running: left out
        closed = ends[finished.id]
        assert closed.closed_at is not None and closed.history_until == closed.closed_at + retention
        assert ends[never_ran] == RunEnd()

        before = {r: await _messages(database_url, r) for r in (finished.id, paused.id, never_ran)}
        report = await purge_conversations(ledger, run_ends, older_than=AGE)
        # Only the run nothing can read again lost its conversation; the finished run closed inside the
        # retention age (a reset could still come), the paused one waits on a call.
        assert await _messages(database_url, never_ran) == 0
        assert await _messages(database_url, finished.id) == before[finished.id]
        assert await _messages(database_url, paused.id) == before[paused.id]
        assert (report.runs, report.messages, report.kept_open) == (1, before[never_ran], 1)
        assert report.bytes > 0
        await paused.terminate("the test is over")


async def test_given_answers_the_purge_takes_exactly_the_runs_past_use(
    ledger: Ledger, database_url: str
) -> None:
    runs = {name: f"run-{name}-{uuid.uuid4().hex[:6]}" for name in ("gone", "ended", "resettable", "silent")}
    young = f"run-young-{uuid.uuid4().hex[:6]}"
    for run_id in runs.values():
        await _stored(ledger, run_id)
        await _age(database_url, run_id)
    await _stored(ledger, young)  # written just now: not even asked about
    asked: list[str] = []
    now = datetime.now().astimezone()
    answers = {
        runs["gone"]: RunEnd(),
        runs["ended"]: RunEnd(closed_at=now - OLD, history_until=now - OLD + timedelta(days=7)),
        runs["resettable"]: RunEnd(closed_at=now - OLD, history_until=now + timedelta(days=1)),
        # "silent": no answer (running, or Temporal said nothing plain): kept
    }

    async def run_ends(run_ids: Any) -> dict[str, RunEnd]:
        asked.extend(run_ids)
        return {r: answers[r] for r in run_ids if r in answers}

    dry = await purge_conversations(ledger, run_ends, older_than=AGE, dry_run=True)
    assert (dry.runs, dry.messages, dry.dry_run) == (2, 6, True)
    assert all([await _messages(database_url, r) == 3 for r in runs.values()])
    assert young not in asked

    done = await purge_conversations(ledger, run_ends, older_than=AGE, batch_size=1)
    assert (done.runs, done.messages, done.kept_open) == (2, 6, 2)
    assert {r: await _messages(database_url, r) for r in runs.values()} == {
        runs["gone"]: 0,
        runs["ended"]: 0,
        runs["resettable"]: 3,
        runs["silent"]: 3,
    }
    assert await _messages(database_url, young) == 3
    again = await purge_conversations(ledger, run_ends, older_than=AGE)
    assert again.runs == 0  # nothing more to do


async def test_the_database_refuses_deleting_conversations_outside_a_purge(
    ledger: Ledger, database_url: str
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await _stored(ledger, run_id)
    await _age(database_url, run_id)
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.RaiseError, match="deleted only by a purge"):
            await conn.execute("DELETE FROM conversation_messages WHERE run_id = $1", run_id)
        with pytest.raises(asyncpg.RaiseError, match="TRUNCATE refused"):
            await conn.execute("TRUNCATE conversation_messages")
        async with conn.transaction():
            with pytest.raises(asyncpg.RaiseError, match="at least one day in the past"):
                await conn.execute("SELECT set_config('onceflow.purge_before', now()::text, true)")
                await conn.execute("DELETE FROM conversation_messages WHERE run_id = $1", run_id)
        # A run with an unresolved call is open, whatever anyone says: its conversation stays.
        await ledger.reserve(
            _identity(run_id),
            tool_name="refund",
            side_effect=_external(),
            arguments={"order_id": "o1"},
            owner="w1",
        )
        always_open: RunEnds = _answer_gone
        report = await purge_conversations_before(
            ledger, always_open, datetime.now().astimezone() - timedelta(days=2)
        )
        assert report.runs == 0
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('onceflow.purge_before', (now() - interval '2 days')::text, true)"
            )
            with pytest.raises(asyncpg.RaiseError, match="deleted only by a purge"):
                await conn.execute("DELETE FROM conversation_messages WHERE run_id = $1", run_id)
        assert await _messages(database_url, run_id) == 3
    finally:
        await conn.close()


async def _answer_gone(run_ids: Any) -> dict[str, RunEnd]:
    return dict.fromkeys(run_ids, RunEnd())


def _identity(run_id: str) -> Any:
    from onceflow.ledger import CallIdentity

    return CallIdentity(tenant="acme", run_id=run_id, tool_call_id="call_1_0")


def _external() -> Any:
    from onceflow.ledger import SideEffect

    return SideEffect.EXTERNAL


async def test_the_purge_command_keeps_conversations_when_temporal_does_not_answer(
    temporal_env: WorkflowEnvironment, ledger: Ledger, database_url: str
) -> None:
    gone = f"run-{uuid.uuid4().hex[:8]}"
    await _stored(ledger, gone)
    await _age(database_url, gone)
    runner = CliRunner()

    def purge(address: str) -> Any:
        env = {
            "ONCEFLOW_DATABASE_URL": database_url,
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": "default",
        }
        return runner.invoke(app, ["ledger", "purge", "--json"], env=env)

    unanswered = await asyncio.to_thread(purge, "127.0.0.1:1")
    assert unanswered.exit_code == 1, unanswered.output
    assert json.loads(unanswered.stdout.splitlines()[0])["conversations"] is None
    assert await _messages(database_url, gone) == 3

    address = temporal_env.client.service_client.config.target_host
    answered = await asyncio.to_thread(purge, address)
    assert answered.exit_code == 0, answered.output
    assert json.loads(answered.stdout)["conversations"]["runs"] == 1
    assert await _messages(database_url, gone) == 0
