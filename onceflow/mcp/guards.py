"""Checking an MCP tool's `guards:` against what the server lists, when the worker starts.

The ledger reads a guarded call's entity and amount from its arguments, so both must be arguments
the tool's input schema declares and requires, of a type that can name an entity or count money.
Where `limit_from` points is checked per agent, once every toolset's tools are known
(onceflow.sdk.guard_sources).
"""

from __future__ import annotations

from typing import Any

from onceflow.ledger import SideEffect
from onceflow.sdk.guard_sources import schema_arguments
from onceflow.sdk.tools import Guards

# JSON Schema types that can carry each guarded argument.
_ENTITY_TYPES = {"string", "integer", "number"}
_AMOUNT_TYPES = {"integer", "number", "string"}


def _types(schema: Any) -> set[str]:
    """The JSON Schema types a property allows; empty when it does not say."""
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    found: set[str] = set()
    for option in schema.get("anyOf") or schema.get("oneOf") or ():
        found |= _types(option)
    return found


def tool_guard_problems(
    name: str, guards: Guards, schema: dict[str, Any], side_effect: SideEffect
) -> list[str]:
    """What is wrong with `guards` for the listed tool `name`, each problem naming the tool."""
    where = f"tools.{name}.guards"
    if side_effect is SideEffect.READ:
        return [f"{where}: guards are for tools that change the world, and {name!r} is classified read"]
    properties, required = schema_arguments(schema)
    problems = [f"{where}: {problem}" for problem in guards.problems(set(properties))]
    for role, argument, allowed in (
        ("entity", guards.entity, _ENTITY_TYPES),
        ("amount", guards.amount, _AMOUNT_TYPES),
        ("currency", guards.currency, {"string"}),
    ):
        if argument is None or argument not in properties:
            continue
        if argument not in required:
            problems.append(
                f"{where}.{role} names {argument!r}, which the input schema does not require; "
                "a guarded argument must be in every call"
            )
        types = _types(properties[argument])
        if types and not types & allowed:
            problems.append(
                f"{where}.{role} names {argument!r}, of type {'/'.join(sorted(types))}; "
                f"it must be one of {', '.join(sorted(allowed))}"
            )
    return problems
