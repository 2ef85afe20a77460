"""The owner's side of one send: call the world once, say how it ended, and write that down.

The write activity sends this way; so do a reconciler's resend and a compensation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.activities.conflicts import tell_run_of_conflict
from onceflow.activities.held import wake_held
from onceflow.activities.outcomes import outcome_from_record
from onceflow.ledger import (
    EventSource,
    FailureKind,
    Ledger,
    LedgerUnavailableError,
    OutcomeIgnoredError,
    RecordNotFoundError,
    ToolExecutionRecord,
)
from onceflow.ledger.acknowledged import behind
from onceflow.runtime.constants import ERR_LEDGER_UNAVAILABLE, ERR_OUTCOME_NOT_RECORDED
from onceflow.sdk.payloads import OwnerOutcome, ToolOutcome, result_problem
from onceflow.sdk.tools import (
    ToolContext,
    ToolKeyNotFoundError,
    ToolNotAttemptedError,
    ToolRefusedError,
    ToolRejectedError,
    to_jsonable,
)


async def send_once(
    invoke: Callable[[], Awaitable[Any]], *, tool_name: str, timeout: float, context: ToolContext, owner: str
) -> OwnerOutcome:
    """Call the world once, under `timeout`, and say how it ended: completed, failed or unknown."""

    def outcome(status: Literal["completed", "failed", "indeterminate"], **fields: Any) -> OwnerOutcome:
        return OwnerOutcome(
            key=context.idempotency_key,
            owner=owner,
            tool=tool_name,
            tool_call_id=context.tool_call_id,
            status=status,
            **fields,
        )

    try:
        value = await asyncio.wait_for(invoke(), timeout)
    except ToolNotAttemptedError as exc:
        return outcome("failed", failure_kind=FailureKind.NOT_ATTEMPTED, error=str(exc) or "not attempted")
    except ToolKeyNotFoundError as exc:
        return outcome(
            "failed",
            failure_kind=FailureKind.REJECTED,
            error=str(exc) or "no record of the key",
            no_record_of_key=True,
        )
    except ToolRejectedError as exc:
        return outcome("failed", failure_kind=FailureKind.REJECTED, error=str(exc) or "rejected")
    except ToolRefusedError as exc:  # final: the ledger never re-reserves the key
        return outcome("failed", failure_kind=FailureKind.POLICY_REFUSED, error=str(exc) or "refused")
    except TimeoutError:
        return outcome("indeterminate", error=f"no answer within {timeout:g}s")
    except Exception as exc:  # an unknown error after the request may have left is unknown
        activity.logger.warning("tool %s raised %r; outcome unknown", tool_name, exc)
        return outcome("indeterminate", error=f"{type(exc).__name__}: {exc}"[:2000])
    unkeepable = result_problem(value)
    if unkeepable is not None:
        # It took effect; only its answer cannot be stored (jsonb has no NaN) nor passed on as
        # JSON. The completion is recorded, the answer is not, and the ledger and the model say so.
        return outcome("completed", value={"result_omitted": unkeepable_result(unkeepable)})
    return outcome("completed", value=to_jsonable(value))


async def record_outcome(ledger: Ledger, outcome: OwnerOutcome) -> ToolOutcome:
    """Write the owner's outcome down; the ledger's answer (not ours) is what comes back.

    A write call's outcome carries the row its reservation wrote (`reserved`). A row that is gone,
    or behind that reservation (an older attempt), was lost in a failover of the ledger: the call
    may have been sent, so it becomes a visible unknown call (ledger/lost_writes.py), never "not
    sent", and its reconcile hook or an operator settles it.
    """
    record: ToolExecutionRecord | None
    try:
        if outcome.status == "completed":
            record = await ledger.complete(
                outcome.key,
                owner=outcome.owner,
                result=outcome.value,
                result_reference=outcome.result_reference,
            )
        elif outcome.status == "failed":
            assert outcome.failure_kind is not None
            record = await ledger.fail(
                outcome.key,
                owner=outcome.owner,
                kind=outcome.failure_kind,
                error=outcome.error or "",
            )
        else:
            record = await ledger.mark_indeterminate(
                outcome.key,
                actor=outcome.owner,
                reason=outcome.error or "outcome unknown",
                source=EventSource.OWNER,
            )
    except RecordNotFoundError:
        if outcome.reserved is None:
            raise
        record = None
    except OutcomeIgnoredError:
        # Someone settled the call before our answer arrived; the ledger keeps theirs. If ours
        # contradicts it, the ledger flagged a conflict, and the run's search attributes say so.
        record = await ledger.find(outcome.key)
        if record is not None and record.has_conflict:
            await tell_run_of_conflict(record)
    if outcome.reserved is not None and behind(record, outcome.reserved):
        record = await ledger.restore_lost(outcome.reserved, actor=outcome.owner, reported=outcome.reported())
    elif record is None:
        raise RecordNotFoundError(outcome.key)
    await wake_held(ledger, record)
    return outcome_from_record(record)


async def record_sent_outcome(ledger: Ledger, outcome: OwnerOutcome) -> ToolOutcome:
    """`record_outcome` for the activity that sent the call: with the ledger away, the outcome goes
    to the workflow instead (ERR_OUTCOME_NOT_RECORDED, the outcome in its details), which records it
    with a retrying ledger step. The effect may have happened and its owner knows how it ended:
    dropping that, or leaving the workflow to find no row and guess, would lose what is known."""
    try:
        return await record_outcome(ledger, outcome)
    except LedgerUnavailableError as exc:
        raise ApplicationError(
            f"outcome not recorded: {exc}",
            outcome.model_dump(mode="json"),
            type=ERR_OUTCOME_NOT_RECORDED,
            non_retryable=True,
        ) from exc


async def unknown_if_failed_over(
    ledger: Ledger, lost_attempt_at: datetime, reserved: ToolExecutionRecord
) -> ToolExecutionRecord | None:
    """An earlier attempt at this call (a write, or a compensation) was lost and the ledger had no
    row for it. If the ledger failed over since that attempt began, the row may have been lost with
    the old primary after the attempt sent the call: this fresh reservation is then made an unknown
    call, not sent (its record is returned). None: no failover since, send as usual."""
    owner = reserved.owner or ""
    try:
        switch = await ledger.failover_since(lost_attempt_at)
        if switch is None:
            return None
        timeline, seen = switch
        why = (
            f"an earlier attempt at this call began at {lost_attempt_at.isoformat()} and was lost, and "
            f"the ledger failed over since (timeline {timeline}, first seen {seen.isoformat()}): "
            "that attempt's record may have been lost with the old primary after it was sent. Not "
            "sent again: unknown until its reconcile hook or an operator settles it"
        )
        detail = {"lost_attempt_at": lost_attempt_at.isoformat(), "timeline": timeline}
        return await ledger.hold_as_lost(reserved.key, owner=owner, why=why, detail=detail)
    except LedgerUnavailableError as exc:
        # Reserved, not sent: the next attempt releases this reservation by its owner token.
        raise ApplicationError(
            f"not sent: {exc}", {"owner": owner}, type=ERR_LEDGER_UNAVAILABLE, non_retryable=True
        ) from exc


def unkeepable_result(problem: str) -> str:
    """What the model is told when a tool's answer cannot be kept (see `result_problem`)."""
    return f"the tool's result cannot be kept or handed on: {problem}"
