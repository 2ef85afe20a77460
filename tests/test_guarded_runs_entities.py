"""Guards in agent runs, across runs: two runs that refund the same order, held behind each other
and refused by the order's budget, and a held run woken when an operator settles its blocker over the
API. On a real Temporal dev server and a real PostgreSQL ledger. The same call again within one run
is in tests/test_guarded_runs.py.

Effects are counted at the downstream, which honours no idempotency key (tests/support/downstream.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import WAKE_ACTOR
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.runtime.agents import AgentRegistry
from onceflow.runtime.constants import HELD_KEYS
from onceflow.sdk.payloads import Phase, ResolveSignal
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.agents import refund_agent
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded_runs import ORDER, _phase_is, attribute, harness, write_keys
from tests.support.history import resolve_signals
from tests.support.operator_api import serving_api
from tests.support.waiting import eventually
from tests.workflow_harness import Harness

__all__ = ["harness"]  # the fixture, used by name


async def _woken(client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The keys a `resolve` signal from the guard's wake-up (activities/held.py) named, in order."""
    return [signal.key for signal in await resolve_signals(client, handle.id) if signal.actor == WAKE_ACTOR]


# -- entities and budgets across runs -----------------------------------------------------------------


async def test_a_second_refund_of_an_order_waits_for_the_first_then_the_budget_refuses_it(
    harness: Harness,
) -> None:
    """Two runs refund the same order in full. The second is held while the first is unknown; once the
    first is found applied, the order's refundable amount is spent and the second is refused, final."""
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    first = await harness.start("refund", ORDER)
    await eventually(
        lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, first.id)

    second = await harness.start("refund", ORDER)
    await eventually(lambda: _phase_is(second, Phase.HELD), "the second refund to be held")
    [second_key] = await write_keys(harness.ledger, second.id)
    assert (await harness.ledger.get(second_key)).held_by == first_key
    assert await attribute(second, HELD_KEYS) == [second_key]

    await first.signal(
        AgentRunWorkflow.resolve,
        ResolveSignal(key=first_key, status="completed", reason="found in billing", actor="ops"),
    )
    await asyncio.wait_for(first.result(), 30)
    # Nobody nudges the second run: settling the first woke it.
    result = await asyncio.wait_for(second.result(), 30)
    assert await _woken(harness.client, second) == [second_key]

    record = await harness.ledger.get(second_key)
    assert record.status is Status.FAILED and record.failure_kind is FailureKind.GUARD_REFUSED
    assert "would exceed the limit of 1250" in (record.error or "")
    assert [c.status for c in result.calls] == ["ok", "failed"]
    assert DOWNSTREAM.received == {first_key: 1}


async def test_a_strict_refund_is_refused_while_another_is_unknown(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    first = await harness.start("refund-strict", ORDER)
    await eventually(
        lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
    )
    [first_key] = await write_keys(harness.ledger, first.id)
    second = await harness.start("refund-strict", ORDER)
    result = await asyncio.wait_for(second.result(), 30)
    [second_key] = await write_keys(harness.ledger, second.id)
    record = await harness.ledger.get(second_key)
    assert record.failure_kind is FailureKind.GUARD_REFUSED and first_key in (record.error or "")
    assert DOWNSTREAM.received == {first_key: 1}
    assert result.calls[-1].status == "failed"


async def test_an_operator_settling_the_blocker_over_the_api_wakes_the_held_run(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    DOWNSTREAM.reset()
    agent = refund_agent("refund", "refund_order")
    registry = AgentRegistry({agent.name: agent})
    async with serving_api(temporal_env.client, ledger, registry) as api:
        DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
        first = await api.runs.start("refund", ORDER)
        await eventually(
            lambda: _phase_is(first, Phase.AWAITING_RECONCILIATION), "the first refund to be unknown"
        )
        [first_key] = await write_keys(ledger, first.id)
        second = await api.runs.start("refund", ORDER)
        await eventually(lambda: _phase_is(second, Phase.HELD), "the second refund to be held")
        [second_key] = await write_keys(ledger, second.id)

        async with await api.as_operator() as operator:
            held = await operator.get(f"/v1/tool-executions/{second_key}")
            assert held.json()["status"] == "held" and held.json()["held_by"] == first_key
            blocker = await operator.get(f"/v1/tool-executions/{first_key}")
            assert blocker.json()["held_calls"] == [second_key]
            settled = await operator.post(
                f"/v1/tool-executions/{first_key}/resolve",
                json={"status": "failed", "reason": "billing has no refund", "evidence": {"billing": "none"}},
            )
            assert settled.status_code == 200, settled.text
        DOWNSTREAM.modes["acct_o1"] = "ok"
        await asyncio.wait_for(second.result(), 30)
    # Woken by the API, and again by the first run when it read the decision: a nudge is idempotent.
    assert set(await _woken(temporal_env.client, second)) == {second_key}
    record = await ledger.get(second_key)
    assert record.status is Status.COMPLETED, "the first refund did not apply, so the second fits the budget"
    assert DOWNSTREAM.received == {first_key: 1, second_key: 1}
