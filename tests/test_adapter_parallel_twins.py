"""Three identical writes in one answer of a framework that runs tool calls at once (Pydantic AI):
one is sent and the other two are held, both behind that one and not one behind the other
(migration 0017: a held call holds no call). When it is settled, its settle wakes both at once
(activities/held.py), and both are given its result. Before 0017 the third was held behind the
second, and only its timer made it ask again.

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


async def test_three_identical_writes_at_once_send_one_and_its_settle_wakes_the_other_two(
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
    held = sorted(k for k, r in records.items() if r.status is Status.HELD)
    assert all(records[k].held_by == unknown for k in held), "both are held behind the call that was sent"
    assert not any(records[k].holds_calls for k in held), "a held call holds no other"

    settled = await handle.execute_update(
        "resolve",
        ResolveSignal(key=unknown, status="completed", reason="found in billing", actor="alice"),
        result_type=SettleResult,
    )
    assert settled.outcome.status is Status.COMPLETED
    result = await finished(handle)

    assert DOWNSTREAM.received == {unknown: 1}, "one send for the three"
    for key in held:
        record = await ledger.get(key, with_events=False)
        assert record.status is Status.COMPLETED and record.reused_from == unknown
    assert all(r["ok"] for r in result["results"])
    woken = {s.key for s in await resolve_signals(temporal_env.client, handle.id) if s.actor == WAKE_ACTOR}
    assert woken == set(held), "the settle of the call that was sent woke both held calls"
