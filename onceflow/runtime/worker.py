"""Running onceflow's own worker (worker.py, `onceflow worker`): the agents file, the ledger, MCP servers,
metrics, health and graceful shutdown around a Temporal worker that OnceflowPlugin puts onceflow on."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import functools
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
from temporalio.client import Client
from temporalio.worker import Plugin as WorkerPlugin
from temporalio.worker import Worker

from onceflow.activities import SignalDoor, default_identity
from onceflow.ledger import Ledger, LedgerError, migrate, schema_behind
from onceflow.runtime.agents import AgentConfigError, AgentRegistry, check_models, load_agents
from onceflow.runtime.client import connect
from onceflow.runtime.config import ENVIRONMENT, Settings, default_max_cached_workflows
from onceflow.runtime.health import keep_heartbeat, probe, remove_heartbeat
from onceflow.runtime.ledger_check import check_ledger_at_start
from onceflow.runtime.metrics_export import configure_metrics, temporal_runtime
from onceflow.runtime.plugin import OnceflowPlugin, OnceflowStartupError
from onceflow.runtime.process_exit import exit_after_cleanup
from onceflow.runtime.shutdown import ShutdownGraceError, shutdown_grace

if TYPE_CHECKING:
    from onceflow.mcp.runtime import McpToolsets

log = logging.getLogger("onceflow.runtime.worker")


_WORKFLOW_TASK_SLOTS = 100  # the SDK's default max_concurrent_workflow_tasks
_SDK_CACHE = 1000  # the SDK's default max_cached_workflows


def build_worker(
    client: Client,
    ledger: Ledger,
    registry: AgentRegistry,
    *,
    task_queue: str,
    identity: str | None = None,
    shutdown_grace: timedelta = timedelta(),
    workflows: Sequence[type] = (),
    activities: Sequence[Callable[..., Any]] = (),
    plugins: Sequence[WorkerPlugin] = (),
    max_cached_workflows: int | None = None,
    search_attributes: Literal["register", "check"] = "register",
    signal_door: SignalDoor | None = None,
) -> Worker:
    """A worker with onceflow on it through OnceflowPlugin (onceflow/runtime/plugin.py), over a ledger
    already open and migrated. `workflows`, `activities` and `plugins`: more to serve beside
    onceflow's own, such as the workflows that host another framework's agent, its read tools'
    activities and that framework's worker plugin (docs/adapters.md). `signal_door`: which resolve
    signals from outside the API may settle a call (activities/signal_door.py); None: open, as
    in-process workers of tests are; `run_worker` passes the deployment's."""
    # No more workflow tasks at once than the cache holds (and at least the SDK's minimum of 2): with
    # more, a full cache of runs that all have work pending stalled the worker (seen with a cache of
    # 50 and the default 100 slots: tasks timed out and were never taken again).
    cached = _SDK_CACHE if max_cached_workflows is None else max_cached_workflows
    slots = None if max_cached_workflows is None else max(2, min(_WORKFLOW_TASK_SLOTS, cached))
    onceflow = OnceflowPlugin(
        ledger=ledger,
        agents=registry,
        search_attributes=search_attributes,
        signal_door=signal_door or SignalDoor(),
        # run_worker checks the ledger's durability with its own settings before it builds one.
        check_durability=False,
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=list(activities),
        identity=identity or default_identity(),
        plugins=[onceflow, *plugins],
        # After shutdown() (SIGTERM) polling stops at once; running activities get this long.
        # In-process workers (tests, benchmarks) keep 0: cancel at once. run_worker passes the grace.
        graceful_shutdown_timeout=shutdown_grace,
        max_cached_workflows=cached,
        max_concurrent_workflow_tasks=slots,
    )


def max_cached_workflows(text: str) -> int | None:
    """ONCEFLOW_MAX_CACHED_WORKFLOWS: a whole number of runs (0: keep none, replay every task);
    empty for onceflow's default, sized from the machine (runtime/config.py)."""
    text = text.strip()
    if not text:
        return default_max_cached_workflows()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise SystemExit(
            f"cannot start the worker: ONCEFLOW_MAX_CACHED_WORKFLOWS={text!r} is not a whole number of runs"
            " (0 or more)"
        )
    return value


# The agents file a process reads when ONCEFLOW_AGENTS does not name another. Missing, it means no
# onceflow agents: a deployment whose agents are all another framework's needs none.
DEFAULT_AGENTS_FILE = ENVIRONMENT["ONCEFLOW_AGENTS"]


def load_agents_file(path: str) -> AgentRegistry:
    """agents.yaml, or no agents when the default file is absent (any other path must exist)."""
    if path == DEFAULT_AGENTS_FILE and not Path(path).exists():
        return AgentRegistry({}, path)
    return load_agents(path)


async def open_agents_and_ledger(settings: Settings, process: str) -> tuple[AgentRegistry, Ledger]:
    """What the worker and the API check before serving: the agents file loads (when there is one)
    and the ledger answers (migrated). Anything wrong ends the process with a message naming it."""
    if not settings.database_url:
        raise SystemExit(f"ONCEFLOW_DATABASE_URL is not set: the {process} needs the ledger database")
    apply_migrations = _start_mode(process, "ONCEFLOW_MIGRATE", settings.migrate, ("apply", "check"))
    if process == "worker":
        _start_mode(process, "ONCEFLOW_SEARCH_ATTRIBUTES", settings.search_attributes, ("register", "check"))
    try:
        SignalDoor.from_settings(settings.signals, settings.signal_key)
        registry = load_agents_file(settings.agents_path)
        if process == "worker":  # only the worker talks to models; the API needs no keys
            for note in check_models(registry, settings.agents_enabled):
                log.warning("%s", note)
    except (AgentConfigError, ValueError) as exc:
        raise SystemExit(f"cannot start the {process}: {exc}") from exc
    if not registry.agents:
        log.info("%s: no onceflow agents (%s is absent or lists none)", process, settings.agents_path)
    try:
        if apply_migrations == "apply":
            await migrate(settings.database_url)
        elif behind := await schema_behind(settings.database_url):
            raise SystemExit(
                f"cannot start the {process}: the ledger's schema is behind this onceflow "
                f"({', '.join(behind)} not applied), and ONCEFLOW_MIGRATE=check leaves it as it is. "
                "Run `onceflow migrate` with ONCEFLOW_DATABASE_URL set to the ledger, or set "
                "ONCEFLOW_MIGRATE=apply to let the process migrate it"
            )
        ledger = await Ledger.connect(settings.database_url)
    except (OSError, LedgerError, asyncpg.PostgresError) as exc:
        raise SystemExit(f"cannot reach the ledger database: {exc}") from exc
    return registry, ledger


def _start_mode(process: str, variable: str, value: str, allowed: tuple[str, str]) -> str:
    """A setting that is one of two words, checked before anything is reached."""
    if value not in allowed:
        raise SystemExit(
            f"cannot start the {process}: {variable} must be `{allowed[0]}` or `{allowed[1]}`, not {value!r}"
        )
    return value


def check_configuration(settings: Settings) -> tuple[str | None, str]:
    """(problem, summary) for `onceflow worker --check`: what the worker checks before it needs
    Temporal or the database. The agents file loads, its toolsets import and every tool keeps the
    contract (load_agents runs the contract check)."""
    try:
        registry = load_agents_file(settings.agents_path)
    except AgentConfigError as exc:
        return f"cannot start the worker: {exc}", ""
    if not Path(settings.agents_path).exists():
        return None, f"{settings.agents_path}: absent; the worker serves no onceflow agents"
    tools = registry.all_tools()
    agents = ", ".join(sorted(registry.agents))
    summary = (
        f"{settings.agents_path}: {len(registry.agents)} agent(s) ({agents}), "
        f"{len(tools)} tool(s), all keep the tool contract"
    )
    return None, summary


def signal_door(settings: Settings) -> SignalDoor:
    """ONCEFLOW_SIGNALS and ONCEFLOW_SIGNAL_KEY, checked: a wrong value stops the worker, named."""
    try:
        return SignalDoor.from_settings(settings.signals, settings.signal_key)
    except ValueError as exc:
        raise SystemExit(f"cannot start the worker: {exc}") from exc


async def run_worker(settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Check everything first, then serve until `stop` is set (or SIGINT/SIGTERM)."""
    registry, ledger = await open_agents_and_ledger(settings, "worker")
    door = signal_door(settings)
    mcp_servers: McpToolsets | None = None
    try:
        await check_ledger_at_start(ledger, settings)
        mcp_servers = await _start_mcp_servers(registry)
        try:
            grace = shutdown_grace(registry, settings.shutdown_grace)
        except ShutdownGraceError as exc:
            raise SystemExit(f"cannot start the worker: {exc}") from exc
        configure_metrics("onceflow-worker", serve_prometheus=True)
        client = await connect(settings, runtime=temporal_runtime())
        stop = stop or _stop_on_signals()
        worker = build_worker(
            client,
            ledger,
            registry,
            task_queue=settings.task_queue,
            shutdown_grace=grace,
            max_cached_workflows=max_cached_workflows(settings.max_cached_workflows),
            search_attributes="check" if settings.search_attributes == "check" else "register",
            signal_door=door,
        )
        agents = ", ".join(sorted(registry.agents)) or "none"
        try:
            async with worker:
                # OnceflowPlugin checks the ledger and the search attributes before the worker polls;
                # a refusal ends this block with its OnceflowStartupError.
                await _onceflow_of(worker).ready.wait()
                log.info(
                    "worker on %s polling task queue %s; agents: %s; shutdown grace %gs; signals %s",
                    settings.temporal_address,
                    settings.task_queue,
                    agents,
                    grace.total_seconds(),
                    door.mode.value,
                )
                heartbeat = _start_heartbeat(settings, client, ledger, worker)
                try:
                    await stop.wait()
                finally:
                    if heartbeat is not None:
                        heartbeat.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await heartbeat
                log.info(
                    "stopping: no new tasks; in-flight activities have up to %gs to finish",
                    grace.total_seconds(),
                )
        except OnceflowStartupError as exc:
            raise SystemExit(str(exc)) from exc
        log.info("worker stopped")
    finally:
        # Only now: activities finishing during the grace still record their outcomes.
        if mcp_servers is not None:
            await mcp_servers.aclose()
        await ledger.close()


def _onceflow_of(worker: Worker) -> OnceflowPlugin:
    return next(p for p in worker.config()["plugins"] if isinstance(p, OnceflowPlugin))


def _start_heartbeat(
    settings: Settings, client: Client, ledger: Ledger, worker: Worker
) -> asyncio.Task[None] | None:
    """The heartbeat `onceflow health` reads, when ONCEFLOW_HEALTH_FILE names a file."""
    if not settings.health_file:
        return None
    # A heartbeat left by an earlier run of this container must not vouch for this one.
    path = Path(settings.health_file)
    remove_heartbeat(path)
    check = functools.partial(probe, client, ledger, worker)
    return asyncio.create_task(keep_heartbeat(path, check))


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

    def asked(sig: signal.Signals) -> None:
        if stop.is_set():
            log.info("%s again: already stopping, still waiting for in-flight activities", sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, asked, sig)
    return stop


def main() -> None:
    # A crash in native code (the Temporal core, a database driver) then says where it happened.
    faulthandler.enable()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    asyncio.run(run_worker(Settings.from_env()))
    # Stopped cleanly, every outcome recorded: end without the interpreter's teardown, where the
    # Temporal SDK's native threads can still crash the process (onceflow/runtime/process_exit.py).
    exit_after_cleanup(0)


if __name__ == "__main__":
    main()
