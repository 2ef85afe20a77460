"""The OpenAI Agents SDK on Temporal with onceflow's writes (onceflow/adapters/openai_agents.py), on
the real Temporal dev server and a real PostgreSQL ledger. The model is a scripted implementation of
the SDK's Model interface; effects are counted at the in-process downstream, which honours no key."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from onceflow import OnceflowPlugin
from onceflow.adapters.openai_agents import write_tool
from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import HELD_KEYS, PHASE, TENANT, UNRESOLVED_KEYS
from onceflow.runtime.worker import build_worker
from onceflow.sdk.payloads import ResolveSignal, SettleResult
from tests.support.downstream import DOWNSTREAM
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.openai_agents_support import OPENAI_WRITES, lookup_order, openai_agents_plugin
from tests.support.openai_agents_workflow import OpenAIBillingWorkflow
from tests.support.operator_api import serving_api
from tests.support.pydantic_ai_agents import AdapterRunInput
from tests.support.waiting import eventually

# Histories recorded from this code and committed: later code must still replay them (runs in
# flight across a deploy). Re-record into this folder with `ONCEFLOW_RECORD_ADAPTER_HISTORIES=1` (the test below writes them).
HISTORIES = Path(__file__).parent / "histories_adapters" / "openai_agents"
RECORD_ENV = "ONCEFLOW_RECORD_ADAPTER_HISTORIES"
LOOKUP = {"tool": "lookup_order", "args": {"order_id": "o1"}}


def credit(tool: str = "issue_credit", call_id: str = "c1", account: str = "acct_o1") -> dict[str, Any]:
    return {"tool": tool, "args": {"account_id": account, "amount_cents": 500}, "id": call_id}


@pytest.fixture(scope="module")
async def client(temporal_env: WorkflowEnvironment) -> Client:
    """A client with the SDK's plugin (and so its data converter), as the adapter asks."""
    config = temporal_env.client.service_client.config
    return await Client.connect(
        config.target_host, namespace=temporal_env.client.namespace, plugins=[openai_agents_plugin()]
    )


@pytest.fixture
async def queue(client: Client, ledger: Ledger) -> AsyncIterator[str]:
    DOWNSTREAM.reset()
    registry = OPENAI_WRITES.register(AgentRegistry({}))
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    worker = build_worker(
        client,
        ledger,
        registry,
        task_queue=task_queue,
        workflows=[OpenAIBillingWorkflow],
        activities=[lookup_order],
    )
    async with worker:
        yield task_queue


async def start(
    client: Client, task_queue: str, script: list[list[dict[str, Any]]]
) -> WorkflowHandle[OpenAIBillingWorkflow, str]:
    return await client.start_workflow(
        OpenAIBillingWorkflow.run,
        AdapterRunInput(tenant="acme", script=script),
        id=f"oai-{uuid.uuid4().hex[:10]}",
        task_queue=task_queue,
    )


async def finished(handle: WorkflowHandle[OpenAIBillingWorkflow, str], timeout: float = 60) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await asyncio.wait_for(handle.result(), timeout))
    return result


async def test_a_write_is_keyed_by_workflow_and_call_id_sent_once_and_recorded(
    client: Client, ledger: Ledger, queue: str
) -> None:
    handle = await start(client, queue, [[LOOKUP], [credit()]])
    result = await finished(handle)
    key = f"{handle.id}:c1"
    record = await ledger.get(key)
    assert DOWNSTREAM.effects == {key: 1}
    assert record.status is Status.COMPLETED and record.agent == OPENAI_WRITES.agent_name
    assert result["results"][1] == {"ok": True, "result": record.result}
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(TENANT) == "acme" and attributes.get(PHASE) == "completed"


async def test_apply_then_hang_is_unknown_then_settled_by_the_reconcile_hook_with_one_effect(
    client: Client, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await start(client, queue, [[credit()]])
    result = await finished(handle)
    key = f"{handle.id}:c1"
    record = await ledger.get(key)
    assert DOWNSTREAM.effects == {key: 1} and DOWNSTREAM.received == {key: 1}
    assert record.status is Status.COMPLETED and record.settled_by == "reconciler"
    assert [e.to_status for e in record.events if e.to_status] == [
        Status.STARTED,
        Status.INDETERMINATE,
        Status.COMPLETED,
    ]
    assert result["results"][0]["settled_by"] == "reconciler"
    runs = activity_runs(await history_events(client, handle.id))
    assert len([r for r in runs if r.activity_type == "run_write_tool"]) == 1


async def test_a_reset_to_before_the_write_is_answered_from_the_ledger_and_sends_nothing(
    client: Client, ledger: Ledger, queue: str
) -> None:
    handle = await start(client, queue, [[LOOKUP], [credit()]])
    await finished(handle)
    key = f"{handle.id}:c1"
    sent = DOWNSTREAM.send_attempts
    described = await handle.describe()
    events = await history_events(client, handle.id)
    runs = activity_runs(events)
    write = next(i for i, r in enumerate(runs) if r.activity_type == "run_write_tool")
    proposing = runs[write - 1]  # the model call that asked for the credit
    assert "model" in proposing.activity_type and proposing.closed is not None
    point = workflow_task_completed_after(events, proposing.closed.event_id)
    new_run = await reset_run(client, handle.id, described.run_id, point, "test: before the write")
    output = await asyncio.wait_for(client.get_workflow_handle(handle.id, run_id=new_run).result(), 60)
    assert DOWNSTREAM.send_attempts == sent and DOWNSTREAM.effects == {key: 1}
    assert json.loads(output)["results"][1]["ok"] is True
    assert (await ledger.get(key, with_events=False)).attempt == 1


async def test_a_read_keeps_the_activity_retries(client: Client, ledger: Ledger, queue: str) -> None:
    DOWNSTREAM.read_failures_left = 2
    handle = await start(client, queue, [[{**LOOKUP, "id": "r1"}]])
    result = await finished(handle)
    assert DOWNSTREAM.read_attempts == 3
    assert result["results"][0]["account_id"] == "acct_o1"
    assert await ledger.find(f"{handle.id}:r1") is None


async def test_the_same_write_under_a_new_call_id_is_held_then_reuses_the_result(
    client: Client, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    twice = [credit("issue_credit_reusing", "a"), credit("issue_credit_reusing", "b")]
    handle = await start(client, queue, [twice])
    keys = [f"{handle.id}:a", f"{handle.id}:b"]

    async def one_unknown_one_held() -> bool:
        records = [await ledger.find(key) for key in keys]
        return sorted(r.status.value for r in records if r is not None) == ["held", "indeterminate"]

    await eventually(one_unknown_one_held, "one call unknown, the same call held behind it")
    records = {key: await ledger.get(key, with_events=False) for key in keys}
    unknown = next(k for k, r in records.items() if r.status is Status.INDETERMINATE)
    held = next(k for k, r in records.items() if r.status is Status.HELD)

    async def both_listed() -> bool:
        # The run lists them once its workflow task after each ledger write has run: later than the
        # ledger shows them.
        attributes = (await handle.describe()).typed_search_attributes
        return attributes.get(HELD_KEYS) == [held] and unknown in (attributes.get(UNRESOLVED_KEYS) or [])

    await eventually(both_listed, "the run's search attributes listing the held call and the unknown one")
    settled = await handle.execute_update(
        "resolve",
        ResolveSignal(key=unknown, status="completed", reason="found in billing", actor="alice"),
        result_type=SettleResult,
    )
    assert settled.outcome.status is Status.COMPLETED
    result = await finished(handle)
    assert DOWNSTREAM.effects == {unknown: 1} and DOWNSTREAM.received == {unknown: 1}
    assert (await ledger.get(held, with_events=False)).status is Status.COMPLETED
    assert all(r["ok"] for r in result["results"])


async def test_recorded_histories_replay_against_the_workflow_code(
    client: Client, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o2"] = "hang_after_apply"
    handles = [
        await start(client, queue, [[LOOKUP], [credit()]]),
        await start(client, queue, [[credit(account="acct_o2")]]),
    ]
    for handle in handles:
        await finished(handle)
    replayer = Replayer(
        workflows=[OpenAIBillingWorkflow],
        plugins=[openai_agents_plugin(), OnceflowPlugin()],
    )
    for handle in handles:
        history = await handle.fetch_history()
        if os.environ.get(RECORD_ENV):
            (HISTORIES / f"{history.workflow_id}.json").write_text(history.to_json())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


def test_write_tool_refuses_a_tool_that_is_not_a_write() -> None:
    with pytest.raises(ValueError, match="not a write tool"):
        write_tool(OPENAI_WRITES, "lookup_order")


async def test_committed_histories_replay_against_todays_workflow_code() -> None:
    from temporalio.client import WorkflowHistory

    recorded = sorted(HISTORIES.glob("*.json"))
    assert recorded, f"no recorded histories in {HISTORIES}"
    replayer = Replayer(
        workflows=[OpenAIBillingWorkflow],
        plugins=[openai_agents_plugin(), OnceflowPlugin()],
    )
    for path in recorded:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, f"{path.name}: {replayed.replay_failure!r}"


async def test_an_approval_gated_write_that_is_denied_is_never_sent_and_the_model_is_told(
    client: Client, ledger: Ledger, queue: str
) -> None:
    handle = await start(client, queue, [[credit("issue_credit_approved")]])
    key = f"{handle.id}:c1"

    async def awaiting() -> bool:
        return (await handle.describe()).typed_search_attributes.get(PHASE) == "awaiting_approval"

    await eventually(awaiting, "the run to wait for approval")
    async with serving_api(client, ledger, OPENAI_WRITES.register(AgentRegistry({}))) as api:
        async with await api.as_operator() as operator:
            answer = await operator.post(f"/v1/tool-executions/{key}/deny", json={"reason": "not owed"})
            assert answer.status_code == 200, answer.text
            result = await finished(handle)
    record = await ledger.get(key, with_events=False)
    assert record.status is Status.DENIED and DOWNSTREAM.send_attempts == 0
    assert result["results"][0]["ok"] is False
