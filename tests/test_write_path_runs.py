"""The write path under the faults that used to make a call unknown that nobody had sent, in real runs
on a real Temporal dev server and a real PostgreSQL ledger; effects counted at a downstream that
honours no idempotency key (tests/support/downstream.py).

- A reservation that committed while its answer was lost: the next attempt knows it by the lost
  attempt's owner token, releases it as not attempted and sends once; the run does not fail on an
  unknown call that was never sent (on_indeterminate: fail).
- An unknown compensation settled in the ledger without a signal reaching its workflow: the workflow
  re-reads the ledger on its timer and marks the original compensated.
"""

from __future__ import annotations

import asyncio

from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from tests.support.agents import credit_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi
from tests.support.pg_proxy import AnswerDroppingProxy
from tests.workflow_harness import running_worker

ORDER = '{"order_id": "lost-reply"}'


async def test_a_reservation_whose_answer_was_lost_is_sent_once_not_made_unknown(
    temporal_env: WorkflowEnvironment, ledger: Ledger, database_url: str
) -> None:
    DOWNSTREAM.reset()
    agent = credit_agent("lost-reply", "issue_credit_unreconciled", "fail")
    async with AnswerDroppingProxy(database_url, marker=b"onceflow_guarded_reserve", times=1) as proxy:
        through_proxy = await Ledger.connect(proxy.dsn, max_size=4)
        try:
            registry = AgentRegistry({agent.name: agent})
            async with running_worker(temporal_env.client, through_proxy, registry) as harness:
                handle = await harness.start(agent.name, ORDER)
                result = await asyncio.wait_for(handle.result(), 30)
        finally:
            await through_proxy.close()
        assert proxy.dropped == 1, "the reservation's answer was never lost"

    key = f"{handle.id}:call_1_0"
    assert DOWNSTREAM.received == {key: 1}
    record = await ledger.get(key)
    assert (record.status, record.attempt) == (Status.COMPLETED, 2)
    kinds = [(e.kind, e.to_status) for e in record.events]
    assert kinds == [
        ("reserved", Status.STARTED),
        ("failed", Status.FAILED),  # released by the next attempt: the lost one sent nothing
        ("reserved", Status.STARTED),
        ("completed", Status.COMPLETED),
    ]
    assert "answer was lost" in (record.events[1].reason or "")
    assert "cr_1" in result.final


async def test_an_unknown_compensation_settled_without_a_signal_is_found_on_the_timer(
    operator_api: OperatorApi,
) -> None:
    """The void's answer is lost; an operator settles the compensation in the ledger and the signal
    to its workflow is lost too. The workflow reads the ledger on its own (the agent's recheck
    interval, 1 s here) and marks the original compensated."""
    handle = await operator_api.runs.start("credit-undoable", '{"order_id": "comp-timer"}')
    await asyncio.wait_for(handle.result(), 20)
    key = f"{handle.id}:call_1_0"
    DOWNSTREAM.modes["acct_comp-timer"] = "hang_void"
    async with await operator_api.as_operator(operator="alice") as alice:
        started = (await alice.post(f"/v1/tool-executions/{key}/compensate", json={"reason": "dup"})).json()
    compensation_key = started["compensation_key"]
    for _ in range(100):
        found = await operator_api.ledger.find(compensation_key)
        if found is not None and found.status is Status.INDETERMINATE:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the compensation never became unknown")
    await operator_api.ledger.settle(
        compensation_key, status=Status.COMPLETED, actor="operator:alice", reason="void seen in billing"
    )
    workflow = operator_api.runs.client.get_workflow_handle(started["workflow_id"])
    outcome = await asyncio.wait_for(workflow.result(), 20)
    assert (outcome["status"], outcome["original_status"]) == ("completed", "compensated")
    assert (await operator_api.ledger.get(key)).status is Status.COMPENSATED
