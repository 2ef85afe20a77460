"""The operator API: find unknown calls, settle them, approve or deny, release a call that was never
sent, close a conflict, ask for compensation.

Every route is scoped to the tenant of the caller's token. Another tenant's key answers exactly as a
key that does not exist. The ledger decides every change (compare-and-set); the API then tells the
waiting workflow to read the ledger again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError

from onceflow.activities.compensation import COMPENSATION_SUFFIX, compensation_key
from onceflow.activities.held import wake_held
from onceflow.api import metrics
from onceflow.api.auth import Operator, RequireToken
from onceflow.api.console import install_console
from onceflow.api.inputs import checked_query_dependency, install_input_checks
from onceflow.api.models import (
    AcknowledgeRequest,
    ApproveRequest,
    CompensationStarted,
    DecisionResponse,
    ProblemDocument,
    ReasonRequest,
    ResolveRequest,
    ToolExecutionList,
    ToolExecutionView,
)
from onceflow.api.problems import PROBLEM_MEDIA_TYPE, Problem, install_problem_handlers
from onceflow.ledger import (
    ConflictNotOpenError,
    EventSource,
    EvidenceRequiredError,
    HeldCallError,
    InvalidTransitionError,
    Ledger,
    OperatorToken,
    OperatorTokens,
    RecordNotFoundError,
    ResendInFlightError,
    Status,
    ToolExecutionRecord,
)
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import CompensationInput, ConflictSignal, ResolveSignal
from onceflow.workflows.compensation import CompensationWorkflow, compensation_workflow_id

log = logging.getLogger("onceflow.api")

MAX_BODY_BYTES = 64 * 1024
# No whitespace, slashes or control characters (PostgreSQL cannot store NUL at all). Written so that
# Python and JSON Schema (ECMA-262) regexes mean the same set: their `\s` differ only in characters
# that are excluded explicitly anyway (C0/C1 controls and U+FEFF).
_KEY_CHAR = r"[^\s\x00-\x1f\x7f-\x9f\ufeff/]"
_KEY_START = r"[^\s\x00-\x1f\x7f-\x9f\ufeff:/]"
KEY_PATTERN = rf"^{_KEY_START}{_KEY_CHAR}{{0,254}}:{_KEY_CHAR}{{1,255}}$"
# Free-text filters: anything PostgreSQL can store.
_STORABLE = r"^[^\x00]*$"
_KEY = re.compile(KEY_PATTERN)
_LISTABLE = {Status.INDETERMINATE, Status.STARTED, Status.AWAITING_APPROVAL, Status.HELD}

# The patterns are published so clients (and fuzzers) know the contract; the handlers enforce them
# with problem types of their own (invalid-key, invalid-status) rather than a generic 400.
Key = Annotated[
    str,
    Path(
        description="`<run_id>:<tool_call_id>`",
        max_length=511,
        json_schema_extra={"pattern": KEY_PATTERN},
    ),
]
_STATUS_NAME = "(indeterminate|started|awaiting_approval|held)"
STATUS_FILTER_PATTERN = rf"^{_STATUS_NAME}(,{_STATUS_NAME})*$"


def _not_found(key: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"no tool execution with key {key!r}", key=key)


def _conflict(exc: InvalidTransitionError) -> Problem:
    winner = exc.settled_by
    when = exc.settled_at.isoformat() if exc.settled_at else None
    if winner:
        detail = f"{exc.key} was already decided by {winner} at {when}; it is {exc.current_status}"
    else:
        detail = f"{exc.key} is {exc.current_status}: {exc}"
    return Problem(
        409,
        "conflict",
        "Conflict",
        detail,
        key=exc.key,
        current_status=exc.current_status,
        decided_by=winner,
        decided_at=when,
    )


def _statuses(status: str | None) -> list[Status]:
    if status is None:
        # Held calls are asked for by name: each waits for another call, which is already listed,
        # and settling that one is what moves it (see docs/operations.md).
        return [Status.INDETERMINATE, Status.STARTED, Status.AWAITING_APPROVAL]
    try:
        statuses = [Status(s.strip()) for s in status.split(",") if s.strip()]
    except ValueError:
        statuses = []
    if not statuses or not set(statuses) <= _LISTABLE:
        raise Problem(
            400,
            "invalid-status",
            "Invalid status filter",
            f"status must be a comma-separated subset of {', '.join(sorted(_LISTABLE))}",
        )
    return statuses


def _held(exc: HeldCallError) -> Problem:
    return Problem(
        409,
        "held",
        "Held behind another call",
        str(exc),
        key=exc.key,
        current_status=exc.current_status,
        held_by=exc.held_by,
        hold_reason=exc.hold_reason,
    )


def _resend_in_flight(exc: ResendInFlightError) -> Problem:
    return Problem(
        409,
        "resend-in-flight",
        "A resend is on the wire",
        str(exc),
        key=exc.key,
        current_status=exc.current_status,
        resend=exc.resend,
        resend_by=exc.resend_actor,
        on_the_wire_until=exc.until.isoformat(),
        no_resend_before=exc.quiet_until.isoformat(),
    )


def _check_key(key: str) -> str:
    if not _KEY.fullmatch(key):  # fullmatch: `$` alone would let a trailing newline through
        raise Problem(
            400, "invalid-key", "Invalid key", "a key is `<run_id>:<tool_call_id>`, without spaces or slashes"
        )
    return key


def _require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise Problem(415, "unsupported-media-type", "Unsupported media type", "send application/json")


# POST routes take JSON only; checked before the body is parsed.
JSON = [Depends(_require_json)]
# Every route's query is checked (unknown or repeated parameters are refused) by inputs.py; this
# names the same check for routes that want to say so.
QUERY = [checked_query_dependency()]

# Every error is a problem document, and malformed input is 400, not FastAPI's default 422 shape.
# Declaring 4XX also keeps FastAPI from publishing that 422 body, which this API never sends.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "description": "400 malformed input (an unknown query parameter; `unreadable-body`: a body "
        "that is not JSON the ledger can store, e.g. NaN or Infinity), 401 no valid token, 404 no such "
        "key for your tenant, 409 already decided or not allowed in its state, 413 body too large "
        "(`unreadable-body`), 415 not JSON, "
        "422 refused by a business rule.",
        "content": {PROBLEM_MEDIA_TYPE: {"schema": ProblemDocument.model_json_schema()}},
    }
}


def create_app(*, ledger: Ledger, client: Client, registry: AgentRegistry, task_queue: str) -> FastAPI:
    app = FastAPI(
        title="onceflow operator API",
        version="1",
        description=__doc__,
        openapi_url="/openapi.json",
        responses=PROBLEMS,
    )
    app.state.ledger = ledger
    app.state.tokens = OperatorTokens(ledger)
    install_problem_handlers(app)
    # Before any route is added, so every route (and every later one) inherits the checks.
    install_input_checks(app, body_limit=MAX_BODY_BYTES)
    metrics.mount(app, ledger=ledger, registry=registry)  # /metrics, unauthenticated (onceflow.metrics)
    # Added last, so it runs first: no token, no other answer than 401.
    app.add_middleware(RequireToken, tokens=app.state.tokens)
    install_console(app, namespace=client.namespace)

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

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/tool-executions", response_model=ToolExecutionList, dependencies=QUERY)
    async def list_executions(
        operator: Operator,
        status: Annotated[
            str | None,
            Query(
                description="Comma-separated: indeterminate, started (owner gone), awaiting_approval, "
                "held (waiting for another call). Default: the first three.",
                json_schema_extra={"pattern": STATUS_FILTER_PATTERN},
            ),
        ] = None,
        conflict: Annotated[
            bool | None,
            Query(
                description="Calls whose late outcome contradicted the decision. Omitted: listed "
                "beside the unresolved calls; true: only those (they are settled, so `status` then "
                "matches none); false: none of them."
            ),
        ] = None,
        tool: Annotated[str | None, Query(max_length=200, pattern=_STORABLE)] = None,
        agent: Annotated[str | None, Query(max_length=200, pattern=_STORABLE)] = None,
        escalated: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=1000)] = None,
    ) -> ToolExecutionList:
        """The tenant's calls nobody can vouch for yet, and open conflicts, longest waiting first."""
        statuses = _statuses(status)
        if conflict:
            # Calls in conflict are settled: with a status filter too, nothing can match both.
            if status is not None:
                return ToolExecutionList(items=[], next_cursor=None)
            statuses = []
        try:
            page = await ledger.list_unresolved(
                operator.tenant,
                statuses=statuses,
                conflicts=conflict is not False,
                tool=tool,
                agent=agent,
                escalated=escalated,
                limit=limit,
                cursor=cursor,
            )
        except ValueError as exc:
            raise Problem(400, "invalid-request", "Invalid request", str(exc)) from exc
        return ToolExecutionList(
            items=[ToolExecutionView.of(r) for r in page.records], next_cursor=page.next_cursor
        )

    @app.get("/v1/tool-executions/{key}", response_model=ToolExecutionView)
    async def get_execution(key: Key, operator: Operator) -> ToolExecutionView:
        """One call and every event that happened to it, its replacement chain (`lineage`), and the
        calls held until it settles (`held_calls`)."""
        try:
            record = await ledger.get(_check_key(key), tenant=operator.tenant)
        except RecordNotFoundError:
            raise _not_found(key) from None
        lineage = await ledger.lineage(record.key, tenant=operator.tenant)
        held = await ledger.held_behind(record.key, tenant=operator.tenant)
        return ToolExecutionView.of(record, with_events=True, lineage=lineage, held_calls=held)

    async def decide(
        key: str, operator: OperatorToken, change: Callable[[str, str], Awaitable[ToolExecutionRecord]]
    ) -> DecisionResponse:
        """Make one decision in the ledger as `operator:<name>`, then tell the waiting workflow."""
        actor = f"operator:{operator.operator}"
        try:
            record = await change(_check_key(key), actor)
        except RecordNotFoundError:
            raise _not_found(key) from None
        except HeldCallError as exc:
            raise _held(exc) from None
        except ResendInFlightError as exc:
            raise _resend_in_flight(exc) from None
        except InvalidTransitionError as exc:
            raise _conflict(exc) from None
        except EvidenceRequiredError as exc:
            raise Problem(422, "evidence-required", "Evidence required", str(exc), key=key) from None
        signalled = await tell_workflow(record, actor)
        await wake_held(ledger, record, client)
        return DecisionResponse(execution=ToolExecutionView.of(record), run_signalled=signalled)

    @app.post("/v1/tool-executions/{key}/resolve", response_model=DecisionResponse, dependencies=JSON)
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

    @app.post("/v1/tool-executions/{key}/approve", response_model=DecisionResponse, dependencies=JSON)
    async def approve(key: Key, body: ApproveRequest, operator: Operator) -> DecisionResponse:
        """Approve a call that waits for approval: it is then sent, once, with the payload shown."""
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.approve(
                checked, actor=actor, reason=body.reason, tenant=operator.tenant, source=EventSource.API
            ),
        )

    @app.post("/v1/tool-executions/{key}/deny", response_model=DecisionResponse, dependencies=JSON)
    async def deny(key: Key, body: ReasonRequest, operator: Operator) -> DecisionResponse:
        """Deny a call that waits for approval: it is never sent, and the model is told."""
        return await decide(
            key,
            operator,
            lambda checked, actor: ledger.deny(
                checked, actor=actor, reason=body.reason, tenant=operator.tenant, source=EventSource.API
            ),
        )

    @app.post("/v1/tool-executions/{key}/release", response_model=DecisionResponse, dependencies=JSON)
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

    @app.post("/v1/tool-executions/{key}/nudge", response_model=DecisionResponse)
    async def nudge(key: Key, operator: Operator) -> DecisionResponse:
        """Ask the workflow waiting on this call to read the ledger now. Decides nothing: for a run
        that missed the signal of a decision (it would also find it at its next slow re-read)."""
        try:
            record = await ledger.get(_check_key(key), with_events=False, tenant=operator.tenant)
        except RecordNotFoundError:
            raise _not_found(key) from None
        signalled = await tell_workflow(record, f"operator:{operator.operator}")
        return DecisionResponse(execution=ToolExecutionView.of(record), run_signalled=signalled)

    @app.post(
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
                _check_key(key),
                actor=actor,
                status=Status(body.status),
                reason=body.reason,
                evidence=body.evidence,
                tenant=operator.tenant,
                source=EventSource.API,
            )
        except RecordNotFoundError:
            raise _not_found(key) from None
        except ConflictNotOpenError as exc:
            raise Problem(
                409, "no-open-conflict", "No open conflict", str(exc), key=key, decided_by=exc.cleared_by
            ) from None
        try:
            await client.get_workflow_handle(record.run_id).signal(
                "conflict", ConflictSignal(key=record.key, detail=f"acknowledged by {actor}", open=False)
            )
            signalled = True
        except RPCError as exc:
            log.info("run %s not told that %s was acknowledged: %s", record.run_id, key, exc.message)
            signalled = False
        return DecisionResponse(execution=ToolExecutionView.of(record), run_signalled=signalled)

    @app.post(
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
            record = await ledger.get(_check_key(key), with_events=False, tenant=operator.tenant)
        except RecordNotFoundError:
            raise _not_found(key) from None
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
            raise _conflict(exc) from None
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

    return app
