"""Three identical writes in one answer of a framework that runs tool calls at once (Pydantic AI):
one is sent, one is held behind it, one is held behind the held one. When the first is settled, the
second is decided again into a reuse of its result, and that settle wakes the third at once, as any
other settle wakes the calls held behind it (activities/held.py), instead of leaving it to its timer.

Real parts: the Temporal dev server, a PostgreSQL ledger, Pydantic AI's own agent loop; effects are
counted at the in-process downstream, which honours no key.
"""

from __future__ import annotations

from temporalio.testing import WorkflowEnvironment

from onceflow.activities.held import WAKE_ACTOR
from onceflow.ledger import Ledger, Status
from onceflow.sdk.payloads import ResolveSignal, SettleResult
from tests.support.downstream import DOWNSTREAM
from tests.support.history import resolve_signals
from tests.support.waiting import eventually
from tests.test_adapter_pydantic_ai import credit, finished, queue, start

__all__ = ["queue"]  # the fixture, used by name


async def test_a_call_held_behind_a_held_one_is_woken_when_that_one_is_reused(
    temporal_env: WorkflowEnvironment, ledger: Ledger, queue: str
) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    thrice = [credit("issue_credit_reusing", call_id) for call_id in ("a", "b", "c")]
    handle = await start(temporal_env.client, queue, [thrice])
    keys = [f"{handle.id}:{call_id}" for call_id in ("a", "b", "c")]

    async def one_unknown_two_held() -> bool:
        records = [await ledger.find(key) for key in keys]
        return sorted(r.status.value for r in records if r is not None) == ["held", "held", "indeterminate"]

    await eventually(one_unknown_two_held, "one call unknown and the other two held")
    records = {key: await ledger.get(key, with_events=False) for key in keys}
    [unknown] = [k for k, r in records.items() if r.status is Status.INDETERMINATE]
    [first_held] = [k for k, r in records.items() if r.held_by == unknown]
    [second_held] = [k for k, r in records.items() if r.held_by == first_held]
    assert records[first_held].holds_calls, "the held call a later one waits for is marked"

    settled = await handle.execute_update(
        "resolve",
        ResolveSignal(key=unknown, status="completed", reason="found in billing", actor="alice"),
        result_type=SettleResult,
    )
    assert settled.outcome.status is Status.COMPLETED
    result = await finished(handle)

    assert DOWNSTREAM.received == {unknown: 1}, "one send for the three"
    for key in (first_held, second_held):
        record = await ledger.get(key, with_events=False)
        assert record.status is Status.COMPLETED and record.reused_from == unknown
    assert all(r["ok"] for r in result["results"])
    woken = [s.key for s in await resolve_signals(temporal_env.client, handle.id) if s.actor == WAKE_ACTOR]
    assert first_held in woken, "the settle of the unknown call woke the call held behind it"
    assert second_held in woken, "the reuse of the first held call woke the call held behind it"
