"""Undoing a completed call with its tool's compensation, as a workflow of its own."""

from __future__ import annotations

from fastapi import APIRouter, Response
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from onceflow.activities.compensation import compensation_key
from onceflow.api import errors
from onceflow.api.auth import Operator
from onceflow.api.models import CompensationStarted, ReasonRequest
from onceflow.api.problems import Problem
from onceflow.api.routes.params import JSON, Key, check_key
from onceflow.ledger import InvalidTransitionError, Ledger, RecordNotFoundError, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import CompensationInput
from onceflow.workflows.compensation import CompensationWorkflow, compensation_workflow_id


def router(*, ledger: Ledger, client: Client, registry: AgentRegistry, task_queue: str) -> APIRouter:
    routes = APIRouter()

    @routes.post(
        "/v1/tool-executions/{key}/compensate",
        response_model=CompensationStarted,
        status_code=202,
        dependencies=JSON,
    )
    async def compensate(
        key: Key, body: ReasonRequest, operator: Operator, response: Response
    ) -> CompensationStarted:
        """Undo a completed call with its tool's compensation. Asking twice starts it once."""
        try:
            record = await ledger.get(check_key(key), with_events=False, tenant=operator.tenant)
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        if record.status is not Status.COMPLETED:
            raise Problem(
                409,
                "not-compensable",
                "Not compensable",
                f"{key} is {record.status}; only a completed call can be compensated",
                key=key,
                current_status=record.status.value,
            )
        try:
            tool = registry.tool(record.agent, record.tool_name)
        except LookupError as exc:
            raise Problem(422, "unknown-tool", "Unknown tool", str(exc), key=key) from None
        if tool.compensation is None:
            raise Problem(
                422,
                "no-compensation",
                "No compensation",
                f"tool {tool.name!r} declares no compensation; it cannot be undone by onceflow",
                key=key,
            )
        actor = f"operator:{operator.operator}"
        try:
            # The workflow takes who asked from this event, never from its input.
            await ledger.request_compensation(key, actor=actor, reason=body.reason, tenant=operator.tenant)
        except InvalidTransitionError as exc:
            raise errors.conflict(exc) from None
        workflow_id = compensation_workflow_id(key)
        await client.start_workflow(
            CompensationWorkflow.run,
            CompensationInput(key=key, tenant=operator.tenant, actor=actor, reason=body.reason),
            id=workflow_id,
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"compensate {record.tool_name} {key}",
        )
        response.headers["Location"] = f"/v1/tool-executions/{compensation_key(key)}"
        return CompensationStarted(key=key, compensation_key=compensation_key(key), workflow_id=workflow_id)

    return routes
