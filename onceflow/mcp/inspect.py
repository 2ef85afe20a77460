"""`onceflow mcp inspect <server>`: start one server of agents.yaml and show what onceflow makes of it.

Each listed tool with the class it would get, how many attempts that allows, whether agents are
offered it, and why (the annotations as sent, or the agents.yaml override). Exit code 1 when the
worker would refuse to start with this server (a declared tool missing, a lookup that is not a
read, a tool that breaks the contract), 2 when the server cannot be started or is not declared.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer

from onceflow.runtime.config import env
from onceflow.sdk.tools import Guards

mcp_app = typer.Typer(no_args_is_help=True, help="MCP servers declared in agents.yaml.")


async def inspect_server(agents_path: str, server: str) -> dict[str, Any]:
    """Start `server`, list and classify its tools, stop it. Raises LookupError if not declared."""
    from onceflow.mcp.connection import McpConnection
    from onceflow.mcp.runtime import plan_server
    from onceflow.mcp.tools import make_tool
    from onceflow.runtime.agents import load_agents
    from onceflow.sdk.testing import tool_contract_problems

    registry = load_agents(agents_path)
    if server not in registry.mcp_servers:
        known = ", ".join(sorted(registry.mcp_servers)) or "none"
        raise LookupError(f"{agents_path} declares no MCP server {server!r} (declared: {known})")
    config = registry.mcp_servers[server]
    connection = McpConnection(server, config)
    try:
        listed = await connection.list_tools()
    finally:
        await connection.aclose()
    plans, errors = plan_server(config, listed)
    by_name = {tool.name: tool for tool in listed}
    tools = []
    for plan in plans:
        assert plan.effect is not None
        tool = make_tool(
            connection,
            by_name[plan.name],
            plan.effect,
            plan.classification,
            plan.lookup,
            guards=plan.guards,
            receiver_kit=plan.receiver_kit,
        )
        problems = tool_contract_problems(tool) if plan.offered else []
        errors.extend(f"{plan.name}: {problem}" for problem in problems)
        tools.append(
            {
                "name": plan.name,
                "class": str(plan.classification.side_effect),
                "attempts": plan.effect.max_attempts,
                "timeout_seconds": plan.effect.timeout.total_seconds(),
                "why": plan.classification.reason,
                "overridden": plan.classification.overridden,
                "offered": plan.offered,
                "note": plan.note,
                "reconcile": "receiver kit (lookup, fence)" if plan.receiver_kit else plan.lookup,
                "approval": plan.effect.approval,
                "guards": declared_guards(plan.guards),
                "dedup_window_seconds": (
                    plan.effect.dedup_window.total_seconds() if plan.effect.dedup_window else None
                ),
                "problems": problems,
            }
        )
    where = " ".join([config.command or "", *config.args]) if config.transport == "stdio" else str(config.url)
    return {"server": server, "transport": config.transport, "where": where, "tools": tools, "errors": errors}


def declared_guards(guards: Guards) -> dict[str, Any] | None:
    """What agents.yaml declares beyond the default guards, JSON-ready; None for the defaults."""
    default = Guards()
    changed = {
        name: str(value) if isinstance(value, Decimal) else value
        for name, value in asdict(guards).items()
        if value != getattr(default, name)
    }
    return changed or None


def _print(report: dict[str, Any]) -> None:
    typer.echo(f"{report['server']} ({report['transport']}: {report['where']}): {len(report['tools'])} tools")
    for tool in report["tools"]:
        attempts = f"{tool['attempts']} attempt" + ("s" if tool["attempts"] != 1 else "")
        extras = []
        if tool["reconcile"]:
            extras.append(f"reconciled by {tool['reconcile']}")
        if tool["approval"]:
            extras.append("needs approval")
        if tool["guards"]:
            extras.append("guards: " + ", ".join(f"{k}={v}" for k, v in tool["guards"].items()))
        if tool["dedup_window_seconds"]:
            extras.append(f"may be re-sent with its key within {tool['dedup_window_seconds']:g}s")
        extras.extend(tool["problems"])
        tail = f"; {'; '.join(extras)}" if extras else ""
        typer.echo(
            f"  {tool['name']:<20} {tool['class']:<12} {attempts:<11} {tool['note']}\n"
            f"  {'':<20} why: {tool['why']}{tail}"
        )
    for error in report["errors"]:
        typer.echo(f"problem: {error}", err=True)


@mcp_app.command("inspect")
def inspect(
    server: Annotated[str, typer.Argument(help="A name under mcp_servers in agents.yaml.")],
    agents: Annotated[
        Path | None, typer.Option(help="agents.yaml to read. Default: $ONCEFLOW_AGENTS.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Start one MCP server, list its tools and print the class each would get, and why."""
    from onceflow.mcp.connection import McpUnavailableError
    from onceflow.runtime.agents import AgentConfigError

    path = str(agents) if agents else env("ONCEFLOW_AGENTS")
    try:
        report = asyncio.run(inspect_server(path, server))
    except (LookupError, AgentConfigError, McpUnavailableError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print(report)
    if report["errors"]:
        raise typer.Exit(1)
