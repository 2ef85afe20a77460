"""A framework's run is one onceflow run, as AgentRunWorkflow's are: it claims its run id, it tells
the ledger what its model had heard, and its state survives continue-as-new. Both frameworks, on the
real Temporal dev server and PostgreSQL; effects counted at the in-process downstream, which honours
no key (tests/support/downstream.py), and what the model was told read from the run's own answer
(each scripted model's final text lists every tool result it was given).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.worker import build_worker
from tests.support.downstream import DOWNSTREAM
from tests.support.openai_agents_support import (
    OPENAI_DEFAULT_POLICY_WRITES,
    OPENAI_WRITES,
    lookup_order,
    openai_agents_plugin,
)
from tests.support.openai_agents_workflow import (
    OpenAIBillingWorkflow,
    OpenAIContinuingWorkflow,
    OpenAIDefaultPolicyWorkflow,
)
from tests.support.pydantic_ai_agents import (
    DEFAULT_POLICY_WRITES,
    WRITES,
    AdapterRunInput,
    ContinuingRunInput,
    agent_plugins,
)
from tests.support.pydantic_ai_workflow import (
    PydanticBillingWorkflow,
    PydanticContinuingWorkflow,
    PydanticDefaultPolicyWorkflow,
)


def credit(call_id: str, tool: str = "issue_credit") -> dict[str, Any]:
    return {"tool": tool, "args": {"account_id": "acct_o1", "amount_cents": 500}, "id": call_id}


@dataclass
class Adapter:
    """One framework's hosting workflows, served by a worker on a task queue of their own."""

    framework: str
    client: Client
    task_queue: str
    plain: Any  # the hosting workflow's run method
    continuing: Any  # the one that continues as new
    default_policy: Any  # the one whose writes declare no tool_policy

    async def start(
        self, run_id: str, script: list[list[dict[str, Any]]], workflow: Any = None
    ) -> WorkflowHandle[Any, str]:
        return await self.client.start_workflow(
            workflow or self.plain,
            AdapterRunInput(tenant="acme", script=script),
            id=run_id,
            task_queue=self.task_queue,
        )


@pytest.fixture(params=["pydantic_ai", "openai_agents"])
async def adapter(
    request: pytest.FixtureRequest, temporal_env: WorkflowEnvironment, ledger: Ledger
) -> AsyncIterator[Adapter]:
    DOWNSTREAM.reset()
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    if request.param == "pydantic_ai":
        client = temporal_env.client
        worker = build_worker(
            client,
            ledger,
            DEFAULT_POLICY_WRITES.register(WRITES.register(AgentRegistry({}))),
            task_queue=task_queue,
            workflows=[PydanticBillingWorkflow, PydanticContinuingWorkflow, PydanticDefaultPolicyWorkflow],
            plugins=agent_plugins(),
        )
        plain: Any = PydanticBillingWorkflow.run
        continuing: Any = PydanticContinuingWorkflow.run
        default_policy: Any = PydanticDefaultPolicyWorkflow.run
    else:
        config = temporal_env.client.service_client.config
        client = await Client.connect(
            config.target_host, namespace=temporal_env.client.namespace, plugins=[openai_agents_plugin()]
        )
        worker = build_worker(
            client,
            ledger,
            OPENAI_DEFAULT_POLICY_WRITES.register(OPENAI_WRITES.register(AgentRegistry({}))),
            task_queue=task_queue,
            workflows=[OpenAIBillingWorkflow, OpenAIContinuingWorkflow, OpenAIDefaultPolicyWorkflow],
            activities=[lookup_order],
        )
        plain, continuing = OpenAIBillingWorkflow.run, OpenAIContinuingWorkflow.run
        default_policy = OpenAIDefaultPolicyWorkflow.run
    async with worker:
        yield Adapter(request.param, client, task_queue, plain, continuing, default_policy)


async def told(handle: WorkflowHandle[Any, str]) -> list[dict[str, Any]]:
    """What the model was told, tool result by tool result, from its own final answer."""
    results: list[Any] = json.loads(await asyncio.wait_for(handle.result(), 60))["results"]
    return [json.loads(r) if isinstance(r, str) else r for r in results]


def _causes(error: BaseException | None) -> str:
    seen = []
    while error is not None:
        seen.append(f"{type(error).__name__}: {error} ({getattr(error, 'type', '')})")
        error = error.__cause__
    return " <- ".join(seen)


async def test_a_second_execution_under_a_reused_workflow_id_is_refused_at_its_first_write(
    adapter: Adapter, ledger: Ledger
) -> None:
    # Temporal starts a workflow id again once its run closed (the default reuse policy). Its keys
    # would be the first execution's: the model would be handed the first run's credit as its own.
    run_id = f"{adapter.framework}-{uuid.uuid4().hex[:8]}"
    first = await told(await adapter.start(run_id, [[credit("c1")]]))
    assert first[0]["ok"] is True
    again = await adapter.start(run_id, [[credit("c1")]])
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(again.result(), 60)
    causes = _causes(failed.value)
    assert "RunIdTaken" in causes and "a run id names one run forever" in causes, causes
    assert DOWNSTREAM.received == {f"{run_id}:c1": 1}
    record = await ledger.get(f"{run_id}:c1")
    assert record.status is Status.COMPLETED and record.attempt == 1
    assert [e.kind for e in record.events] == ["reserved", "completed"]  # the second touched nothing


async def test_a_repeat_the_model_asks_for_after_hearing_the_reused_twin_is_sent(adapter: Adapter) -> None:
    # Two equal credits in one answer: one is sent, the other is given its result (it did not hear
    # it) and told that another one, if owed, will be sent if asked again now. The model asks again,
    # having heard both: that one is a new effect and is sent, as it was told.
    run_id = f"{adapter.framework}-{uuid.uuid4().hex[:8]}"
    results = await told(await adapter.start(run_id, [[credit("a"), credit("b")], [credit("c")]]))
    sent = {key for key in DOWNSTREAM.received if key.endswith((":a", ":b"))}
    assert len(sent) == 1 and DOWNSTREAM.received[f"{run_id}:c"] == 1
    assert sum(DOWNSTREAM.received.values()) == 2, DOWNSTREAM.received
    twins = {r["reused_from"]: r for r in results[:2] if "reused_from" in r}
    assert len(twins) == 1, results  # the one not sent was given the other's result
    (reused,) = twins.values()
    assert "make the call again" in reused["settlement_reason"], reused  # the promise kept below
    again = results[2]
    assert again["ok"] is True and "reused_from" not in again, again
    assert again["result"]["credit_id"] != results[0]["result"]["credit_id"]


async def test_used_call_ids_and_what_was_heard_survive_continue_as_new(adapter: Adapter) -> None:
    # The run credits, answers, continues as new with its conversation and OnceflowState, and the
    # model credits again knowingly: a new key, heard, sent. Without the state the second credit is
    # handed the first one's result: under the first's key when the model repeats its call ids (as
    # Pydantic AI's test models do), or as an unheard repeat (the OpenAI Agents SDK keeps one item
    # per call id in a conversation, so its provider's ids never repeat).
    again = "c1" if adapter.framework == "pydantic_ai" else "c2"
    script = [[credit("c1")], [], [credit(again)], []]
    for pass_state in (True, False):
        DOWNSTREAM.reset()
        run_id = f"{adapter.framework}-{uuid.uuid4().hex[:8]}"
        handle = await adapter.client.start_workflow(
            adapter.continuing,
            ContinuingRunInput(tenant="acme", script=script, pass_state=pass_state),
            id=run_id,
            task_queue=adapter.task_queue,
        )
        first, second = await told(handle)
        assert first["ok"] is True and second["ok"] is True
        if pass_state:
            assert len(DOWNSTREAM.received) == 2 and set(DOWNSTREAM.received.values()) == {1}
            assert f"{run_id}:c1" in DOWNSTREAM.received
            assert second["result"]["credit_id"] != first["result"]["credit_id"]
            assert "reused_from" not in second
        else:  # what the state prevents: the first run's credit handed over as the second's
            assert DOWNSTREAM.received == {f"{run_id}:c1": 1}
            assert second["result"] == first["result"]


async def test_under_the_default_policy_an_unknown_write_fails_the_run_and_the_model_is_asked_nothing_more(
    adapter: Adapter, ledger: Ledger
) -> None:
    # Writes declared without a tool_policy take the plugin's, whose default is `fail` (docs/adapters.md
    # says what that does): the run fails at the first unknown call, naming it; the model's next
    # turn (a second credit) never comes; the call stays unknown in the ledger for its reconciler.
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    run_id = f"{adapter.framework}-{uuid.uuid4().hex[:8]}"
    tool = "issue_credit_unreconciled"
    handle = await adapter.start(run_id, [[credit("c1", tool)], [credit("c2", tool)]], adapter.default_policy)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    causes = _causes(failed.value)
    assert "CallIndeterminate" in causes and f"{run_id}:c1" in causes and "on_indeterminate: fail" in causes
    assert DOWNSTREAM.received == {f"{run_id}:c1": 1}
    assert (await ledger.get(f"{run_id}:c1", with_events=False)).status is Status.INDETERMINATE
    assert await ledger.find(f"{run_id}:c2") is None
