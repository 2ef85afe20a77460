"""Checks for tool authors. `assert_tool_contract(tool)` belongs in every project's test suite."""

from __future__ import annotations

import re

from onceflow.sdk.tools import READ_ATTEMPTS, Guards, Tool

# Argument names that look like a deduplication key. The key is onceflow's to make, never the model's.
_KEY_LIKE = re.compile(r"idempot|dedup|(^|_)idem(_|$)|request_?id$|^key$", re.IGNORECASE)


class ToolContractError(AssertionError):
    def __init__(self, tool: Tool, problems: list[str]) -> None:
        super().__init__(f"tool {tool.toolset}.{tool.name} breaks the contract: " + "; ".join(problems))
        self.tool = tool
        self.problems = problems


def tool_contract_problems(tool: Tool) -> list[str]:
    problems: list[str] = []
    effect = tool.effect
    if effect.changes_the_world:
        if effect.max_attempts != 1:
            problems.append(
                f"it is declared {effect.side_effect} but may be attempted {effect.max_attempts} "
                "times; anything that writes, sends or deletes gets exactly one attempt"
            )
        if tool.context_parameter is None:
            problems.append(
                "it takes no ToolContext parameter, so it cannot pass the idempotency key downstream"
            )
    else:
        if effect.max_attempts > READ_ATTEMPTS:
            problems.append(f"read tools get at most {READ_ATTEMPTS} attempts")
        if effect.approval:
            problems.append("approval is for tools that change the world, not reads")
        if tool.compensation is not None:
            problems.append("a read tool has nothing to compensate")
        if tool.guards != Guards():
            problems.append("guards are for tools that change the world, not reads")
        if effect.dedup_window is not None:
            problems.append("a dedup window is for tools that change the world, not reads")
    key_like = [n for n in tool.arguments_model.model_fields if _KEY_LIKE.search(n)]
    if key_like:
        problems.append(
            f"argument(s) {', '.join(key_like)} look like an idempotency key and would be exposed "
            "to the model; take the key from ToolContext.idempotency_key instead"
        )
    if effect.timeout.total_seconds() <= 0:
        problems.append("its timeout must be positive")
    if effect.dedup_window is not None and effect.dedup_window <= effect.timeout:
        problems.append("its dedup window must be longer than its timeout")
    problems.extend(tool.guards.problems(set(tool.arguments_model.model_fields)))
    return problems


def assert_tool_contract(tool: Tool) -> None:
    """Fail a tool that could take effect twice or let a model choose its key."""
    problems = tool_contract_problems(tool)
    if problems:
        raise ToolContractError(tool, problems)
