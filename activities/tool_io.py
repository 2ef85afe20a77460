"""What a tool call takes from the model and what the model is told back, before and after the
tool runs: the arguments checked against the tool's schema, the context the tool is given, a refusal
that never reached the ledger or the world, a result too large to hand on."""

from __future__ import annotations

import json
from typing import Any

from temporalio import activity

from onceflow.ledger import FailureKind
from onceflow.ledger.canonical import strict_loads, uncarried
from onceflow.sdk.keys import call_key
from onceflow.sdk.payloads import ToolCall, ToolCallInput, ToolOutcome
from onceflow.sdk.tools import InvalidToolArgumentsError, Tool, ToolContext, to_jsonable


def tool_context(tool_input: ToolCallInput, attempt: int) -> ToolContext:
    key = call_key(tool_input.run_id, tool_input.call.id)
    return ToolContext(
        idempotency_key=key,
        run_id=tool_input.run_id,
        tool_call_id=tool_input.call.id,
        tenant=tool_input.tenant,
        attempt=attempt,
        logger=activity.logger,
    )


def checked_arguments(tool: Tool, call: ToolCall) -> dict[str, Any]:
    """The call's arguments, validated; InvalidToolArgumentsError if the model sent something else."""
    return split_arguments(tool, call)[0]


def split_arguments(tool: Tool, call: ToolCall) -> tuple[dict[str, Any], str | None]:
    """The call's own arguments, validated, and the tool call id it says it replaces (if any)."""
    if call.invalid_arguments is not None:
        raise InvalidToolArgumentsError(tool.name, [_not_an_object(call.invalid_arguments)])
    arguments, replaces = tool.split_replaces(call.arguments)
    valid = tool.validate_arguments(arguments)
    # What canonical JSON cannot carry (an integer beyond 2^53, say) could not be reserved: the
    # model hears it as an invalid argument and may correct itself; the run goes on.
    problem = uncarried(valid)
    if problem is not None:
        raise InvalidToolArgumentsError(tool.name, [problem])
    return valid, replaces


def _not_an_object(sent: str) -> str:
    try:
        strict_loads(sent)
    except ValueError as exc:
        if "JSON number" in str(exc) or "infinity" in str(exc):
            return f"arguments must be a JSON object of finite numbers ({exc}), got {sent[:200]!r}"
    return f"arguments must be a JSON object, got {sent[:200]!r}"


def refused(call: ToolCall, error: Exception, kind: FailureKind | None = None) -> ToolOutcome:
    """A call that never reached the ledger or the world: the model is told why (and, for a
    refusal on policy grounds, that it is final)."""
    return ToolOutcome(
        tool_call_id=call.id, tool=call.name, key=None, status="error", error=str(error), failure_kind=kind
    )


def oversized(value: Any, cap: int) -> str | None:
    """Why `value` is too large to hand to the model, or None when it fits."""
    size = len(json.dumps(to_jsonable(value), separators=(",", ":")).encode())
    if size <= cap:
        return None
    return (
        f"the tool's result is {size} bytes, over this agent's cap of {cap} bytes "
        "(tool_policy.max_result_bytes); it was not kept. Ask for less (a narrower query, fewer fields)."
    )
