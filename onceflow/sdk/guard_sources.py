"""Where a guarded tool's budget limit comes from (`Guards.limit_from`), checked per agent.

The limit is read, before each call, by calling a read tool of the same agent with the entity
argument alone (and the currency argument, when the tool declares one). So that tool must exist among the agent's tools, be a read, take the entity
argument, and need nothing else. Checked when agents.yaml is loaded (Python toolsets) and again once
MCP servers have listed their tools.
"""

from __future__ import annotations

from typing import Any

from onceflow.ledger import SideEffect
from onceflow.sdk.tools import Tool


def schema_arguments(schema: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A JSON Schema's properties and the names it requires."""
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    return (properties if isinstance(properties, dict) else {}), {str(r) for r in required}


def limit_source_problem(tool: Tool, source: Tool) -> str | None:
    """Why `source` cannot give `tool` its limit, or None when it can."""
    named, entity = tool.guards.limit_from, tool.guards.entity
    what = f"guards.limit_from names {named!r}"
    if source.side_effect is not SideEffect.READ:
        return f"{what}, which is declared {source.side_effect}; a limit comes from a read tool"
    properties, required = schema_arguments(source.json_schema()["parameters"])
    given = [name for name in (entity, tool.guards.currency) if name is not None]
    for name in given:
        if name not in properties:
            return f"{what}, which takes no {name!r} argument to be called with"
    others = sorted(required - set(given))
    if others:
        alone = " and ".join(repr(name) for name in given)
        return f"{what}, which also requires {', '.join(others)}; it is called with {alone} alone"
    return None


def limit_source_problems(tools: dict[str, Tool], *, more_to_come: bool = False) -> list[str]:
    """Problems with every `limit_from` among one agent's tools, each naming the tool.

    `more_to_come`: the agent also has tools not listed yet (MCP servers); a name not found is then
    left for the check that runs once they are.
    """
    problems = []
    for tool in tools.values():
        named = tool.guards.limit_from
        if named is None:
            continue
        source = tools.get(named)
        if source is None:
            if not more_to_come:
                problems.append(
                    f"tool {tool.toolset}.{tool.name}: guards.limit_from names {named!r}, which is not "
                    f"a tool of this agent (it has: {', '.join(sorted(tools))})"
                )
            continue
        problem = limit_source_problem(tool, source)
        if problem:
            problems.append(f"tool {tool.toolset}.{tool.name}: {problem}")
    return problems
