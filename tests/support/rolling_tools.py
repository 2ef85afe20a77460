"""Billing tools for the rolling-restart tests: the example's own calls, with a timeout long enough
for a test to hold a credit at the downstream while it replaces the worker that sent it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from onceflow import ToolContext, Toolset, external, read
from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import find_credit, send_credit
from onceflow.runtime.config import env

# Long enough to start a new worker process and SIGTERM the old one while a credit is held.
CREDIT_TIMEOUT = timedelta(seconds=20)

toolset = Toolset("rolling-billing")


def _client(timeout: float) -> BillingClient:
    return BillingClient(env("ONCEFLOW_BILLING_URL"), timeout=timeout)


@toolset.tool(read(timeout=timedelta(seconds=5)))
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account and amount."""
    async with _client(6) as client:
        order = await client.get_order(order_id)
    return order.model_dump(mode="json")


@toolset.tool(external(timeout=CREDIT_TIMEOUT), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents, once, with the call's idempotency key."""
    async with _client(CREDIT_TIMEOUT.total_seconds() + 1) as client:
        return await send_credit(client, account_id, amount_cents, context.idempotency_key)


AGENTS_YAML = """\
toolsets:
  rolling-billing: tests.support.rolling_tools:toolset
agents:
  credit-rolling:
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
    toolsets: [rolling-billing]
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 2m
      reconcile_initial_interval: 0.2s
      reconcile_max_interval: 1s
"""
