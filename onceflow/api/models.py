"""What the operator API reads and writes. Unknown fields are refused, never ignored."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from onceflow.ledger import EventSource, Status, ToolExecutionEvent, ToolExecutionRecord

MAX_REASON = 2000

# What strip_whitespace removes (Unicode White_Space), spelled out: `\s` means slightly different
# things in the Rust, Python and JSON Schema (ECMA-262) regex dialects, and the published pattern
# must mean exactly what the server accepts.
_SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Something besides white space, and no NUL (U+0000), which PostgreSQL cannot store in text or jsonb:
# refused here as bad input rather than failing in the database as a 500.
REASON_PATTERN = rf"^[^\x00]*[^\x00{_SPACE}][^\x00]*$"

Reason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON, pattern=REASON_PATTERN),
]


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains_nul(v) for v in value)
    return False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResolveRequest(_Request):
    """Settle an unknown call: what happened, why you know, and what the other system said."""

    status: Literal["completed", "failed"]
    reason: Reason
    evidence: dict[str, Any] | None = Field(None, description="Any JSON object; no NUL in its text.")
    result: Any = Field(None, description="Any JSON; no NUL in its text.")

    @field_validator("evidence", "result")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if _contains_nul(value):
            raise ValueError("text may not contain NUL (\\u0000)")
        return value


class ReasonRequest(_Request):
    reason: Reason


class AcknowledgeRequest(_Request):
    """What the world is after a conflict, how you know, and what you did about it. The status is
    final for the key: it is never sent again, and budgets count it as this status says."""

    status: Literal["completed", "failed", "compensated"] = Field(
        description="completed: it took effect; failed: it did not; compensated: it took effect "
        "and was undone."
    )
    reason: Reason
    evidence: dict[str, Any] = Field(
        description="What you checked on the other side (a ticket, a query, a reference): a "
        "non-empty JSON object; no NUL in its text.",
        min_length=1,
    )

    @field_validator("evidence")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if _contains_nul(value):
            raise ValueError("text may not contain NUL (\\u0000)")
        return value


class ApproveRequest(_Request):
    reason: Reason | None = None


class EventView(BaseModel):
    at: datetime
    actor: str
    kind: str
    source: EventSource = Field(
        description="Where it came from. Only `api` events were made by an authenticated operator."
    )
    from_status: Status | None = None
    to_status: Status | None = None
    reason: str | None = None
    evidence: Any = None
    detail: Any = None

    @classmethod
    def of(cls, event: ToolExecutionEvent) -> EventView:
        return cls.model_validate(event.model_dump(exclude={"id", "key"}))


class LineageEntry(BaseModel):
    """One call of a replacement chain."""

    key: str
    tool_call_id: str
    status: Status
    failure_kind: str | None = None
    replaces: str | None = Field(None, description="The key of the call this one replaces.")
    amount: str | None = None
    created_at: datetime
    settled_at: datetime | None = None
    settled_by: str | None = None

    @classmethod
    def of(cls, record: ToolExecutionRecord) -> LineageEntry:
        return cls(
            key=record.key,
            tool_call_id=record.tool_call_id,
            status=record.status,
            failure_kind=record.failure_kind,
            replaces=record.replaces,
            amount=_decimal(record.amount),
            created_at=record.created_at,
            settled_at=record.settled_at,
            settled_by=record.settled_by,
        )


def _decimal(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


class ToolExecutionView(BaseModel):
    """A call as an operator sees it. The fencing token (owner) is shown; payload in full."""

    key: str
    run_id: str
    tool_call_id: str
    agent: str
    tool: str
    side_effect: str
    status: Status
    payload: dict[str, Any]
    payload_sha256: str
    attempt: int
    owner: str | None
    result: Any = None
    result_reference: str | None = None
    failure_kind: str | None = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None = None
    settled_by: str | None = None
    reason: str | None = None
    evidence: Any = None
    approved_by: str | None = None
    approved_at: datetime | None = None
    escalated_to: str | None = None
    escalated_at: datetime | None = None
    lease_expires_at: datetime | None = None
    conflict: ConflictView | None = Field(
        None, description="A late outcome that contradicted the decision; the decision stands."
    )
    # Guards (see docs/operations.md). Amounts are decimals written as strings, never floats.
    entity: str | None = Field(None, description="The business entity the call acts on.")
    entity_exclusive: bool = Field(
        False, description="At most one unresolved call of this tool per entity (across runs)."
    )
    amount: str | None = Field(None, description="What the call draws on its entity's budget.")
    budget_limit: str | None = Field(None, description="The limit the amount was checked against.")
    toolset: str | None = Field(None, description="The tool's toolset; entity slots and budgets are its own.")
    currency: str | None = Field(
        None, description="The amount's currency; each currency is a budget of its own."
    )
    replaces: str | None = Field(None, description="The key of the call this one replaces.")
    held_by: str | None = Field(
        None, description="While `held`: the call it waits for. Nothing was sent; decide that call."
    )
    hold_reason: str | None = None
    reused_from: str | None = Field(
        None, description="The call whose recorded result this one was given; nothing was sent."
    )
    events: list[EventView] | None = None
    lineage: list[LineageEntry] | None = Field(
        None,
        description="On one call: its replacement chain, oldest first, the call itself included "
        "(empty when it neither replaces nor was replaced). Absent in listings.",
    )
    held_calls: list[str] | None = Field(
        None, description="On one call: the keys of calls held until it settles. Absent in listings."
    )

    @classmethod
    def of(
        cls,
        record: ToolExecutionRecord,
        *,
        with_events: bool = False,
        lineage: list[ToolExecutionRecord] | None = None,
        held_calls: list[str] | None = None,
    ) -> ToolExecutionView:
        data = record.model_dump(
            exclude={
                "events",
                "tenant",
                "tool_name",
                "amount",
                "budget_limit",
                "holds_calls",
                *_CONFLICT_FIELDS,
            }
        )
        events = [EventView.of(e) for e in record.events] if with_events else None
        return cls(
            **data,
            tool=record.tool_name,
            amount=_decimal(record.amount),
            budget_limit=_decimal(record.budget_limit),
            conflict=ConflictView.of(record),
            events=events,
            lineage=None if lineage is None else [LineageEntry.of(r) for r in lineage],
            held_calls=held_calls,
        )


_CONFLICT_FIELDS = {"conflict_at", "conflict_detail", "conflict_cleared_at", "conflict_cleared_by"}


class ConflictView(BaseModel):
    open: bool = Field(description="True until an operator acknowledges it.")
    at: datetime
    detail: Any = Field(description="The late report, and who had decided what, and when.")
    acknowledged_at: datetime | None = None
    acknowledged_by: str | None = None

    @classmethod
    def of(cls, record: ToolExecutionRecord) -> ConflictView | None:
        if record.conflict_at is None:
            return None
        return cls(
            open=record.has_conflict,
            at=record.conflict_at,
            detail=record.conflict_detail,
            acknowledged_at=record.conflict_cleared_at,
            acknowledged_by=record.conflict_cleared_by,
        )


class ToolExecutionList(BaseModel):
    items: list[ToolExecutionView]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class DecisionResponse(BaseModel):
    """The record after a decision, and whether the run waiting on it was told."""

    execution: ToolExecutionView
    run_signalled: bool
    repeated: bool = Field(
        default=False,
        description="True: you had already made this very decision (a retried request, a second "
        "tab); nothing new was recorded.",
    )


class AssertionRequest(_Request):
    expires_in: int = Field(
        600, ge=1, le=3600, description="Seconds the assertion is good for (at most an hour)."
    )


class AssertionResponse(BaseModel):
    """An operator assertion: the API vouches that this operator of this tenant may settle this
    key with a `resolve` signal or update, until `expires_at`. It names no token."""

    key: str
    tenant: str
    operator: str
    expires_at: datetime
    assertion: str = Field(description="The `assertion` field of the resolve signal's input.")


class CompensationStarted(BaseModel):
    key: str
    compensation_key: str
    workflow_id: str


class ProblemDocument(BaseModel):
    """An error, as RFC 9457 problem details (`application/problem+json`)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="`urn:onceflow:problem:<slug>`; stable, safe to branch on.")
    title: str
    status: int
    detail: str
    key: str | None = None
    current_status: str | None = Field(None, description="On 409: where the call stands now.")
    decided_by: str | None = Field(None, description="On 409: who decided first.")
    decided_at: str | None = Field(None, description="On 409: when they decided.")
    decided_reason: str | None = Field(None, description="On 409: the reason they gave, if any.")
    held_by: str | None = Field(None, description="On 409 `held`: the call it waits for; decide that one.")


ToolExecutionView.model_rebuild()
