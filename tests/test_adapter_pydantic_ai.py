"""A Pydantic AI agent on Temporal with onceflow's writes (onceflow/adapters/pydantic_ai.py), on the
real Temporal dev server and a real PostgreSQL ledger. The model is Pydantic AI's own FunctionModel
following a script; effects are counted at the in-process downstream, which honours no key
(tests/support/downstream.py). The worker process drill is in tests/test_adapter_processes.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from onceflow import OnceflowPlugin
from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import HELD_KEYS, PHASE, TENANT, UNRESOLVED_KEYS
from onceflow.runtime.worker import build_worker
from onceflow.sdk.payloads import ResolveSignal, SettleResult
from tests.support.downstream import DOWNSTREAM
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.support.operator_api import serving_api
from tests.support.pydantic_ai_agents import WRITES, AdapterRunInput, agent_plugins
from tests.support.pydantic_ai_workflow import PydanticBillingWorkflow, UnhostedPydanticWorkflow
from tests.support.waiting import eventually

# Histories recorded from this code and committed: later code must still replay them (runs in
# flight across a deploy). Re-record into this folder with `ONCEFLOW_RECORD_ADAPTER_HISTORIES=1` (the test below writes them).
HISTORIES = Path(__file__).parent / "histories_adapters" / "pydantic_ai"
RECORD_ENV = "ONCEFLOW_RECORD_ADAPTER_HISTORIES"
LOOKUP = {"tool": "lookup_order", "args": {"order_id": "o1"}}


def credit(tool: str = "issue_credit", call_id: str = "c1", account: str = "acct_o1") -> dict[str, Any]:
    return {"tool": tool, "args": {"account_id": account, "amount_cents": 500}, "id": call_id}


@asynccontextmanager
async def pydantic_worker(client: Client, ledger: Ledger) -> AsyncIterator[str]:
    registry = WRITES.register(AgentRegistry({}))
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    worker = build_worker(
        client,
        ledger,
        registry,
        task_queue=task_queue,
        workflows=[PydanticBillingWorkflow, UnhostedPydanticWorkflow],
        plugins=agent_plugins(),
    )
    async with worker:
        yield task_queue


@pytest.fixture
async def queue(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[str]:
    DOWNSTREAM.reset()
    async with pydantic_worker(temporal_env.client, ledger) as task_queue:
        yield task_queue


async def start(
    client: Client, task_queue: str, script: list[list[dict[str, Any]]], **kw: Any
) -> WorkflowHandle[PydanticBillingWorkflow, str]:
    return await client.start_workflow(
        PydanticBillingWorkflow.run,
        AdapterRunInput(tenant="acme", script=script, **kw),
        id=f"pai-{uuid.uuid4().hex[:10]}",
        task_queue=task_queue,
    )


async def finished(
    handle: WorkflowHandle[PydanticBillingWorkflow, str], timeout: float = 60
) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await asyncio.wait_for(handle.result(), timeout))
    return result


async def test_a_write_is_keyed_by_workflow_and_call_id_sent_once_and_recorded(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    handle = await start(temporal_env.client, queue, [[LOOKUP], [credit()]])
    result = await finished(handle)
    key = f"{handle.id}:c1"
    record = await ledger.get(key)
    assert DOWNSTREAM.effects == {key: 1}
    assert record.status is Status.COMPLETED and record.agent == WRITES.agent_name
    assert result["results"][1] == {"ok": True, "result": record.result}
    # The operator's view: onceflow's own search attributes, as on any run.
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(TENANT) == "acme" and attributes.get(PHASE) == "completed"


async def test_apply_then_hang_is_unknown_then_settled_by_the_reconcile_hook_with_one_effect(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await start(temporal_env.client, queue, [[credit()]])
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
    assert result["results"][0]["ok"] is True
    assert result["results"][0]["settled_by"] == "reconciler"
    write_runs = [
        r
        for r in activity_runs(await history_events(temporal_env.client, handle.id))
        if r.activity_type == "run_write_tool"
    ]
    assert len(write_runs) == 1  # one attempt: no retry of the write


async def test_a_reset_to_before_the_write_is_answered_from_the_ledger_and_sends_nothing(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    client = temporal_env.client
    handle = await start(client, queue, [[LOOKUP], [credit()]])
    await finished(handle)
    key = f"{handle.id}:c1"
    sent = DOWNSTREAM.send_attempts
    described = await handle.describe()
    events = await history_events(client, handle.id)
    runs = activity_runs(events)
    write = next(i for i, r in enumerate(runs) if r.activity_type == "run_write_tool")
    proposing = runs[write - 1]  # the model request that asked for the credit
    assert "request" in proposing.activity_type and proposing.closed is not None
    point = workflow_task_completed_after(events, proposing.closed.event_id)
    new_run = await reset_run(client, handle.id, described.run_id, point, "test: before the write")
    result = json.loads(
        await asyncio.wait_for(client.get_workflow_handle(handle.id, run_id=new_run).result(), 60)
    )
    assert DOWNSTREAM.send_attempts == sent and DOWNSTREAM.effects == {key: 1}
    assert result["results"][1]["ok"] is True
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED and record.attempt == 1


async def test_a_read_keeps_pydantic_ais_retries(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.read_failures_left = 2
    handle = await start(temporal_env.client, queue, [[LOOKUP]])
    result = await finished(handle)
    assert DOWNSTREAM.read_attempts == 3
    assert result["results"][0]["account_id"] == "acct_o1"
    assert await ledger.find(f"{handle.id}:pyd_ai_tool_call_id__lookup_order") is None


async def test_the_same_write_under_a_new_call_id_is_held_then_reuses_the_result(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    twice = [credit("issue_credit_reusing", "a"), credit("issue_credit_reusing", "b")]
    handle = await start(temporal_env.client, queue, [twice])
    keys = [f"{handle.id}:a", f"{handle.id}:b"]

    async def one_unknown_one_held() -> bool:
        records = [await ledger.find(key) for key in keys]
        return sorted(r.status.value for r in records if r is not None) == ["held", "indeterminate"]

    await eventually(one_unknown_one_held, "one call unknown, the same call held behind it")
    records = {key: await ledger.get(key, with_events=False) for key in keys}
    unknown = next(k for k, r in records.items() if r.status is Status.INDETERMINATE)
    held = next(k for k, r in records.items() if r.status is Status.HELD)

    async def attributes_show_both() -> bool:
        # The ledger knows first; the run lists a key once it has handled its activity's answer.
        attributes = (await handle.describe()).typed_search_attributes
        return attributes.get(HELD_KEYS) == [held] and unknown in (attributes.get(UNRESOLVED_KEYS) or [])

    await eventually(attributes_show_both, "the run's search attributes to list both calls")
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


async def test_a_resolve_for_a_key_the_run_does_not_have_is_refused(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await start(temporal_env.client, queue, [[credit("issue_credit_unreconciled")]])
    key = f"{handle.id}:c1"

    async def unknown() -> bool:
        record = await ledger.find(key)
        return record is not None and record.status is Status.INDETERMINATE

    await eventually(unknown, "the call to be unknown")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            "resolve", ResolveSignal(key=f"{handle.id}:nope", status="failed", reason="x", actor="alice")
        )
    assert "not a write call of this run" in str(refused.value.cause)
    await handle.execute_update(
        "resolve", ResolveSignal(key=key, status="failed", reason="not in billing", actor="alice")
    )
    result = await finished(handle)
    assert result["results"][0]["ok"] is False


async def test_recorded_histories_replay_against_the_workflow_code(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    client = temporal_env.client
    DOWNSTREAM.modes["acct_o2"] = "hang_after_apply"
    handles = [
        await start(client, queue, [[LOOKUP], [credit()]]),
        await start(client, queue, [[credit(account="acct_o2")]]),
    ]
    for handle in handles:
        await finished(handle)
    histories = [await handle.fetch_history() for handle in handles]
    if os.environ.get(RECORD_ENV):
        for history in histories:
            (HISTORIES / f"{history.workflow_id}.json").write_text(history.to_json())
    replayer = Replayer(
        workflows=[PydanticBillingWorkflow],
        plugins=[OnceflowPlugin(), *agent_plugins()],
        data_converter=client.data_converter,
    )
    for history in histories:
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure


def test_write_tools_refuse_a_declaration_with_nothing_to_route_or_no_agent() -> None:
    from onceflow.adapters.host import WriteTools
    from tests.support.downstream import lookup_order

    with pytest.raises(ValueError, match="nothing to route"):
        WriteTools([lookup_order], agent="reads-only")
    with pytest.raises(ValueError, match="agent must name"):
        WriteTools([w for w in WRITES.writes()], agent=" ")


async def test_an_approval_gated_write_waits_for_an_operator_then_is_sent_once(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    client = temporal_env.client
    handle = await start(client, queue, [[credit("issue_credit_approved")]])
    key = f"{handle.id}:c1"

    async def awaiting() -> bool:
        attributes = (await handle.describe()).typed_search_attributes
        return attributes.get(PHASE) == "awaiting_approval"

    await eventually(awaiting, "the run to wait for approval")
    assert (await ledger.get(key, with_events=False)).status is Status.AWAITING_APPROVAL
    assert DOWNSTREAM.send_attempts == 0
    async with serving_api(client, ledger, WRITES.register(AgentRegistry({}))) as api:
        async with await api.as_operator() as operator:
            listed = (await operator.get("/v1/tool-executions")).json()
            assert key in [item["key"] for item in listed["items"]]
            answer = await operator.post(f"/v1/tool-executions/{key}/approve", json={"reason": "ok"})
            assert answer.status_code == 200, answer.text
            result = await finished(handle)
            # Consumed once: approving it again sends nothing more.
            await operator.post(f"/v1/tool-executions/{key}/approve", json={"reason": "again"})
    record = await ledger.get(key)
    assert record.status is Status.COMPLETED and record.approved_by == "operator:alice"
    assert DOWNSTREAM.effects == {key: 1} and DOWNSTREAM.send_attempts == 1
    assert result["results"][0]["ok"] is True


async def test_beside_onceflows_own_loop_the_operator_api_sees_both_runs_alike(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    # One worker serves onceflow's agents and the Pydantic AI workflow; both runs pause on an unknown
    # credit; the API lists both the same way and settles both the same way.
    from onceflow.runtime.client import start_run
    from onceflow.sdk.payloads import AgentRunInput
    from tests.support.agents import support_registry

    DOWNSTREAM.reset()
    client = temporal_env.client
    registry = WRITES.register(support_registry())
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    async with serving_api(client, ledger, registry) as api:
        task_queue = api.runs.task_queue
        async with pydantic_worker(client, ledger) as pydantic_queue:
            own = await start_run(
                client,
                AgentRunInput(agent="credit-pause", tenant="acme", input=json.dumps({"order_id": "o1"})),
                run_id=f"run-{uuid.uuid4().hex[:10]}",
                task_queue=task_queue,
            )
            adapted = await start(client, pydantic_queue, [[credit("issue_credit_unreconciled")]])
            keys = {own.id: f"{own.id}:call_1_0", adapted.id: f"{adapted.id}:c1"}

            async def both_paused() -> bool:
                for handle in (own, adapted):
                    attributes = (
                        await client.get_workflow_handle(handle.id).describe()
                    ).typed_search_attributes
                    if attributes.get(PHASE) != "awaiting_reconciliation":
                        return False
                return True

            await eventually(both_paused, "both runs to pause on their unknown credit")
            async with await api.as_operator() as operator:
                listed = {
                    item["key"]: item for item in (await operator.get("/v1/tool-executions")).json()["items"]
                }
                assert set(keys.values()) <= set(listed)
                shapes = {key: sorted(listed[key]) for key in keys.values()}
                assert len({tuple(shape) for shape in shapes.values()}) == 1  # the same view of each
                for key in keys.values():
                    answer = await operator.post(
                        f"/v1/tool-executions/{key}/resolve",
                        json={"status": "failed", "reason": "not in billing"},
                    )
                    assert answer.status_code == 200 and answer.json()["run_signalled"] is True
            await asyncio.wait_for(own.result(), 60)
            result = await finished(adapted)
    assert result["results"][0]["ok"] is False
    for key in keys.values():
        record = await ledger.get(key, with_events=False)
        assert record.status is Status.FAILED and record.settled_by == "operator:alice"


async def test_committed_histories_replay_against_todays_workflow_code(
    temporal_env: WorkflowEnvironment,
) -> None:
    from temporalio.client import WorkflowHistory

    recorded = sorted(HISTORIES.glob("*.json"))
    assert recorded, f"no recorded histories in {HISTORIES}"
    replayer = Replayer(
        workflows=[PydanticBillingWorkflow],
        plugins=[OnceflowPlugin(), *agent_plugins()],
        data_converter=temporal_env.client.data_converter,
    )
    for path in recorded:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, f"{path.name}: {replayed.replay_failure!r}"


async def test_a_write_in_a_workflow_that_is_not_a_host_fails_the_run_clearly_and_sends_nothing(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    handle = await temporal_env.client.start_workflow(
        UnhostedPydanticWorkflow.run,
        AdapterRunInput(tenant="acme", script=[[credit()]]),
        id=f"pai-{uuid.uuid4().hex[:10]}",
        task_queue=queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    assert "must inherit onceflow.adapters.host.OnceflowHost" in str(failed.value.cause)
    assert DOWNSTREAM.send_attempts == 0
    assert await ledger.find(f"{handle.id}:c1") is None
