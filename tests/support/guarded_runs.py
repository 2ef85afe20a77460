"""Agent runs with guarded tools, on the session's Temporal dev server and a fresh ledger: a worker
whose credit agents get a new tool call id on every model answer (as real providers give), and the
refund agents; what the runs reserved and show. Used by tests/test_guarded_runs.py,
tests/test_guarded_runs_entities.py and tests/test_held_after_resets.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.models import ScriptedModel
from onceflow.models.config import ScriptedConfig
from onceflow.runtime.agents import Agent, AgentRegistry
from onceflow.sdk.payloads import AgentRunResult, ModelCallInput, ModelTurn, Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import credit_agent, refund_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.history import activity_runs, history_events, reset_run, workflow_task_completed_after
from tests.workflow_harness import Harness, running_worker

ORDER = json.dumps({"order_id": "o1"})
CREDIT_TOOLS = {
    "hold": "issue_credit_unreconciled",
    "reuse": "issue_credit_reusing",
    "allow": "issue_credit_allowing",
}


class FreshIdModel:
    """The scripted conversation, with a new tool call id on every answer, as real providers give:
    asked again after a reset, it makes the same call under an id the run has not seen."""

    def __init__(self, agent: Agent) -> None:
        assert isinstance(agent.config.model, ScriptedConfig)
        self._scripted = ScriptedModel(agent.config.model.script)

    async def respond(self, request: ModelCallInput) -> ModelTurn:
        turn = await self._scripted.respond(request)
        calls = [call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:8]}"}) for call in turn.tool_calls]
        return turn.model_copy(update={"tool_calls": calls})


def fresh_id_agent(name: str, tool: str) -> Agent:
    scripted = credit_agent(name, tool, "pause")
    return Agent(name, scripted.config, scripted.tools, model=FreshIdModel(scripted))


@pytest.fixture
async def harness(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[Harness]:
    DOWNSTREAM.reset()
    agents = [fresh_id_agent(f"fresh-{intent}", tool) for intent, tool in CREDIT_TOOLS.items()]
    agents.append(fresh_id_agent("fresh-reuse-reconciled", "issue_credit_reusing_reconciled"))
    agents.append(fresh_id_agent("fresh-slow-reconciled", "issue_credit_slow_reconciled"))
    agents += [refund_agent("refund", "refund_order"), refund_agent("refund-strict", "refund_order_strict")]
    async with running_worker(temporal_env.client, ledger, AgentRegistry({a.name: a for a in agents})) as h:
        yield h


async def attribute(handle: WorkflowHandle[Any, Any], key: Any) -> Any:
    return (await handle.describe()).typed_search_attributes.get(key)


async def phase(handle: WorkflowHandle[Any, Any]) -> Phase:
    return (await handle.query(AgentRunWorkflow.status)).phase


async def write_keys(ledger: Ledger, run_id: str) -> list[str]:
    async with ledger.connection("test") as conn:
        rows = await conn.fetch(
            "SELECT key FROM tool_executions WHERE run_id = $1 ORDER BY created_at", run_id
        )
    return [row["key"] for row in rows]


async def reset_before_the_credit(
    client: Client, handle: WorkflowHandle[Any, Any], run_id: str
) -> WorkflowHandle[AgentRunWorkflow, AgentRunResult]:
    """Reset the run to just after its first model turn: the model is asked for the credit again."""
    events = await history_events(client, handle.id, run_id)
    first_model = next(r for r in activity_runs(events) if r.activity_type == "call_model")
    assert first_model.closed is not None
    point = workflow_task_completed_after(events, first_model.closed.event_id)
    new_run = await reset_run(client, handle.id, run_id, point, "test: the model is asked again")
    return client.get_workflow_handle_for(AgentRunWorkflow.run, handle.id, run_id=new_run)


async def _phase_is(handle: WorkflowHandle[Any, Any], wanted: Phase) -> bool:
    try:
        return await phase(handle) == wanted
    except Exception:  # the new run of a reset may not have answered its first query yet
        return False
