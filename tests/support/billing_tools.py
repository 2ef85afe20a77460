"""Tools over the real example billing service, for tests that run workers as separate processes.

The billing service runs in a process of its own, so what it counts survives a worker's SIGKILL.
A test holds a tool at a chosen instruction by creating a marker file in $ONCEFLOW_TEST_MARKERS; the
tool then announces that it is there (another marker) and waits to be killed.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from onceflow import (
    ToolContext,
    Toolset,
    external,
    read,
)
from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import find_credit, send_credit
from onceflow.runtime.config import env

MARKERS_ENV = "ONCEFLOW_TEST_MARKERS"
# Short, so that the activity timeouts after a kill (tool timeout + margin) pass quickly.
TOOL_TIMEOUT = timedelta(seconds=2)

# Create the first of each pair to hold the tool; the tool creates the second once it is held.
HOLD_LOOKUP, HELD_IN_LOOKUP = "hold-lookup", "held-in-lookup"
HOLD_BEFORE_SEND, HELD_BEFORE_SEND = "hold-before-send", "held-before-send"

toolset = Toolset("process-billing")


async def _hold_if_asked(hold: str, held: str) -> None:
    markers = os.environ.get(MARKERS_ENV)
    if markers and (Path(markers) / hold).exists():
        (Path(markers) / held).touch()
        await asyncio.sleep(3600)  # the test kills this worker here


def _client() -> BillingClient:
    # The HTTP timeout is a little longer than the tool's: onceflow's own timeout decides.
    return BillingClient(env("ONCEFLOW_BILLING_URL"), timeout=TOOL_TIMEOUT.total_seconds() + 1)


@toolset.tool(read(timeout=TOOL_TIMEOUT))
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account and amount."""
    await _hold_if_asked(HOLD_LOOKUP, HELD_IN_LOOKUP)
    async with _client() as client:
        order = await client.get_order(order_id)
    return order.model_dump(mode="json")


@toolset.tool(external(timeout=TOOL_TIMEOUT), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    await _hold_if_asked(HOLD_BEFORE_SEND, HELD_BEFORE_SEND)
    async with _client() as client:
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


# An agents.yaml for worker processes: look an order up, credit it, pause on an unknown outcome and
# reconcile quickly.
PROCESS_AGENTS_YAML = """\
toolsets:
  process-billing: tests.support.billing_tools:toolset
agents:
  credit-billing:
    model:
      provider: scripted
      script:
        - tool_calls:
            - name: lookup_order
              arguments: {order_id: "{{ input.order_id }}"}
        - tool_calls:
            - name: issue_credit
              arguments:
                account_id: "{{ results.lookup_order.account_id }}"
                amount_cents: "{{ results.lookup_order.amount_cents }}"
        - final: "credit result: {{ results.issue_credit }}"
    toolsets: [process-billing]
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 2m
      reconcile_initial_interval: 0.2s
      reconcile_max_interval: 1s
"""
