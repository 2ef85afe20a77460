"""Workers taken away mid-run, and the answers on their way to them (issue #6, "more faults"), with
real processes throughout.

Workers are `python worker.py` processes; the billing service runs in a process of its own, honours
no idempotency key (`--no-dedup`) and records every request it receives, per key; workers reach it
through a proxy in this process that can lose the answers to writes. Each test then takes something
away:

- both worker processes on a task queue SIGKILLed at once: fresh workers finish every run;
- the billing service's answers to writes lost for a while: calls go unknown, and the reconcile
  hook settles each one truthfully once answers come back.

Invariants checked every time: one ledger row per tool call, each key's credit request received by
billing exactly once, and one effect for every call the ledger calls completed. PostgreSQL and the
Temporal server taken away are in test_faults_infrastructure.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.sdk.payloads import Phase
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.fault_runs import account_of, new_order
from tests.support.fault_stack import (
    Stack,
    check_every_run_completed_once,
    ledger_keys,
    processes,
    transitions,
    worker_env,
)
from tests.support.processes import ChildProcesses, kill_together
from tests.support.proxy import DroppingProxy

__all__ = ["processes"]  # the fixture, used by name


# -- 3. both workers SIGKILLed at once --------------------------------------------------------------------


async def test_both_workers_killed_at_once_and_fresh_workers_finish_every_run(
    temporal_env: WorkflowEnvironment,
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    ledger: Ledger,
    database_url: str,
    tmp_path: Path,
) -> None:
    env = worker_env(
        temporal=temporal_env.client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path
    )
    stack = Stack(temporal_env.client, billing, proxy, processes, env)
    first, second = stack.start_worker(), stack.start_worker()

    # Caught at different points: two credits applied with their answers held past the kill, two
    # credits held by the service before applying (they land after the kill), two runs just started.
    applied_first = [new_order() for _ in range(2)]
    applied_later = [new_order() for _ in range(2)]
    for order in applied_first:
        await billing.set_account_fault(account_of(order), "apply_then_hang", delay_seconds=30, times=1)
    for order in applied_later:
        await billing.set_account_fault(account_of(order), "slow", delay_seconds=3, times=1)
    held_keys = [(await stack.start_run(order))[1] for order in applied_first + applied_later]

    async def all_on_the_wire() -> bool:
        effects, sends = await billing.effects(), await stack.sends()
        return [sends[key] for key in held_keys] == [1] * 4 and all(
            effects.count(key) == 1 for key in held_keys[:2]
        )

    await stack.wait_for(all_on_the_wire, "four credits to be on the wire")
    for _ in range(2):
        await stack.start_run()

    kill_together([first, second])
    for key in held_keys:
        record = await ledger.find(key)
        assert record is not None and record.status is Status.STARTED
    assert [(await billing.effects()).count(key) for key in held_keys] == [1, 1, 0, 0]
    assert [(await stack.sends())[key] for key in held_keys] == [1, 1, 1, 1]
    for handle, _ in stack.runs:
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    stack.start_worker()
    stack.start_worker()
    results = await stack.results()

    records = await check_every_run_completed_once(stack, ledger, database_url, results)
    for key in held_keys:
        # Nobody knew whether the held credits landed; the reconcile hook found them.
        assert transitions(records[key]) == [Status.STARTED, Status.INDETERMINATE, Status.COMPLETED]
        assert records[key].settled_by == "reconciler"
    for key, record in records.items():
        if key not in held_keys:
            assert transitions(record)[-1] is Status.COMPLETED
            assert record.attempt == 1
    # Killed in flight or not, every call reached billing exactly once (checked above as well).
    assert await stack.sends() == {key: 1 for _, key in stack.runs}


# -- 4. the downstream loses every answer to a write for a while ------------------------------------------


async def test_lost_answers_leave_calls_unknown_until_reconcile_can_hear_the_truth(
    temporal_env: WorkflowEnvironment,
    billing: BillingClient,
    proxy: DroppingProxy,
    processes: ChildProcesses,
    ledger: Ledger,
    database_url: str,
    tmp_path: Path,
) -> None:
    env = worker_env(
        temporal=temporal_env.client, database_url=database_url, billing_url=proxy.url, tmp_path=tmp_path
    )
    stack = Stack(temporal_env.client, billing, proxy, processes, env)
    stack.start_worker()

    # Every answer to a write is lost from now on: credits and the reconcile hook's fences alike.
    proxy.dropping = True
    applied = {(await stack.start_run())[1] for _ in range(4)}
    refused_orders = [new_order() for _ in range(2)]
    for order in refused_orders:
        # The service says no (nothing applied), and that answer is lost too.
        await billing.set_account_fault(account_of(order), "reject", times=1)
    refused = {(await stack.start_run(order))[1] for order in refused_orders}

    async def all_unknown_and_paused() -> bool:
        for handle, key in stack.runs:
            record = await ledger.find(key)
            if record is None or record.status is not Status.INDETERMINATE:
                return False
            if (await handle.query(AgentRunWorkflow.status)).phase is not Phase.AWAITING_RECONCILIATION:
                return False
        return True

    await stack.wait_for(all_unknown_and_paused, "every call to be unknown and every run paused")

    async def reconcile_kept_trying() -> bool:
        # Every POST's answer is lost now, so each fence request billing received was one lost answer.
        fences = [
            (await billing.received_counts("POST", f"/idempotency-keys/{key}/fence")).total
            for _, key in stack.runs
        ]
        return all(n >= 2 for n in fences)

    await stack.wait_for(reconcile_kept_trying, "the reconcile hook to lose two answers per call")
    for _, key in stack.runs:
        record = await ledger.find(key)
        assert record is not None and record.status is Status.INDETERMINATE
    assert await stack.effects() == {**dict.fromkeys(applied, 1), **dict.fromkeys(refused, 0)}
    assert await stack.sends() == {key: 1 for _, key in stack.runs}

    proxy.dropping = False
    results = await stack.results()

    assert await ledger_keys(database_url, [h.id for h, _ in stack.runs]) == sorted(k for _, k in stack.runs)
    assert await stack.effects() == {**dict.fromkeys(applied, 1), **dict.fromkeys(refused, 0)}
    for (_, key), result in zip(stack.runs, results, strict=True):
        record = await ledger.get(key)
        credit = await billing.find_credit(key)
        assert record.settled_by == "reconciler"
        assert transitions(record)[:2] == [Status.STARTED, Status.INDETERMINATE]
        assert result.calls[-1].status == record.status.value
        if key in applied:
            assert record.status is Status.COMPLETED
            assert credit is not None and record.result == credit
            assert credit["credit_id"] in result.final
        else:
            assert (record.status, record.failure_kind) == (Status.FAILED, FailureKind.NOT_APPLIED)
            assert credit is None
    # One credit request per call: the truth came from the hook, never from sending again.
    assert await stack.sends() == {key: 1 for _, key in stack.runs}
