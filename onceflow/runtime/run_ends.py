"""What Temporal says of runs that are not running: the answer a purge of stored conversations needs.

A conversation (ledger/conversations.py) is read by its run's model turns and by those a reset
replays; a reset needs the run's history, which the namespace keeps for its retention after the run
closes. `temporal_run_ends(client)` is the ledger's `RunEnds` (ledger/retention.py): for each run id,
the close time and the end of the history's retention, or that the history is gone. A running run,
and any run Temporal does not answer for plainly, is left out, so its conversation is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from onceflow.ledger.retention import RunEnd, RunEnds

# Describes in flight at once.
_CONCURRENCY = 16


async def namespace_retention(client: Client) -> timedelta:
    """How long the client's namespace keeps a closed run's history. Fails on an unknown namespace,
    which would otherwise answer "gone" for every run."""
    described = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=client.namespace)
    )
    return described.config.workflow_execution_retention_ttl.ToTimedelta()


async def temporal_run_ends(client: Client) -> RunEnds:
    """The RunEnds of `client`'s namespace (its retention read once, here)."""
    retention = await namespace_retention(client)
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(run_id: str) -> RunEnd | None:
        async with gate:
            try:
                described = await client.get_workflow_handle(run_id).describe()
            except RPCError as exc:
                if exc.status is RPCStatusCode.NOT_FOUND:
                    return RunEnd()  # closed so long ago that its history is gone
                raise
        if described.status in (None, WorkflowExecutionStatus.RUNNING):
            return None
        closed: datetime | None = described.close_time
        if closed is None:  # pragma: no cover - a closed run always has a close time
            return None
        return RunEnd(closed_at=closed, history_until=closed + retention)

    async def run_ends(run_ids: Sequence[str]) -> dict[str, RunEnd]:
        answers = await asyncio.gather(*(one(run_id) for run_id in run_ids))
        return {run_id: end for run_id, end in zip(run_ids, answers, strict=True) if end is not None}

    return run_ends
