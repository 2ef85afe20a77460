"""The one-write step, five ways, for bench/peers.py: what they share. Each way's workflow is in a
module of its own (peers_onceflow, peers_pydantic_ai, peers_openai_agents, peers_dbos; the plain
activity is bench/e2e_stack.py's), since a worker's sandbox imports its workflows' modules again.

Every way sends the same request to the same receiver: POST /credits to the example billing service
with an Idempotency-Key, through a new BillingClient per call (as onceflow's `issue_credit` does).

- onceflow: a workflow hosting onceflow's write protocol (OnceflowHost, adapters/host.py) makes one
  write call of `issue_credit` (the billing example's tool): one activity that reserves in the ledger,
  sends, and records the outcome.
- plain: a workflow with one single-attempt activity making the request (bench/e2e_stack.py's).
- pydantic-ai: a Pydantic AI agent under Temporal durability (TemporalDurability: model requests and
  tool calls are activities) whose scripted model (FunctionModel) calls one tool, then answers.
- openai-agents: an OpenAI Agents agent under Temporal's plugin whose one tool is an activity
  (`activity_as_tool`); a scripted model, called through the plugin's model activity.
- dbos: a DBOS workflow with one step, on the same PostgreSQL (its own database there).

The two framework agents' keys are what their users would build from what the tool can see: the
workflow id with the model's tool call id (Pydantic AI) or the activity id (OpenAI Agents); DBOS's,
the workflow id. None of them records anything before the send.
"""

from __future__ import annotations

from typing import Any

from onceflow.examples.billing.client import BillingClient
from onceflow.examples.billing.tools import CREDIT_TIMEOUT
from onceflow.runtime.config import env
from onceflow.runtime.constants import ACTIVITY_MARGIN

AMOUNT_CENTS = 500
WRITE_TIMEOUT = CREDIT_TIMEOUT + ACTIVITY_MARGIN


def prompt(account_id: str) -> str:
    return f"credit {account_id} {AMOUNT_CENTS}"


def from_prompt(text: str) -> dict[str, Any]:
    _, account_id, amount = text.split()
    return {"account_id": account_id, "amount_cents": int(amount)}


async def post_credit(account_id: str, amount_cents: int, key: str) -> dict[str, Any]:
    """The request every way sends: one POST /credits, a new client per call, as issue_credit."""
    async with BillingClient(
        env("ONCEFLOW_BILLING_URL"), timeout=CREDIT_TIMEOUT.total_seconds() + 1
    ) as client:
        credit = await client.credit(account_id, amount_cents, idempotency_key=key)
    return credit.model_dump(mode="json")


AGENTS_TOOL = "peers_agents_credit"  # the OpenAI Agents way's tool activity

# The write step's activity in each Temporal-hosted way's history (Pydantic AI names its tool
# activities after the agent and toolset: found by the tool's name in it).
WRITE_ACTIVITY = {
    "onceflow": "run_write_tool",
    "plain": "bench_plain_credit",
    "openai-agents": AGENTS_TOOL,
}
