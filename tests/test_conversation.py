"""Conversations by reference: a run's history grows by what each turn adds, not by the whole
conversation each turn; oversized tool results reach the model as an error and are not kept."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow import ToolContext, Toolset, external, read
from onceflow.ledger import Ledger, Status
from onceflow.ledger.conversations import ConversationMissingError, Conversations
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.sdk.payloads import ModelCallInput
from tests.workflow_harness import running_worker

sized = Toolset("sized")
SENDS: list[str] = []


@sized.tool(read())
async def fetch_text(size: int) -> str:
    """Text of the given size."""
    return "x" * size


@sized.tool(external())
async def store_blob(size: int, context: ToolContext) -> dict[str, Any]:
    """Store a blob; the receipt echoes it back."""
    SENDS.append(context.idempotency_key)
    return {"stored": True, "echo": "y" * size}


def _agent(name: str, script: list[dict[str, Any]], **policy: Any) -> Agent:
    config = AgentConfig.model_validate(
        {
            "model": {"provider": "scripted", "script": script},
            "instructions": "You fetch and store things.",
            "toolsets": ["sized"],
            "tool_policy": {"on_indeterminate": "fail", **policy},
        }
    )
    return Agent(name, config, {t.name: t for t in sized.tools})


def _bytes_per_turn(history: WorkflowHistory) -> list[int]:
    """History bytes from each model turn's scheduling to the next one's."""
    turns: list[int] = []
    for event in history.events:
        scheduled = event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        if scheduled and event.activity_task_scheduled_event_attributes.activity_type.name == "call_model":
            turns.append(0)
        if turns:
            turns[-1] += event.ByteSize()
    return turns


async def _model_inputs(history: WorkflowHistory) -> list[ModelCallInput]:
    inputs = []
    for event in history.events:
        attributes = event.activity_task_scheduled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and (
            attributes.activity_type.name == "call_model"
        ):
            [value] = await pydantic_data_converter.decode(attributes.input.payloads, [ModelCallInput])
            inputs.append(value)
    return inputs


async def test_history_grows_by_what_each_turn_adds(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    turns = 60
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "fetch_text", "arguments": {"size": 2000}}]} for _ in range(turns)
    ]
    script.append({"final": "fetched {{ results.fetch_text }}"})
    registry = AgentRegistry({"long": _agent("long", script)})
    async with running_worker(temporal_env.client, ledger, registry) as h:
        handle = await h.start("long", "{}", max_turns=turns + 1)
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.turns == turns + 1
    assert result.final == "fetched " + "x" * 2000  # the model still saw the whole conversation
    per_turn = _bytes_per_turn(history)
    assert len(per_turn) == turns + 1
    # Inline, turn 50 would carry ~50 earlier results (~100 kB); by reference it carries its own.
    middle = per_turn[5:-1]  # the last turn also holds the run's result
    assert max(middle) < 1.3 * min(middle), per_turn
    assert max(middle) < 8_000, per_turn
    inputs = await _model_inputs(history)
    assert all(i.by_reference for i in inputs)
    assert [len(i.messages) for i in inputs] == [2] + [2] * turns  # system+user, then assistant+tool
    assert [i.length for i in inputs] == [2 * n for n in range(turns + 1)]


async def test_oversized_results_reach_the_model_as_errors_and_are_not_kept(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    SENDS.clear()
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "fetch_text", "arguments": {"size": 5000}}]},
        {"tool_calls": [{"name": "store_blob", "arguments": {"size": 5000}}]},
        {"final": "read: {{ results.fetch_text }} / write: {{ results.store_blob }}"},
    ]
    registry = AgentRegistry({"capped": _agent("capped", script, max_result_bytes=4096)})
    async with running_worker(temporal_env.client, ledger, registry) as h:
        run_id = f"run-{uuid.uuid4().hex[:10]}"
        handle = await h.start("capped", "{}", run_id=run_id)
        result = await handle.result()
        history = await handle.fetch_history()

    read_part, write_part = result.final.split(" / ")
    assert "5002 bytes, over this agent's cap of 4096 bytes" in read_part
    assert '"ok": false' in read_part
    assert "over this agent's cap of 4096 bytes" in write_part
    # The write took effect once and the ledger says so; only its answer was dropped.
    key = f"{run_id}:call_1_0"
    assert SENDS == [key]
    record = await ledger.get(key, with_events=False)
    assert record.status is Status.COMPLETED
    assert set(record.result) == {"result_omitted"}
    assert "y" * 100 not in json.dumps(history.to_json_dict())


def _message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_stored_conversations_are_immutable_and_per_run(ledger: Ledger) -> None:
    conversations = Conversations(ledger)
    head = await conversations.extend(
        tenant="acme", run_id="r1", head=None, length=0, messages=[_message("a"), _message("b")]
    )
    again = await conversations.extend(
        tenant="acme", run_id="r1", head=None, length=0, messages=[_message("a"), _message("b")]
    )
    assert again == head  # a retried activity writes nothing new
    other = await conversations.extend(
        tenant="acme", run_id="r2", head=None, length=0, messages=[_message("a")]
    )
    longer = await conversations.extend(
        tenant="acme", run_id="r1", head=head, length=2, messages=[_message("c")]
    )
    assert await conversations.read(longer, length=3) == [_message("a"), _message("b"), _message("c")]
    assert await conversations.read(other, length=1) == [_message("a")]
    with pytest.raises(ConversationMissingError):
        await conversations.read(longer, length=4)
    with pytest.raises(ConversationMissingError):
        await conversations.read("0" * 64, length=1)
    # A reset that branches off an earlier head keeps both branches intact.
    branch = await conversations.extend(
        tenant="acme", run_id="r1", head=head, length=2, messages=[_message("d")]
    )
    assert await conversations.read(branch, length=3) == [_message("a"), _message("b"), _message("d")]
    assert await conversations.read(longer, length=3) == [_message("a"), _message("b"), _message("c")]


forgetful = Toolset("forgetful")
_DSN: list[str] = []


@forgetful.tool(read())
async def lose_the_conversation(run_id: str) -> str:
    """Delete the run's stored conversation, as a failover to a standby that lacked it would."""
    conn = await asyncpg.connect(_DSN[0])
    try:
        # A purge's guard (ledger/definitions/conversation_retention.sql) refuses any other DELETE;
        # a failover loses rows without a DELETE, so the test goes around the trigger as a replica.
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("DELETE FROM conversation_messages WHERE run_id = $1", run_id)
    finally:
        await conn.close()
    return "gone"


async def test_a_conversation_the_ledger_lost_is_stored_again_and_the_run_goes_on(
    temporal_env: WorkflowEnvironment, ledger: Ledger, database_url: str
) -> None:
    _DSN[:] = [database_url]
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    config = AgentConfig.model_validate(
        {
            "model": {
                "provider": "scripted",
                "script": [
                    {"tool_calls": [{"name": "lose_the_conversation", "arguments": {"run_id": run_id}}]},
                    {"final": "done after {{ results.lose_the_conversation }}"},
                ],
            },
            "toolsets": ["forgetful"],
        }
    )
    registry = AgentRegistry({"forgetful": Agent("forgetful", config, {t.name: t for t in forgetful.tools})})
    async with running_worker(temporal_env.client, ledger, registry) as harness:
        handle = await harness.start("forgetful", "{}", run_id=run_id)
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.final == "done after gone"
    inputs = await _model_inputs(history)
    # Turn 2 was asked by reference, found its head gone, and was asked again with every message.
    assert [(i.head is None, i.length, len(i.messages)) for i in inputs] == [
        (True, 0, 1),
        (False, 1, 2),
        (True, 0, 3),
    ]
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval("SELECT count(*) FROM conversation_messages WHERE run_id = $1", run_id)
    finally:
        await conn.close()
    assert stored == 3
