"""Calls a failover of the ledger lost after their run had moved on get a reconciler.

A worker that meets a new timeline reads again the calls it saw acknowledged, and restores the ones
the failover lost as unknown calls (ledger/lost_writes.py). When the call's activity was still
running, the run follows its unknown-call path itself. When the run had already been told how the
call ended, nothing of the run looks at it again: this starts the tool's ReconcileWorkflow for it
(id `reconcile:<key>`, at most one at a time), so a tool with a reconcile hook or a dedup window
settles it itself; a tool with neither stays in the operator queue, its `lost_in_failover` event
saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from onceflow.ledger import ToolExecutionRecord
from onceflow.runtime.agents import AgentRegistry
from onceflow.sdk.payloads import ReconcileInput
from onceflow.workflows.reconcile import ReconcileWorkflow, reconcile_workflow_id

log = logging.getLogger("onceflow.runtime.lost_calls")


def reconcile_restored(
    client: Client, registry: AgentRegistry, task_queue: str
) -> Callable[[list[ToolExecutionRecord]], Awaitable[None]]:
    """The listener a worker gives its ledger (`Ledger.on_restored`)."""

    async def start(records: list[ToolExecutionRecord]) -> None:
        for record in records:
            await _start_reconciler(client, registry, task_queue, record)

    return start


async def _start_reconciler(
    client: Client, registry: AgentRegistry, task_queue: str, record: ToolExecutionRecord
) -> None:
    try:
        spec = registry.agent(record.agent).spec()
    except LookupError as exc:
        log.warning("%s was lost in a failover and is unknown; no reconciler: %s", record.key, exc)
        return
    tool = spec.tools.get(record.tool_name)
    if tool is None or not (tool.has_reconcile or tool.has_dedup_window):
        log.warning("%s was lost in a failover and is unknown; only an operator can settle it", record.key)
        return
    policy = spec.policy
    request = ReconcileInput(
        key=record.key,
        run_id=record.run_id,
        tenant=record.tenant,
        agent=record.agent,
        tool=record.tool_name,
        deadline_seconds=policy.reconcile_deadline_seconds,
        initial_interval_seconds=policy.reconcile_initial_interval_seconds,
        max_interval_seconds=policy.reconcile_max_interval_seconds,
        tool_timeout_seconds=tool.timeout_seconds,
        escalation_owner=policy.escalation_owner,
    )
    try:
        await client.start_workflow(
            ReconcileWorkflow.run,
            request,
            id=reconcile_workflow_id(record.key),
            task_queue=task_queue,
            static_summary=f"reconcile {record.tool_name} {record.key} (lost in a failover)",
        )
    except WorkflowAlreadyStartedError:
        pass  # one is at it already
    except RPCError as exc:
        log.warning("%s was lost in a failover and is unknown; reconciler not started: %s", record.key, exc)
