"""Telling a run that one of its calls is in conflict, for its `OnceflowConflictKeys` attribute."""

from __future__ import annotations

from temporalio import activity
from temporalio.service import RPCError

from onceflow.ledger import ToolExecutionRecord
from onceflow.sdk.payloads import ConflictSignal


async def tell_run_of_conflict(record: ToolExecutionRecord) -> bool:
    """Signal `conflict` to the call's run (workflow id = run id). False if it could not be told.

    A run that has closed cannot take a signal: that is said in a log line and is fine, because the
    ledger's flag, not the search attribute, is the source of truth, and operators list it there.
    """
    detail = record.conflict_detail if isinstance(record.conflict_detail, dict) else {}
    text = (
        f"{detail.get('reported_by')} reports {detail.get('reported')}, "
        f"{detail.get('decided_by')} decided {detail.get('decided')}"
    )
    try:
        client = activity.client()
    except RuntimeError:  # pragma: no cover - only ever called from inside an activity
        return False
    try:
        await client.get_workflow_handle(record.run_id).signal(
            "conflict", ConflictSignal(key=record.key, detail=text)
        )
    except RPCError as exc:
        activity.logger.info(
            "run %s was not told of the conflict on %s (%s); the ledger keeps the flag",
            record.run_id,
            record.key,
            exc.message,
        )
        return False
    return True
