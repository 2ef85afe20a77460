"""The worker's MCP servers: started and listed at start-up, their tools handed to the agents.

    async with mcp_toolsets(registry):   # fails with McpStartupError naming the server and problem
        ...serve...

Each server gets one `McpConnection` for the life of the process (see connection.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from onceflow.ledger import SideEffect
from onceflow.mcp.classify import Classification, Hints, classify
from onceflow.mcp.config import McpConfigError, McpServerConfig
from onceflow.mcp.connection import McpConnection, McpUnavailableError
from onceflow.mcp.guards import tool_guard_problems
from onceflow.mcp.meta import KIT_FENCE_TOOL, KIT_LOOKUP_TOOL
from onceflow.mcp.tools import LOOKUP_KEY_ARGUMENT, McpTool, make_tool
from onceflow.runtime.agents import AgentConfigError, AgentRegistry
from onceflow.sdk.guard_sources import limit_source_problems
from onceflow.sdk.testing import tool_contract_problems
from onceflow.sdk.tools import Effect, Guards, destructive, external, read, write

log = logging.getLogger("onceflow.mcp")


class McpStartupError(RuntimeError):
    """An MCP server did not start, or does not offer what agents.yaml relies on."""

    def __init__(self, server: str, problem: str, *, others: list[McpStartupError] | None = None) -> None:
        message = f"MCP server {server!r}: {problem}"
        for other in others or ():
            message += f"; and {other}"
        super().__init__(message)
        self.server = server
        self.problem = problem
        self.others = others or []


@dataclass(frozen=True)
class ToolPlan:
    """What onceflow makes of one listed tool: its class, why, and whether agents get it."""

    name: str
    classification: Classification
    hints: Hints
    offered: bool
    note: str
    effect: Effect | None = None
    lookup: str | None = None
    problems: list[str] = field(default_factory=list)
    guards: Guards = field(default_factory=Guards)
    receiver_kit: bool = False  # reconciled through the server's receiver kit protocol tools


def _effect(config: McpServerConfig, name: str, side_effect: SideEffect) -> Effect:
    tool = config.tools.get(name)
    timeout = (tool.timeout if tool else None) or config.timeout
    approval = bool(tool and tool.approval)
    window = tool.dedup_window if tool else None
    if side_effect is SideEffect.READ:
        if approval:
            raise ValueError(f"tools.{name}: approval is for tools that change the world, not reads")
        if window is not None:
            raise ValueError(f"tools.{name}: a dedup window is for tools that change the world, not reads")
        return read(timeout=timeout)
    if window is not None and window <= timeout:
        raise ValueError(
            f"tools.{name}: dedup_window ({window}) must be longer than the tool's timeout ({timeout})"
        )
    if side_effect is SideEffect.WRITE:
        return write(timeout=timeout, approval=approval, dedup_window=window)
    if side_effect is SideEffect.EXTERNAL:
        return external(timeout=timeout, approval=approval, dedup_window=window)
    return destructive(timeout=timeout, approval=approval, dedup_window=window)


def plan_server(config: McpServerConfig, listed: list[Any]) -> tuple[list[ToolPlan], list[str]]:
    """Classify every listed tool; the second list holds problems that must stop the worker."""
    by_name = {tool.name: tool for tool in listed}
    errors = [
        f"agents.yaml names tool {name!r}, which the server does not list (it lists: "
        f"{', '.join(sorted(by_name)) or 'nothing'})"
        for name in sorted(config.declared_tools() - set(by_name))
    ]
    lookups = config.lookups()
    allowed = set(config.allow) if config.allow is not None else None
    plans: list[ToolPlan] = []
    for name, tool in by_name.items():
        override = config.tools[name].side_effect if name in config.tools else None
        hints = Hints.of(tool.annotations)
        classification = classify(hints, override=override, trust_read_only=config.trust_read_only_hints)
        try:
            effect = _effect(config, name, classification.side_effect)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        lookup = config.tools[name].reconcile if name in config.tools else None
        declared = config.tools[name].guards if name in config.tools else None
        guards = declared.guards() if declared is not None else Guards()
        if declared is not None:
            schema = tool.input_schema or {}
            errors.extend(tool_guard_problems(name, guards, schema, classification.side_effect))
        if name in lookups:
            if classification.side_effect is not SideEffect.READ:
                errors.append(
                    f"{name!r} is the reconcile lookup for {lookups[name]!r} but is classified "
                    f"{classification.side_effect} ({classification.reason}); a lookup must be a read"
                )
            properties = (tool.input_schema or {}).get("properties") or {}
            if LOOKUP_KEY_ARGUMENT not in properties:
                errors.append(f"lookup {name!r} takes no {LOOKUP_KEY_ARGUMENT!r} argument to be called with")
        kit_tool = config.uses_kit() and name in (KIT_LOOKUP_TOOL, KIT_FENCE_TOOL)
        if kit_tool and name == KIT_LOOKUP_TOOL and classification.side_effect is not SideEffect.READ:
            errors.append(f"{name!r} is the receiver kit's lookup but is not annotated read-only")
        if kit_tool:
            offered, note = False, "receiver kit protocol, not offered to the model"
        elif name in lookups and (allowed is None or name not in allowed):
            offered, note = False, f"reconcile lookup for {lookups[name]}, not offered to the model"
        elif allowed is not None and name not in allowed:
            offered, note = False, "not in allow"
        else:
            offered, note = True, "offered"
        kit = name in config.tools and config.tools[name].receiver == "kit"
        if kit and not effect.changes_the_world:
            errors.append(f"tools.{name}: `receiver: kit` is for tools that change the world, not reads")
        plan = ToolPlan(
            name, classification, hints, offered, note, effect, lookup, guards=guards, receiver_kit=kit
        )
        plans.append(plan)
    return plans, errors


class McpToolsets:
    """One connection per declared server, their tools, and closing them all."""

    def __init__(self, configs: dict[str, McpServerConfig]) -> None:
        self.connections = {name: McpConnection(name, config) for name, config in configs.items()}
        self.plans: dict[str, list[ToolPlan]] = {}

    async def _start_one(self, name: str) -> list[McpTool]:
        connection = self.connections[name]
        try:
            listed = await connection.list_tools()
        except (McpUnavailableError, McpConfigError) as exc:
            raise McpStartupError(name, str(exc)) from exc
        except Exception as exc:
            raise McpStartupError(name, f"listing its tools failed: {type(exc).__name__}: {exc}") from exc
        plans, errors = plan_server(connection.config, listed)
        if errors:
            raise McpStartupError(name, "; ".join(errors))
        self.plans[name] = plans
        log.info(
            "MCP server %s: %s",
            name,
            ", ".join(
                f"{p.name}={p.classification.side_effect}" + ("" if p.offered else " (not offered)")
                for p in plans
            ),
        )
        by_name = {tool.name: tool for tool in listed}
        tools: list[McpTool] = []
        for plan in plans:
            if not plan.offered:
                continue
            assert plan.effect is not None
            tools.append(
                make_tool(
                    connection,
                    by_name[plan.name],
                    plan.effect,
                    plan.classification,
                    plan.lookup,
                    guards=plan.guards,
                    receiver_kit=plan.receiver_kit,
                )
            )
        return tools

    async def start(self) -> dict[str, list[McpTool]]:
        """Start every server and list its tools. On failure all are closed and one error names every
        server that failed, so an operator fixes them in one go."""
        names = list(self.connections)
        results = await asyncio.gather(*(self._start_one(n) for n in names), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.aclose()
            startup = [f for f in failures if isinstance(f, McpStartupError)]
            if len(startup) != len(failures):
                raise next(f for f in failures if not isinstance(f, McpStartupError))
            first, *others = startup
            if others:
                raise McpStartupError(first.server, first.problem, others=others) from first
            raise first
        return {name: result for name, result in zip(names, results, strict=True)}  # type: ignore[misc]

    async def aclose(self) -> None:
        for connection in self.connections.values():
            await connection.aclose()


def attach_tools(registry: AgentRegistry, tools: dict[str, list[McpTool]]) -> None:
    """Give each agent the tools of the MCP servers it lists, under the same checks as any tool."""
    for agent in registry.agents.values():
        for toolset in agent.config.toolsets:
            for tool in tools.get(toolset, ()):
                if tool.name in agent.tools:
                    raise AgentConfigError(registry.path, f"two tools are named {tool.name!r}", agent.name)
                problems = tool_contract_problems(tool)
                if problems:
                    raise AgentConfigError(
                        registry.path,
                        f"tool {toolset}.{tool.name} breaks the contract: "
                        + "; ".join(problems)
                        + " (leave it out with `allow`, or override its effect)",
                        agent.name,
                    )
                agent.tools[tool.name] = tool
        problems = limit_source_problems(agent.tools)
        if problems:
            raise AgentConfigError(registry.path, "; ".join(problems), agent.name)
    registry.mcp_attached = True


async def start_mcp_toolsets(registry: AgentRegistry) -> McpToolsets:
    """Start the registry's MCP servers and attach their tools to its agents. Close with `aclose()`."""
    servers = McpToolsets(registry.mcp_servers)
    tools = await servers.start()
    try:
        attach_tools(registry, tools)
    except BaseException:
        await servers.aclose()
        raise
    return servers


@asynccontextmanager
async def mcp_toolsets(registry: AgentRegistry) -> AsyncIterator[McpToolsets]:
    """`start_mcp_toolsets`, closed at the end of the block."""
    servers = await start_mcp_toolsets(registry)
    try:
        yield servers
    finally:
        await servers.aclose()
