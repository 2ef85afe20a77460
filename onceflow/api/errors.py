"""The ledger's refusals as problem documents: which status and problem type each one answers with,
and the facts it names (who decided first, which call holds this one, when a resend's lease ends).
The problem type itself is onceflow/api/problems.py."""

from __future__ import annotations

from onceflow.api.problems import Problem
from onceflow.ledger import (
    ConflictNotOpenError,
    EvidenceRequiredError,
    HeldCallError,
    InvalidTransitionError,
    ResendInFlightError,
)


def not_found(key: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"no tool execution with key {key!r}", key=key)


def conflict(exc: InvalidTransitionError) -> Problem:
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
        decided_reason=exc.reason if winner else None,
    )


def held(exc: HeldCallError) -> Problem:
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


def resend_in_flight(exc: ResendInFlightError) -> Problem:
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


def evidence_required(exc: EvidenceRequiredError, key: str) -> Problem:
    return Problem(422, "evidence-required", "Evidence required", str(exc), key=key)


def no_open_conflict(exc: ConflictNotOpenError, key: str) -> Problem:
    return Problem(409, "no-open-conflict", "No open conflict", str(exc), key=key, decided_by=exc.cleared_by)
