"""An operator's decisions: settle, approve, deny, release, acknowledge a conflict, or only nudge.

The ledger decides each change (compare-and-set); the waiting workflow is then told to read it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from temporalio.client import Client
from temporalio.service import RPCError

from onceflow.activities.compensation import COMPENSATION_SUFFIX
from onceflow.activities.held import wake_held
from onceflow.api import errors
from onceflow.api.auth import Operator
from onceflow.api.models import (
    AcknowledgeRequest,
    ApproveRequest,
    DecisionResponse,
    ReasonRequest,
    ResolveRequest,
    ToolExecutionView,
)
from onceflow.api.routes.params import JSON, Key, check_key
from onceflow.ledger import (
    ConflictNotOpenError,
    EventSource,
    EvidenceRequiredError,
    HeldCallError,
    InvalidTransitionError,
    Ledger,
    OperatorToken,
    RecordNotFoundError,
    RepeatedDecision,
    ResendInFlightError,
    Status,
    ToolExecutionRecord,
)
from onceflow.sdk.payloads import ConflictSignal, ResolveSignal
from onceflow.workflows.compensation import compensation_workflow_id

log = logging.getLogger("onceflow.api")


def router(*, ledger: Ledger, client: Client) -> APIRouter:
    routes = APIRouter()

    async def tell_workflow(record: ToolExecutionRecord, actor: str) -> bool:
        """Nudge the workflow waiting on this call to read the ledger. A finished one is fine."""
        if record.key.endswith(COMPENSATION_SUFFIX):
            workflow_id = compensation_workflow_id(record.key.removesuffix(COMPENSATION_SUFFIX))
        else:
            workflow_id = record.run_id
        try:
            await client.get_workflow_handle(workflow_id).signal(
                "resolve", ResolveSignal(key=record.key, actor=actor)
            )
        except RPCError as exc:
            log.info("workflow %s not signalled about %s: %s", workflow_id, record.key, exc.message)
            return False
        return True

    async def decide(
        key: str, operator: OperatorToken, change: Callable[[str, str], Awaitable[ToolExecutionRecord]]
    ) -> DecisionResponse:
        """Make one decision in the ledger as `operator:<name>`, then tell the waiting workflow."""
        actor = f"operator:{operator.operator}"
        try:
            record = await change(check_key(key), actor)
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        except HeldCallError as exc:
            raise errors.held(exc) from None
        except ResendInFlightError as exc:
            raise errors.resend_in_flight(exc) from None
        except InvalidTransitionError as exc:
            raise errors.conflict(exc) from None
        except EvidenceRequiredError as exc:
            raise errors.evidence_required(exc, key) from None
        signalled = await tell_workflow(record, actor)
        await wake_held(ledger, record, client)
        return DecisionResponse(
            execution=ToolExecutionView.of(record),
            run_signalled=signalled,
            repeated=isinstance(record, RepeatedDecision),
        )

    @routes.post("/v1/tool-executions/{key}/resolve", response_model=DecisionResponse, dependencies=JSON)
    async def resolve(key: Key, body: ResolveRequest, operator: Operator) -> DecisionResponse:
        """Settle an unknown call as completed or failed. Of two operators, the first wins.

        A held call cannot be settled (409 `held`, naming the call it waits for), nor a call whose
        resend is on the wire (409 `resend-in-flight`, naming the resend and when its lease ends). Settling a call
        that draws on a budget as failed releases its amount and needs `evidence` (422 otherwise).
        """
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.settle(
                checked,
                status=Status(body.status),
                actor=actor,
                reason=body.reason,
                evidence=body.evidence,
                result=body.result,
                tenant=operator.tenant,
                source=EventSource.API,
            ),
        )

    @routes.post("/v1/tool-executions/{key}/approve", response_model=DecisionResponse, dependencies=JSON)
    async def approve(key: Key, body: ApproveRequest, operator: Operator) -> DecisionResponse:
        """Approve a call that waits for approval: it is then sent, once, with the payload shown."""
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.approve(
                checked, actor=actor, reason=body.reason, tenant=operator.tenant, source=EventSource.API
            ),
        )

    @routes.post("/v1/tool-executions/{key}/deny", response_model=DecisionResponse, dependencies=JSON)
    async def deny(key: Key, body: ReasonRequest, operator: Operator) -> DecisionResponse:
        """Deny a call that waits for approval: it is never sent, and the model is told."""
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.deny(
                checked, actor=actor, reason=body.reason, tenant=operator.tenant, source=EventSource.API
            ),
        )

    @routes.post("/v1/tool-executions/{key}/release", response_model=DecisionResponse, dependencies=JSON)
    async def release(key: Key, body: ReasonRequest, operator: Operator) -> DecisionResponse:
        """Release a call that was never sent: held, or approved and not yet claimed by its run.

        It is settled failed (`released`, final): it frees its entity slot and budget amount, and
        its run is told it did not take effect. Of two operators, the first wins (409 naming them).
        A call still awaiting approval is denied instead (409).
        """
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.release(
                checked, actor=actor, reason=body.reason, tenant=operator.tenant, source=EventSource.API
            ),
        )

    @routes.post("/v1/tool-executions/{key}/nudge", response_model=DecisionResponse)
    async def nudge(key: Key, operator: Operator) -> DecisionResponse:
        """Ask the workflow waiting on this call to read the ledger now. Decides nothing: for a run
        that missed the signal of a decision (it would also find it at its next slow re-read)."""
        try:
            record = await ledger.get(check_key(key), with_events=False, tenant=operator.tenant)
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        signalled = await tell_workflow(record, f"operator:{operator.operator}")
        return DecisionResponse(execution=ToolExecutionView.of(record), run_signalled=signalled)

    @routes.post(
        "/v1/tool-executions/{key}/acknowledge-conflict",
        response_model=DecisionResponse,
        dependencies=JSON,
    )
    async def acknowledge_conflict(
        key: Key, body: AcknowledgeRequest, operator: Operator
    ) -> DecisionResponse:
        """Close a conflict by saying what the world is (`status`), with `evidence`.

        The status is final for the key: it is never sent again, and its budget counts it as the
        status says (a completed amount stays drawn). The same status as decided only closes the
        flag. The run's `OnceflowConflictKeys` search attribute drops the key (if the run is open).
        """
        actor = f"operator:{operator.operator}"
        try:
            record = await ledger.acknowledge_conflict(
                check_key(key),
                actor=actor,
                status=Status(body.status),
                reason=body.reason,
                evidence=body.evidence,
                tenant=operator.tenant,
                source=EventSource.API,
            )
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        except ConflictNotOpenError as exc:
            raise errors.no_open_conflict(exc, key) from None
        try:
            await client.get_workflow_handle(record.run_id).signal(
                "conflict", ConflictSignal(key=record.key, detail=f"acknowledged by {actor}", open=False)
            )
            signalled = True
        except RPCError as exc:
            log.info("run %s not told that %s was acknowledged: %s", record.run_id, key, exc.message)
            signalled = False
        # A twin held behind this call while its conflict was open may go now (or is reused, or
        # refused): its run asks again. Nothing is read unless some call was held behind it.
        await wake_held(ledger, record, client)
        return DecisionResponse(execution=ToolExecutionView.of(record), run_signalled=signalled)

    return routes
