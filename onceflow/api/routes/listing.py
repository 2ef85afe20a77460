"""Reading the queue: the tenant's calls that need an operator, and one call with its history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from onceflow.api import errors
from onceflow.api.auth import Operator
from onceflow.api.models import ToolExecutionList, ToolExecutionView
from onceflow.api.problems import Problem
from onceflow.api.routes.params import (
    CURSOR_MAX,
    QUERY,
    STATUS_FILTER_PATTERN,
    STORABLE,
    TEXT_FILTER_MAX,
    Key,
    check_key,
    statuses,
)
from onceflow.ledger import Ledger, RecordNotFoundError


def router(*, ledger: Ledger) -> APIRouter:
    routes = APIRouter()

    @routes.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @routes.get("/v1/tool-executions", response_model=ToolExecutionList, dependencies=QUERY)
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
        tool: Annotated[str | None, Query(max_length=TEXT_FILTER_MAX, pattern=STORABLE)] = None,
        agent: Annotated[str | None, Query(max_length=TEXT_FILTER_MAX, pattern=STORABLE)] = None,
        escalated: bool | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=CURSOR_MAX)] = None,
    ) -> ToolExecutionList:
        """The tenant's calls nobody can vouch for yet, and open conflicts, longest waiting first."""
        wanted = statuses(status)
        if conflict:
            # Calls in conflict are settled: with a status filter too, nothing can match both.
            if status is not None:
                return ToolExecutionList(items=[], next_cursor=None)
            wanted = []
        try:
            page = await ledger.list_unresolved(
                operator.tenant,
                statuses=wanted,
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

    @routes.get("/v1/tool-executions/{key}", response_model=ToolExecutionView)
    async def get_execution(key: Key, operator: Operator) -> ToolExecutionView:
        """One call and every event that happened to it, its replacement chain (`lineage`), and the
        calls held until it settles (`held_calls`)."""
        try:
            record = await ledger.get(check_key(key), tenant=operator.tenant)
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        lineage = await ledger.lineage(record.key, tenant=operator.tenant)
        held = await ledger.held_behind(record.key, tenant=operator.tenant)
        return ToolExecutionView.of(record, with_events=True, lineage=lineage, held_calls=held)

    return routes
