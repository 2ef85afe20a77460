"""Two Temporal resets while the first credit is unknown: the run is not stuck behind a call nobody
waits for.

The first execution's credit A hangs after applying and becomes unknown. A reset makes the model ask
for it again: B is held behind A. A second reset, while B is held, makes it ask once more: C. B's
execution is gone with that reset, so nobody will ever ask about B again. Before migration 0017, C was
held behind B (a held twin recorded earlier held later ones), and when A was settled C asked again on
its timer, found B still held, and waited for good. Now a held twin holds nothing: C is held behind A,
A's settle wakes it, and it is given A's result. One credit reaches the downstream.

B itself stays `held`: its execution was reset away and no run waits for it. It is in the operator
queue, where an operator releases it (it was never sent).

Real parts: the Temporal dev server (resets included), a PostgreSQL ledger; effects are counted at
the in-process downstream, which honours no key.
"""

from __future__ import annotations

import asyncio

from onceflow.activities.held import wake_held
from onceflow.ledger import Status
from onceflow.sdk.payloads import Phase
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded_runs import ORDER, _phase_is, harness, reset_before_the_credit, write_keys
from tests.support.waiting import eventually
from tests.workflow_harness import Harness

__all__ = ["harness"]  # the fixture, used by name


async def test_a_call_is_not_held_for_good_behind_a_held_call_a_reset_left_behind(harness: Harness) -> None:
    DOWNSTREAM.modes["acct_o1"] = "hang_after_apply"
    handle = await harness.start("fresh-hold", ORDER)
    await eventually(
        lambda: _phase_is(handle, Phase.AWAITING_RECONCILIATION), "the first credit to be unknown"
    )
    first_run = (await handle.describe()).run_id
    assert first_run is not None
    second = await reset_before_the_credit(harness.client, handle, first_run)
    await eventually(lambda: _phase_is(second, Phase.HELD), "the re-issued credit to be held")
    assert second.run_id is not None
    third = await reset_before_the_credit(harness.client, handle, second.run_id)
    await eventually(lambda: _phase_is(third, Phase.HELD), "the credit asked for a third time to be held")

    first_key, left_behind, asked_again = await write_keys(harness.ledger, handle.id)
    for key in (left_behind, asked_again):
        record = await harness.ledger.get(key, with_events=False)
        assert record.status is Status.HELD and record.held_by == first_key, (key, record.held_by)

    DOWNSTREAM.modes["acct_o1"] = "ok"
    settled = await harness.ledger.settle(
        first_key,
        status=Status.COMPLETED,
        actor="ops",
        reason="found in billing",
        result={"credit_id": "cr_1"},
    )
    assert await wake_held(harness.ledger, settled, harness.client) == 2  # what the settle's caller does
    result = await asyncio.wait_for(third.result(), 30)

    record = await harness.ledger.get(asked_again, with_events=False)
    assert record.status is Status.COMPLETED and record.reused_from == first_key
    assert DOWNSTREAM.received == {first_key: 1}
    assert "cr_1" in result.final
    assert (await harness.ledger.get(left_behind, with_events=False)).status is Status.HELD
