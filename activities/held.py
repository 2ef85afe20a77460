"""Waking held calls: when a call is settled, the runs of calls a guard held behind it ask again.

The held run also asks on its own timer, so a wake-up that does not arrive (a closed run, Temporal
unreachable for a moment) only delays the release; it never loses it.
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from onceflow.ledger import Ledger, ToolExecutionRecord
from onceflow.sdk.payloads import ResolveSignal

log = logging.getLogger(__name__)

# The actor of the nudge; a resolve signal without a status settles nothing and only makes a run ask.
WAKE_ACTOR = "onceflow:guard"


async def wake_held(ledger: Ledger, record: ToolExecutionRecord, client: Client | None = None) -> int:
    """If `record` is settled, nudge the run of every call held behind it; returns how many were told.

    `record` is the row as its settle returned it (or as read after that): its `holds_calls` mark
    says whether any call was ever held behind it, and only then are they looked up. The mark is
    written under the call's row lock by the reservation that holds another behind it, so a settle
    either sees it or made that reservation decide again (migration 0015).
    `client`: the Temporal client to signal with; inside an activity, the activity's own.
    """
    if not record.status.is_settled or not record.holds_calls:
        return 0
    held = await ledger.held_runs_behind(record.key, tenant=record.tenant)
    if not held:
        return 0
    client = client or activity.client()
    told = 0
    for key, run_id in held:  # the run as recorded, never a prefix cut out of the key
        try:
            await client.get_workflow_handle(run_id).signal(
                "resolve", ResolveSignal(key=key, actor=WAKE_ACTOR)
            )
            told += 1
        except RPCError as exc:
            # Also called outside an activity (the operator API): a plain logger, not the activity's.
            log.info("held call %s was not woken (%s); its run asks on its own timer", key, exc.message)
    return told
