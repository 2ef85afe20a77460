"""Building and running a onceflow worker: ledger, agents, activities, workflows, tracing."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

import asyncpg
from temporalio.client import Client
from temporalio.worker import Worker

from activities import all_activities, default_identity
from ledger import Ledger, LedgerError, migrate
from onceflow.agents import AgentConfigError, AgentRegistry, load_agents
from onceflow.client import connect, ensure_search_attributes
from onceflow.config import Settings
from workflows import ALL_WORKFLOWS

if TYPE_CHECKING:
    from onceflow.mcp.runtime import McpToolsets

log = logging.getLogger("onceflow.worker")


def build_worker(
    client: Client,
    ledger: Ledger,
    registry: AgentRegistry,
    *,
    task_queue: str,
    identity: str | None = None,
) -> Worker:
    identity = identity or default_identity()
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS,
        activities=all_activities(ledger, registry, identity),
        identity=identity,
    )


async def open_agents_and_ledger(settings: Settings, process: str) -> tuple[AgentRegistry, Ledger]:
    """What the worker and the API check before serving: agents.yaml loads and the ledger answers
    (migrated). Anything wrong ends the process with a message naming it."""
    if not settings.database_url:
        raise SystemExit(f"ONCEFLOW_DATABASE_URL is not set: the {process} needs the ledger database")
    try:
        registry = load_agents(settings.agents_path)
    except AgentConfigError as exc:
        raise SystemExit(f"cannot start the {process}: {exc}") from exc
    try:
        await migrate(settings.database_url)
        ledger = await Ledger.connect(settings.database_url)
    except (OSError, LedgerError, asyncpg.PostgresError) as exc:
        raise SystemExit(f"cannot reach the ledger database: {exc}") from exc
    return registry, ledger


async def run_worker(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Check everything first, then serve until `stop` is set (or SIGINT/SIGTERM)."""
    registry, ledger = await open_agents_and_ledger(settings, "worker")
    mcp_servers: McpToolsets | None = None
    try:
        mcp_servers = await _start_mcp_servers(registry)
        client = await connect(settings)
        added = await ensure_search_attributes(client)
        if added:
            log.info("registered search attributes: %s", ", ".join(added))
        stop = stop or _stop_on_signals()
        worker = build_worker(client, ledger, registry, task_queue=settings.task_queue)
        agents = ", ".join(sorted(registry.agents))
        log.info(
            "worker on %s, task queue %s, agents: %s", settings.temporal_address, settings.task_queue, agents
        )
        async with worker:
            await stop.wait()
    finally:
        if mcp_servers is not None:
            await mcp_servers.aclose()
        await ledger.close()


async def _start_mcp_servers(registry: AgentRegistry) -> McpToolsets | None:
    """Start the MCP servers agents.yaml declares and list their tools; a failure ends the process."""
    if not registry.mcp_servers:
        return None
    from onceflow.mcp.runtime import McpStartupError, start_mcp_toolsets

    try:
        servers = await start_mcp_toolsets(registry)
    except (McpStartupError, AgentConfigError) as exc:
        raise SystemExit(f"cannot start the worker: {exc}") from exc
    log.info("MCP servers: %s", ", ".join(sorted(registry.mcp_servers)))
    return servers


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    asyncio.run(run_worker(Settings.from_env()))


if __name__ == "__main__":
    main()
