"""Rolling restarts with real worker processes (`python worker.py`): a deploy creates no unknowns.

Runs are started in waves while one worker serves the task queue. Each wave's credits reach the
downstream and are held there (KeyCountingProxy, in front of the billing service process); then a
new worker is started, and once it polls, the old one is stopped, and the held credits are let go.

With SIGTERM the old worker stops polling and finishes its in-flight credits itself (the graceful
shutdown period of onceflow/runtime/shutdown.py): no call becomes `indeterminate`, every run completes and
every key reaches billing exactly once. The same restart with SIGKILL, which is what a too-short
stop timeout turns SIGTERM into, leaves every held call indeterminate: the check can fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, AgentRunResult
from onceflow.workflows.agent_run import AgentRunWorkflow
from tests.support.key_counter import KeyCountingProxy
from tests.support.processes import ChildProcesses
from tests.support.rolling_tools import AGENTS_YAML, CREDIT_TIMEOUT

RUNS_PER_WAVE = 3
# The default grace for these tools is CREDIT_TIMEOUT + margins; the exit must come well before.
EXIT_TIMEOUT = CREDIT_TIMEOUT.total_seconds() + 15


@dataclass
class Replacement:
    """One step of the rollout: the worker stopped, and the calls it had in flight at that moment."""

    pid: int
    keys: set[str]
    exit_code: int | None = None
    alive_after_signal: bool = False


@dataclass
class Fleet:
    client: Client
    ledger: Ledger
    proxy: KeyCountingProxy
    billing: BillingClient  # counts what arrived, per key (the one count the tests use)
    processes: ChildProcesses
    env: dict[str, str]
    handles: list[WorkflowHandle[AgentRunWorkflow, AgentRunResult]] = field(default_factory=list)
    _started: int = 0

    async def sent(self, keys: set[str]) -> dict[str, int]:
        """Credit requests the billing service received for each key."""
        received = await self.billing.received_counts()
        return {key: received.count(key) for key in keys}

    async def start_worker(self) -> subprocess.Popen[bytes]:
        """Start a worker process and return once it polls the task queue."""
        self._started += 1
        name = f"worker-{self._started}"
        worker = self.processes.start(name, ["worker.py"], self.env)
        await self.wait_polling(worker, name)
        return worker

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            if time.monotonic() > deadline:
                pytest.fail(f"gave up waiting for {what}\n{self.processes.logs_text()}")
            await asyncio.sleep(0.05)

    async def wait_polling(self, worker: subprocess.Popen[bytes], name: str) -> None:
        """Wait for the worker's own word that it polls (it logs it once its pollers run)."""

        async def polling() -> bool:
            if worker.poll() is not None:
                pytest.fail(f"{name} exited with {worker.returncode}\n{self.processes.log(name)}")
            return "polling task queue" in self.processes.log(name)

        await self.until(f"{name} to poll", polling)

    async def start_runs(self, count: int) -> None:
        for _ in range(count):
            order = f"ord_{uuid.uuid4().hex[:10]}"
            self.handles.append(
                await start_run(
                    self.client,
                    AgentRunInput(
                        agent="credit-rolling", tenant="acme", input=json.dumps({"order_id": order})
                    ),
                    run_id=f"run-{uuid.uuid4().hex[:12]}",
                    task_queue=self.env["ONCEFLOW_TASK_QUEUE"],
                )
            )


@pytest.fixture
async def fleet(
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    database_url: str,
    billing_url: str,
    billing: BillingClient,
    tmp_path: Path,
) -> AsyncIterator[Fleet]:
    parts = urlsplit(billing_url)
    assert parts.hostname is not None and parts.port is not None
    proxy = await KeyCountingProxy(parts.hostname, parts.port).start()
    agents = tmp_path / "agents.yaml"
    agents.write_text(AGENTS_YAML)
    client = temporal_env.client
    env = {
        **{k: v for k, v in os.environ.items() if k != "ONCEFLOW_SHUTDOWN_GRACE"},
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_BILLING_URL": proxy.url,
        "OTEL_TRACES_EXPORTER": "none",
    }
    processes = ChildProcesses(tmp_path / "logs")
    try:
        yield Fleet(client, ledger, proxy, billing, processes, env)
    finally:
        processes.close()
        await proxy.close()


async def roll(fleet: Fleet, waves: int, stop: signal.Signals) -> list[Replacement]:
    """Replace the serving worker `waves` times, each time with a wave of credits held in flight."""
    current = await fleet.start_worker()
    replaced: list[Replacement] = []
    for _ in range(waves):
        before = set(fleet.proxy.sent)
        fleet.proxy.hold()
        await fleet.start_runs(RUNS_PER_WAVE)

        async def wave_held() -> bool:
            return len(fleet.proxy.held) == RUNS_PER_WAVE

        await fleet.until("the wave's credits to be held at the downstream", wave_held)
        keys = set(fleet.proxy.held)
        assert not keys & before
        for key in keys:  # in flight, and on the worker about to be stopped
            record = await fleet.ledger.get(key, with_events=False)
            assert record.status is Status.STARTED
            assert record.owner is not None and record.owner.endswith(f":{current.pid}")

        successor = await fleet.start_worker()
        step = Replacement(current.pid, keys)
        os.kill(current.pid, stop)
        await asyncio.sleep(1.0)
        step.alive_after_signal = current.poll() is None
        fleet.proxy.release()
        try:
            step.exit_code = await asyncio.to_thread(current.wait, EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {current.pid} did not exit after {stop.name}\n{fleet.processes.logs_text()}")
        replaced.append(step)
        current = successor
    for handle in fleet.handles:
        try:
            await asyncio.wait_for(handle.result(), 90)
        except TimeoutError:
            status = await handle.query(AgentRunWorkflow.status)
            pytest.fail(f"run {handle.id} did not finish: {status}\n{fleet.processes.logs_text()}")
    return replaced


async def indeterminate_keys(ledger: Ledger, keys: set[str]) -> set[str]:
    """Keys that were `indeterminate` at any moment, read from their append-only events."""
    found = set()
    for key in keys:
        record = await ledger.get(key)
        if any(event.to_status is Status.INDETERMINATE for event in record.events):
            found.add(key)
    return found


async def test_rolling_restart_with_sigterm_finishes_in_flight_writes_and_creates_no_unknowns(
    fleet: Fleet,
) -> None:
    replaced = await roll(fleet, waves=3, stop=signal.SIGTERM)

    keys = set().union(*(step.keys for step in replaced))
    assert len(keys) == 3 * RUNS_PER_WAVE
    assert await indeterminate_keys(fleet.ledger, keys) == set()
    assert (await fleet.ledger.list_unresolved(tenant="acme")).records == []
    assert await fleet.sent(keys) == dict.fromkeys(keys, 1)
    for step in replaced:
        # It waited for its calls rather than dropping them, finished them itself, and left cleanly.
        assert step.alive_after_signal
        assert step.exit_code == 0, fleet.processes.logs_text()
        for key in step.keys:
            record = await fleet.ledger.get(key)
            assert record.status is Status.COMPLETED
            assert record.owner is not None and record.owner.endswith(f":{step.pid}")
            assert [e.kind for e in record.events] == ["reserved", "completed"]
    for handle in fleet.handles:
        result = await handle.result()
        assert result.calls[-1].status == "completed"
        assert "credit_id" in result.final


# Slow (about 30 s: a killed write is noticed only at its start-to-close timeout). `make deploy-tests`.
@pytest.mark.slow
async def test_the_same_restart_with_sigkill_leaves_every_held_call_indeterminate(fleet: Fleet) -> None:
    replaced = await roll(fleet, waves=1, stop=signal.SIGKILL)

    (step,) = replaced
    assert step.exit_code == -signal.SIGKILL
    # This is what the graceful test rules out; the runs still finish, through reconciliation.
    assert await indeterminate_keys(fleet.ledger, step.keys) == step.keys
    assert await fleet.sent(step.keys) == dict.fromkeys(step.keys, 1)
    for key in step.keys:
        record = await fleet.ledger.get(key)
        assert record.settled_by == "reconciler"
