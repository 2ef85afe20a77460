"""OnceflowPlugin: onceflow in an existing Temporal client and worker.

A Temporal plugin (`temporalio.plugin`), the convention temporalio's `OpenAIAgentsPlugin` and
Pydantic AI's `PydanticAIPlugin` follow:

    client = await Client.connect(address, plugins=[OnceflowPlugin(database_url, agents=[WRITES])])
    worker = Worker(client, task_queue="billing", workflows=[BillingAgentWorkflow])

On the client: a data converter that carries onceflow's payloads (pydantic models), unless a later
plugin brings its own, and Temporal's OpenTelemetry `TracingInterceptor`. On every worker built on
that client (or given the plugin itself): onceflow's workflows and activities, bound to the ledger
and the agents; the workflow sandbox taking onceflow's modules and asyncpg as they are; the tracing
interceptor and `OnceflowInterceptor` (onceflow/adapters/heard.py).

When a worker starts, before it polls: the ledger is reached and migrated (or only checked), its
database's durability settings are checked (onceflow/runtime/ledger_check.py), the namespace's
search attributes are registered (or only checked), the agents' MCP servers are
started. Anything wrong stops the worker with `OnceflowStartupError`, which names the problem and
how to fix it: a worker never polls for runs it would leave stuck. onceflow's own worker
(`onceflow worker`, worker.py) is built on this plugin too (onceflow/runtime/worker.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import asyncpg
from temporalio.client import ClientConfig
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import ReplayerConfig, Worker, WorkerConfig

from onceflow.activities import SignalDoor, all_activities, default_identity
from onceflow.adapters.heard import OnceflowInterceptor
from onceflow.ledger import Ledger, LedgerError, migrate, schema_behind
from onceflow.runtime.agents import ToolPolicy
from onceflow.runtime.client import (
    ensure_search_attributes,
    missing_search_attributes,
    search_attribute_commands,
)
from onceflow.runtime.config import Settings
from onceflow.runtime.ledger_check import check_ledger_at_start
from onceflow.runtime.lost_calls import reconcile_restored
from onceflow.runtime.plugin_parts import (
    AgentSource,
    carrying_pydantic,
    later_plugin_brings_a_converter,
    registry_from,
    with_pass_through,
)
from onceflow.runtime.telemetry import configure_tracing, tracing_interceptor
from onceflow.workflows import ALL_WORKFLOWS

log = logging.getLogger("onceflow.runtime.plugin")


class OnceflowStartupError(RuntimeError):
    """The worker cannot serve onceflow's runs; nothing was polled. The message says why and what to do."""


class OnceflowPlugin(SimplePlugin):
    """onceflow in a Temporal client and its workers (see the module docstring).

    - `database_url`: the ledger's PostgreSQL DSN; connected when the first worker starts, closed
      when the last one stops. Or `ledger`: a Ledger already open (its owner closes it).
    - `agents`: what the activities serve: `WriteTools` of a framework's agent, an agents.yaml path,
      an `AgentRegistry`, or a list of those. None (or none listed): no agents; the worker still
      reconciles and compensates, and an agents.yaml is not needed.
    - `tool_policy`: the policy of every agent declared without one (WriteTools without
      `tool_policy`, an agents.yaml agent without `tool_policy:`). None: agents.yaml's defaults,
      `on_indeterminate: fail` among them. `fail` ends a run at its first call whose outcome is
      unknown, and the model is asked nothing more; `pause` makes the call wait in the workflow
      until its reconcile hook or an operator settles it, then tells the model the settled truth.
    - `migrate`: True: bring the ledger's schema up to date at start; False: only check it is, and
      refuse to start otherwise (for deployments that migrate with `onceflow migrate`).
    - `search_attributes`: "register": add onceflow's to the namespace if missing; "check": refuse
      to start naming them and the `temporal` commands that add them (for a namespace whose
      attributes are managed elsewhere, e.g. Temporal Cloud).
    - `signal_door`: which `resolve` signals and updates from outside the operator API may settle a
      call (activities/signal_door.py). None: the deployment's, from ONCEFLOW_SIGNALS and
      ONCEFLOW_SIGNAL_KEY (`verified` unless it says `open`: only an operator assertion the API
      signed settles a call); `SignalDoor()` is open.
    - `check_durability`: True: check the ledger database's settings that can lose an acknowledged
      write (fsync, synchronous_commit, a synchronous standby, a transaction pooler, ...) when the
      first worker starts, under ONCEFLOW_PROFILE and ONCEFLOW_LEDGER_REPLICATION: `production`
      refuses to start naming each unsafe setting, `development` logs them, a transaction pooler is
      refused in both. False: the caller checks (onceflow's own worker does, with its settings).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        ledger: Ledger | None = None,
        agents: AgentSource | Sequence[AgentSource] | None = None,
        tool_policy: ToolPolicy | Mapping[str, Any] | None = None,
        migrate: bool = True,
        search_attributes: Literal["register", "check"] = "register",
        signal_door: SignalDoor | None = None,
        check_durability: bool = True,
    ) -> None:
        if database_url and ledger is not None:
            raise ValueError("OnceflowPlugin takes database_url or ledger, not both")
        if search_attributes not in ("register", "check"):
            raise ValueError(f"search_attributes must be 'register' or 'check', not {search_attributes!r}")
        policy = None
        if tool_policy is not None:
            policy = tool_policy if isinstance(tool_policy, ToolPolicy) else ToolPolicy(**tool_policy)
        self.registry = registry_from(agents, policy)
        self._database_url = database_url or None
        self._owns_ledger = ledger is None
        self.ledger = ledger if ledger is not None else Ledger.opened_later()
        self._migrate = migrate
        if signal_door is None:
            settings = Settings.from_env()
            signal_door = SignalDoor.from_settings(settings.signals, settings.signal_key)
        self.signal_door = signal_door
        self._search_attributes = search_attributes
        self._check_durability = check_durability
        self._users = 0
        self._lock = asyncio.Lock()
        self._reconciles_restored = False
        self._mcp: Any = None  # onceflow.mcp.runtime.McpToolsets, while workers run
        # Set once a worker passed the start-up checks and polls (onceflow's own worker logs then).
        self.ready = asyncio.Event()
        super().__init__("onceflow.OnceflowPlugin", workflow_runner=with_pass_through)

    # -- client ---------------------------------------------------------------------------------------

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        config = super().configure_client(config)
        configure_tracing()
        if not later_plugin_brings_a_converter(self, config.get("plugins", ())):
            config["data_converter"] = carrying_pydantic(config.get("data_converter"))
        interceptors = list(config.get("interceptors") or ())
        if not any(isinstance(i, TracingInterceptor) for i in interceptors):
            interceptors.append(tracing_interceptor())
        config["interceptors"] = interceptors
        return config

    # -- worker ---------------------------------------------------------------------------------------

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        configure_tracing()
        client = config["client"]
        if client.data_converter.payload_converter_class is DefaultPayloadConverter:
            raise ValueError(
                "OnceflowPlugin: this worker's client has Temporal's default data converter, which "
                "cannot carry onceflow's payloads. Put OnceflowPlugin on the client "
                "(Client.connect(..., plugins=[OnceflowPlugin(...)]); its workers inherit it), or "
                "connect with temporalio.contrib.pydantic.pydantic_data_converter"
            )
        if self._owns_ledger and not self._database_url:
            raise ValueError(
                "OnceflowPlugin needs the ledger: OnceflowPlugin(database_url=...) or ledger=..."
            )
        workflows = list(config.get("workflows") or ())
        config["workflows"] = [*workflows, *(w for w in ALL_WORKFLOWS if w not in workflows)]
        identity = config.get("identity") or default_identity()
        config["activities"] = [
            *(config.get("activities") or ()),
            *all_activities(self.ledger, self.registry, identity, self.signal_door),
        ]
        on_client = list(client.config(active_config=True).get("interceptors") or ())
        interceptors = list(config.get("interceptors") or ())
        if not any(isinstance(i, TracingInterceptor) for i in [*on_client, *interceptors]):
            interceptors.append(tracing_interceptor())
        if not any(isinstance(i, OnceflowInterceptor) for i in interceptors):
            interceptors.append(OnceflowInterceptor())
        config["interceptors"] = interceptors
        return config

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        config["data_converter"] = carrying_pydantic(config.get("data_converter"))
        workflows = list(config.get("workflows") or ())
        config["workflows"] = [*workflows, *(w for w in ALL_WORKFLOWS if w not in workflows)]
        interceptors = list(config.get("interceptors") or ())
        if not any(isinstance(i, OnceflowInterceptor) for i in interceptors):
            interceptors.append(OnceflowInterceptor())
        config["interceptors"] = interceptors
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        try:
            await self._start(worker)
        except OnceflowStartupError:
            await _finish_without_serving(worker, next)
            raise
        self.ready.set()
        try:
            await next(worker)
        finally:
            await self._stop()

    # -- what a worker needs before it polls ----------------------------------------------------------

    async def _start(self, worker: Worker) -> None:
        async with self._lock:
            if self._users == 0:
                await self._open()
            self._users += 1
            if not self._reconciles_restored:
                # Calls a failover of the ledger lost after their run moved on get a reconciler.
                task_queue = worker.config()["task_queue"]
                self.ledger.on_restored(reconcile_restored(worker.client, self.registry, task_queue))
                self._reconciles_restored = True
        try:
            await self._check_search_attributes(worker)
        except BaseException:
            await self._stop()
            raise

    async def _open(self) -> None:
        if self._owns_ledger:
            assert self._database_url is not None  # configure_worker refused a plugin without one
            await self._open_ledger(self._database_url)
        elif not self.ledger.is_open:
            raise OnceflowStartupError(
                "cannot start the worker: the ledger given to OnceflowPlugin is closed"
            )
        if self._check_durability:
            try:
                await check_ledger_at_start(self.ledger, Settings.from_env())
            except SystemExit as exc:
                await self._close_ledger()
                raise OnceflowStartupError(str(exc)) from None
        if self.registry.mcp_servers and not self.registry.mcp_attached:
            from onceflow.mcp.runtime import McpStartupError, start_mcp_toolsets
            from onceflow.runtime.agents import AgentConfigError

            try:
                self._mcp = await start_mcp_toolsets(self.registry)
            except (McpStartupError, AgentConfigError) as exc:
                await self._close_ledger()
                raise OnceflowStartupError(f"cannot start the worker: {exc}") from exc

    async def _open_ledger(self, dsn: str) -> None:
        try:
            if self._migrate:
                await migrate(dsn)
            else:
                behind = await schema_behind(dsn)
                if behind:
                    raise OnceflowStartupError(
                        "cannot start the worker: the ledger's schema is behind this onceflow "
                        f"({', '.join(behind)} not applied). Run `onceflow migrate` with "
                        "ONCEFLOW_DATABASE_URL set to the ledger, or let the worker migrate it: "
                        "OnceflowPlugin(..., migrate=True)"
                    )
            await self.ledger.open(dsn)
        except (OSError, LedgerError, asyncpg.PostgresError, RuntimeError) as exc:
            if isinstance(exc, OnceflowStartupError):
                raise
            raise OnceflowStartupError(
                f"cannot start the worker: cannot reach the ledger database: {exc}"
            ) from exc

    async def _check_search_attributes(self, worker: Worker) -> None:
        client = worker.client
        try:
            missing = await missing_search_attributes(client)
        except RPCError as exc:
            raise OnceflowStartupError(
                f"cannot start the worker: cannot list the search attributes of namespace "
                f"{client.namespace!r}: {exc.message}"
            ) from exc
        if not missing:
            return
        why = ""
        if self._search_attributes == "register":
            try:
                added = await ensure_search_attributes(client)
            except RPCError as exc:
                why = f" Adding them failed: {exc.message}."
            else:
                log.info(
                    "registered search attributes on namespace %s: %s", client.namespace, ", ".join(added)
                )
                return
        names = ", ".join(key.name for key in missing)
        commands = "\n".join(f"  {line}" for line in search_attribute_commands(client.namespace, missing))
        hint = (
            "" if why else " (or let the worker add them: OnceflowPlugin(..., search_attributes='register'))"
        )
        raise OnceflowStartupError(
            f"cannot start the worker: namespace {client.namespace!r} lacks the search attributes "
            f"onceflow's runs set ({names}): every workflow task of such a run would fail and the run "
            f"would stay stuck.{why} Add them{hint}:\n{commands}"
        )

    async def _stop(self) -> None:
        async with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._mcp is not None:
                mcp, self._mcp = self._mcp, None
                await mcp.aclose()
            await self._close_ledger()

    async def _close_ledger(self) -> None:
        if self._owns_ledger:
            await self.ledger.close()


async def _finish_without_serving(worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
    """End a worker that must not serve through the SDK's own path: started with its shutdown asked
    for already, it stops at once and lets `async with worker` and `shutdown()` return (a plugin that
    just raised here would leave both waiting forever, and the worker registered in the SDK core)."""
    stopping = asyncio.ensure_future(worker.shutdown())
    try:
        await next(worker)
    finally:
        await stopping


__all__ = ["OnceflowPlugin", "OnceflowStartupError", "carrying_pydantic"]
