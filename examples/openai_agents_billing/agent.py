"""The agent's parts: a read tool as a Temporal activity (activity_as_tool, as the SDK's Temporal
plugin does it), one onceflow write tool, and a scripted model in place of OpenAI's."""

from __future__ import annotations

import ast
import json
from datetime import timedelta
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from temporalio import activity

from onceflow import ReconcileOutcome, ToolContext, Toolset, external
from onceflow.adapters.openai_agents import WriteTools
from onceflow.examples.local_stack import Payments

PAYMENTS = Payments()  # this example's far side
billing_writes = Toolset("openai-agents-billing")


async def find_credit(account_id: str, amount_cents: int, context: ToolContext) -> ReconcileOutcome:
    """Reconcile hook: did a credit land under this call's key?"""
    found = PAYMENTS.credits.get(context.idempotency_key)
    if found is None:
        return ReconcileOutcome.failed(looked_up=context.idempotency_key)
    return ReconcileOutcome.completed(found, result_reference=found["credit_id"])


@billing_writes.tool(external(timeout=timedelta(seconds=2)), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account, in cents."""
    return await PAYMENTS.credit(account_id, amount_cents, context.idempotency_key)


WRITES = WriteTools(
    billing_writes,
    agent="openai-agents-billing",
    tool_policy={"on_indeterminate": "pause", "reconcile_initial_interval": "0.5s", "recheck_interval": "5s"},
)


@activity.defn
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order: its account and amount."""
    return {"order_id": order_id, "account_id": f"acct_{order_id}", "amount_cents": 1250}


def _items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [item if isinstance(item, dict) else item.model_dump() for item in value]


def _call(name: str, arguments: dict[str, Any], call_id: str) -> ModelResponse:
    call = ResponseFunctionToolCall(
        arguments=json.dumps(arguments), call_id=call_id, name=name, type="function_call", id=f"fc_{call_id}"
    )
    return ModelResponse(output=[call], usage=Usage(), response_id=None)


class BillingModel(Model):
    """A stand-in model: look the order up, credit it, then say what happened."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = _items(input)
        calls = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            order_id = str(next(i["content"] for i in items if i.get("role") == "user")).split()[-1]
            return _call("lookup_order", {"order_id": order_id}, "call_lookup")
        last = outputs[-1]
        if calls.get(last["call_id"]) == "lookup_order":
            order = ast.literal_eval(last["output"])  # activity_as_tool hands back str() of the result
            arguments = {"account_id": order["account_id"], "amount_cents": order["amount_cents"]}
            return _call("issue_credit", arguments, "call_credit")
        text = ResponseOutputText(text=f"credit: {last['output']}", annotations=[], type="output_text")
        message = ResponseOutputMessage(
            id="msg", content=[text], role="assistant", status="completed", type="message"
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the stand-in model does not stream")
