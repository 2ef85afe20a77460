"""A write whose earlier attempt was lost, and the ledger had no row for it: sent again only if the
ledger has not failed over since that attempt began (activities/tools.py, ledger/lost_writes.py).

Under asynchronous replication the attempt's reservation may have been lost with the old primary
after the call went out, so "no row" no longer proves "not sent". The run tells the next attempt when
the lost one began (ToolCallInput.lost_attempt_at); a timeline switch recorded since then makes the
fresh reservation an unknown call, and nothing is sent. The test's record is its own tool's list of
calls; the timelines are written as a worker would have recorded them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from onceflow import ToolContext, Toolset, external
from onceflow.activities.tools import ToolActivities
from onceflow.ledger import Ledger, Status
from onceflow.ledger.lost_writes import LOST_KIND
from onceflow.runtime.agents import Agent, AgentConfig, AgentRegistry
from onceflow.sdk.payloads import ToolCall, ToolCallInput
from tests.support.lost_attempts import attempt_environment, failed_over_at

lost = Toolset("lost-attempts")
SENT: list[str] = []


@lost.tool(external())
async def pay(amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Pay once, with the call's key."""
    SENT.append(context.idempotency_key)
    return {"paid": amount_cents}


def _registry() -> AgentRegistry:
    config = AgentConfig.model_validate(
        {"model": {"provider": "scripted", "script": [{"final": "-"}]}, "toolsets": ["lost-attempts"]}
    )
    return AgentRegistry({"payer": Agent("payer", config, {t.name: t for t in lost.tools})})


def _input(lost_attempt_at: datetime) -> ToolCallInput:
    return ToolCallInput(
        run_id=f"run-{uuid.uuid4().hex[:10]}",
        tenant="t1",
        agent="payer",
        call=ToolCall(id="call_1_0", name="pay", arguments={"amount_cents": 700}),
        lost_attempt_at=lost_attempt_at,
    )


async def test_a_lost_attempt_before_a_failover_makes_the_call_unknown_and_sends_nothing(
    ledger: Ledger, database_url: str
) -> None:
    now = datetime.now(UTC)
    await failed_over_at(database_url, now)
    SENT.clear()
    activities = ToolActivities(ledger, _registry(), "worker-c")
    request = _input(lost_attempt_at=now - timedelta(minutes=3))
    outcome = await attempt_environment().run(activities.run_write_tool, request)
    assert outcome.status is Status.INDETERMINATE
    assert SENT == []  # never sent again
    record = await ledger.get(outcome.key or "")
    assert record.status is Status.INDETERMINATE
    event = record.events[-1]
    assert event.kind == LOST_KIND and "failed over since" in (event.reason or "")
    assert record.error == event.reason  # the operator queue shows why


async def test_a_lost_attempt_after_the_failover_is_sent_as_before(ledger: Ledger, database_url: str) -> None:
    """The lost attempt began after the switch was seen: its reservation was on the new primary, so
    "no row" means what it always meant, and the call is sent."""
    now = datetime.now(UTC)
    await failed_over_at(database_url, now - timedelta(minutes=10))
    SENT.clear()
    activities = ToolActivities(ledger, _registry(), "worker-c")
    request = _input(lost_attempt_at=now - timedelta(minutes=1))
    outcome = await attempt_environment().run(activities.run_write_tool, request)
    assert outcome.status is Status.COMPLETED
    assert SENT == [outcome.key]
