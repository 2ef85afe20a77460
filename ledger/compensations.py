"""Compensation requests: an operator's ask, written by the API, that a compensation run consumes.

A compensation is started only by the operator API, which first appends `compensation_requested`
(actor `operator:<name>`, source `api`, the operator's reason) to the completed call. The
compensation workflow never trusts the actor in its input: its first step claims the latest request
for its own workflow run (`compensation_claimed`), and the actor it records on the original call is
the claimed request's. A run started by hand finds no request, or one another run already served,
and is refused before anything is reserved or sent.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, require_text
from onceflow.ledger.errors import (
    CompensationNotRequestedError,
    InvalidTransitionError,
    RecordNotFoundError,
    ReusedCallError,
)
from onceflow.ledger.records import to_event
from onceflow.ledger.status import EventSource, Status

REQUESTED = "compensation_requested"
CLAIMED = "compensation_claimed"
COMPENSATION_ACTOR = "compensation"


class CompensationRequest(BaseModel):
    """The operator's request a compensation run serves: who asked, why, and which event it is."""

    model_config = ConfigDict(frozen=True)

    event_id: int
    actor: str
    reason: str


class CompensationRequests(LedgerBase):
    async def request_compensation(
        self, key: str, *, actor: str, reason: str, tenant: str | None = None
    ) -> CompensationRequest:
        """Record that an operator asks to undo a completed call (the operator API's door only)."""
        actor = require_text(actor, "asking for a compensation (actor)")
        reason = require_text(reason, "asking for a compensation")
        async with self.connection("request_compensation", key=key) as conn, conn.transaction():
            row = await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key)
            if row is None or (tenant is not None and row["tenant"] != tenant):
                raise RecordNotFoundError(key)
            if Status(row["status"]) is not Status.COMPLETED:
                raise InvalidTransitionError(key, row["status"], "ask for a compensation")
            if row["reused_from"] is not None:
                raise ReusedCallError(key, "ask for a compensation", reused_from=row["reused_from"])
            await self.insert_event(
                conn, key, actor=actor, kind=REQUESTED, source=EventSource.API, reason=reason
            )
            event = await conn.fetchrow(queries.LATEST_EVENT_OF_KIND, key, REQUESTED)
        return CompensationRequest(event_id=event["id"], actor=actor, reason=reason)

    async def claim_compensation_request(self, key: str, *, workflow_run_id: str) -> CompensationRequest:
        """The request the compensation run `workflow_run_id` serves: the latest one for `key`,
        claimed by this run (again, when the step is retried) or by no run before.

        `CompensationNotRequestedError` when no operator asked, or the latest request was served by
        another run: ask the operator API again.
        """
        async with self.connection("claim_compensation_request", key=key) as conn, conn.transaction():
            if await conn.fetchrow(queries.SELECT_RECORD_FOR_UPDATE, key) is None:
                raise RecordNotFoundError(key)
            row = await conn.fetchrow(queries.LATEST_EVENT_OF_KIND, key, REQUESTED)
            if row is None:
                raise CompensationNotRequestedError(key)
            request = to_event(row)
            found = CompensationRequest(event_id=request.id, actor=request.actor, reason=request.reason or "")
            claim = await conn.fetchrow(queries.CLAIM_OF_REQUEST, key, request.id)
            if claim is not None:
                served_by = to_event(claim).detail.get("workflow_run_id")
                if served_by == workflow_run_id:
                    return found
                raise CompensationNotRequestedError(key, served_by=served_by)
            # Written by the compensation workflow on behalf of the operator who asked (the same
            # actor and source as the `compensated` event it may write later).
            await self.insert_event(
                conn,
                key,
                actor=request.actor,
                kind=CLAIMED,
                source=EventSource.COMPENSATION,
                reason=f"serving the compensation {request.actor} asked for",
                detail={
                    "request_event": request.id,
                    "requested_by": request.actor,
                    "workflow_run_id": workflow_run_id,
                },
            )
        return found

    async def claimed_compensation_request(self, key: str) -> CompensationRequest | None:
        """The request the latest compensation run claimed, or None (a run planned before claims)."""
        async with self.connection("claimed_compensation_request", key=key) as conn:
            claim = await conn.fetchrow(queries.LATEST_EVENT_OF_KIND, key, CLAIMED)
            if claim is None:
                return None
            request = await conn.fetchrow(
                queries.EVENT_OF_KEY, key, int(to_event(claim).detail["request_event"])
            )
        event = to_event(request)
        return CompensationRequest(event_id=event.id, actor=event.actor, reason=event.reason or "")
