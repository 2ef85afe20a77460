"""Billing tools for fault tests that run their worker in the test's own process.

They call the real example billing service (ONCEFLOW_BILLING_URL), like tests.support.billing_tools,
whose functions they reuse:

- `manual`: the credit without a reconcile hook, so an unknown credit waits for operators.
- `zombie`: the credit, with a reconcile hook, whose attempt can be made to linger as a zombie at a
  chosen point (before sending, or after the answer): it ignores its own timeout and every
  cancellation and finishes only when the test releases it, long after Temporal gave up on it and
  the call was settled by someone else. Tool code that shields a request from cancellation behaves
  like this, and so does a worker that stalls (a long GC pause, a frozen VM) and then carries on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

from onceflow import ToolContext, Toolset, external, read
from onceflow.examples.billing.tools import find_credit
from tests.support import billing_tools

TOOL_TIMEOUT = billing_tools.TOOL_TIMEOUT
# Short: Temporal gives up on the write activity at this plus the activity margin (5 s).
ZOMBIE_TOOL_TIMEOUT = timedelta(seconds=1)

BEFORE_SEND = "before_send"
AFTER_ANSWER = "after_answer"

manual = Toolset("faults-manual")
manual.tool(read(timeout=TOOL_TIMEOUT), name="lookup_order")(billing_tools.lookup_order.fn)
manual.tool(external(timeout=TOOL_TIMEOUT), name="issue_credit")(billing_tools.issue_credit.fn)


class Zombies:
    """Which call's attempt lingers where. The test arms a key, waits for it to be held, releases it."""

    def __init__(self) -> None:
        self._armed: dict[str, str] = {}
        self._held: dict[str, asyncio.Event] = {}
        self._released: dict[str, asyncio.Event] = {}
        self.cancellations_ignored: Counter[str] = Counter()

    def arm(self, key: str, point: str) -> None:
        assert point in (BEFORE_SEND, AFTER_ANSWER), point
        self._armed[key] = point
        self._held[key] = asyncio.Event()
        self._released[key] = asyncio.Event()

    async def wait_held(self, key: str) -> None:
        await self._held[key].wait()

    def release(self, key: str) -> None:
        self._released[key].set()

    def release_all(self) -> None:
        for released in self._released.values():
            released.set()

    async def linger(self, key: str, point: str) -> None:
        if self._armed.get(key) != point:
            return
        self._held[key].set()
        released = self._released[key]
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                # The zombie part: the tool's timeout and Temporal's cancellation do not stop it.
                self.cancellations_ignored[key] += 1


ZOMBIES = Zombies()

zombie = Toolset("faults-zombie")
zombie.tool(read(timeout=TOOL_TIMEOUT), name="lookup_order")(billing_tools.lookup_order.fn)


@zombie.tool(external(timeout=ZOMBIE_TOOL_TIMEOUT), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    await ZOMBIES.linger(context.idempotency_key, BEFORE_SEND)
    credit: dict[str, Any] = await billing_tools.issue_credit.fn(account_id, amount_cents, context)
    await ZOMBIES.linger(context.idempotency_key, AFTER_ANSWER)
    return credit
