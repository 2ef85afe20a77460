"""Turning ledger records into what the workflow and the model are told."""

from __future__ import annotations

import os
import socket
from datetime import datetime

from temporalio import activity

from onceflow.ledger import Ledger, Status, ToolExecutionRecord
from onceflow.sdk.payloads import ToolOutcome


def outcome_from_record(record: ToolExecutionRecord, *, replayed: bool = False) -> ToolOutcome:
    # Settled by someone other than the attempt that sent it (an operator, a reconciler, a
    # deadline): the model is told who and why, not just a result that may be null.
    decided_by = record.settled_by if record.settled_by and record.settled_by != record.owner else None
    return ToolOutcome(
        settled_by=decided_by,
        settlement_reason=record.reason if decided_by else None,
        tool_call_id=record.tool_call_id,
        tool=record.tool_name,
        key=record.key,
        status=record.status,
        value=record.result,
        error=record.error or record.reason or record.hold_reason,
        failure_kind=record.failure_kind,
        replayed=replayed,
        reused_from=record.reused_from.rpartition(":")[2] if record.reused_from else None,
        held_by=record.held_by,
        settled_at=record.settled_at,
        lease_expires_at=record.lease_expires_at if record.status is Status.STARTED else None,
    )


async def as_told(ledger: Ledger, record: ToolExecutionRecord, *, replayed: bool) -> ToolOutcome:
    """What the model is told of a call the ledger answers for. A reused call points to the call
    that took effect: if an operator undid that one since, the model is told so, never that the
    effect stands (whether the reuse is replayed by a reset or read back by an inspection)."""
    outcome = outcome_from_record(record, replayed=replayed)
    if record.reused_from is None or record.status is not Status.COMPLETED:
        return outcome
    source = await ledger.find(record.reused_from)
    if source is None or source.status is not Status.COMPENSATED:
        return outcome
    undone = await ledger.get(source.key)
    by = next((e.actor for e in reversed(undone.events) if e.kind == "compensated"), None)
    return outcome.model_copy(
        update={
            "status": Status.COMPENSATED,
            "settled_by": by,
            "settlement_reason": f"the call whose result it was given ({source.tool_call_id}) took "
            "effect and was undone (compensated)",
        }
    )


def default_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_token(worker_identity: str) -> str:
    """Names this exact attempt: a reset run, a retry or another worker gets a different token."""
    info = activity.info()
    return f"{info.workflow_run_id}/{info.activity_id}#{info.attempt}@{worker_identity}"


def attempt_began() -> datetime:
    """When this activity attempt began. The ledger lets it retry no failure settled since: a retry
    the workflow decides on begins after the workflow heard the failure, so an attempt that began
    before it is one its workflow gave up on (an execution a reset replaced, whose attempt still
    runs), and the failure may be what the model was told since."""
    return activity.info().started_time


def attempt_deadline() -> datetime | None:
    """When the workflow gives up on this activity attempt: its start plus its start-to-close
    timeout. The ledger reserves nothing for an attempt past it (AttemptExpiredError)."""
    info = activity.info()
    if info.start_to_close_timeout is None:
        return None
    return info.started_time + info.start_to_close_timeout
