"""Heartbeats of the worker and the operator API, and `onceflow health`, the container health check.

Against a real Temporal dev server and a real PostgreSQL: a running worker (or API) keeps its
heartbeat fresh; a worker whose ledger is gone or whose Temporal worker is not running, or an API
whose HTTP endpoint does not answer, fails its probe; a stopped process leaves no heartbeat behind,
so the check fails.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger
from onceflow.local.postgres import create_database, drop_database
from onceflow.runtime.agents import load_agents
from onceflow.runtime.config import Settings
from onceflow.runtime.health import Heartbeat, api_probe, heartbeat_problem, probe, write_heartbeat
from onceflow.runtime.worker import build_worker, run_worker
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
ONCEFLOW = str(Path(sys.executable).parent / "onceflow")


async def onceflow_health(health_file: Path | None) -> tuple[int | None, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    if health_file is not None:
        environment["ONCEFLOW_HEALTH_FILE"] = str(health_file)
    process = await asyncio.create_subprocess_exec(
        ONCEFLOW,
        "health",
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, output.decode()


def beat(path: Path, *, last_ok: float | None, checked: float, problem: str | None = None) -> None:
    write_heartbeat(path, Heartbeat(last_ok=last_ok, checked=checked, problem=problem, pid=123))


def test_a_recent_good_probe_is_healthy_even_if_the_latest_one_failed(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    now = 1_000_000.0
    beat(path, last_ok=now - 5, checked=now - 5)
    assert heartbeat_problem(path, max_age=30, now=now) is None
    beat(path, last_ok=now - 15, checked=now - 2, problem="the ledger database does not answer")
    assert heartbeat_problem(path, max_age=30, now=now) is None  # one bad probe is not an outage


def test_a_stale_heartbeat_says_how_old_it_is_and_what_the_latest_probe_found(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    now = 1_000_000.0
    beat(path, last_ok=now - 45, checked=now - 3, problem="the ledger database does not answer: boom")
    problem = heartbeat_problem(path, max_age=30, now=now)
    assert problem is not None
    assert "45 s ago, more than 30 s" in problem
    assert "the ledger database does not answer: boom" in problem
    beat(path, last_ok=now - 45, checked=now - 45)
    assert "(no probe since)" in (heartbeat_problem(path, max_age=30, now=now) or "")


def test_no_heartbeat_a_worker_never_healthy_and_garbage_are_all_unhealthy(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    assert "no heartbeat at" in (heartbeat_problem(path) or "")
    beat(path, last_ok=None, checked=time.time(), problem="the Temporal worker is not running")
    assert "has not passed a probe yet: the Temporal worker is not running" in (heartbeat_problem(path) or "")
    path.write_text("{not json")
    assert "unreadable heartbeat" in (heartbeat_problem(path) or "")
    path.write_text("[]")
    assert "unreadable heartbeat" in (heartbeat_problem(path) or "")


async def test_the_probe_fails_when_the_worker_is_not_running_or_the_ledger_is_gone(
    temporal_env: WorkflowEnvironment, postgres_dsn: str, template_dsn: str
) -> None:
    name = f"onceflow_health_{uuid.uuid4().hex[:12]}"
    ledger = await Ledger.connect(
        await create_database(postgres_dsn, name, template="onceflow_test_template")
    )
    try:
        registry = load_agents(ROOT / "agents.yaml")
        worker = build_worker(temporal_env.client, ledger, registry, task_queue=f"health-{uuid.uuid4().hex}")
        assert await probe(temporal_env.client, ledger, worker) == "the Temporal worker is not running"
        async with worker:
            while not worker.is_running:  # its run task starts on the next turn of the loop
                await asyncio.sleep(0.05)
            assert await probe(temporal_env.client, ledger, worker) is None
            await drop_database(postgres_dsn, name)  # terminates the ledger's connections
            problem = await probe(temporal_env.client, ledger, worker)
            assert problem is not None and problem.startswith("the ledger database does not answer")
    finally:
        await ledger.close()
        await drop_database(postgres_dsn, name)


async def test_onceflow_health_passes_while_a_worker_runs_and_fails_once_it_stopped(
    temporal_env: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    health = tmp_path / "worker-health.json"
    settings = Settings(
        temporal_address=temporal_env.client.service_client.config.target_host,
        temporal_namespace=temporal_env.client.namespace,
        task_queue=f"health-{uuid.uuid4().hex}",
        database_url=database_url,
        agents_path=str(ROOT / "agents.yaml"),
        health_file=str(health),
    )
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop=stop))
    try:
        deadline = time.monotonic() + 30
        while heartbeat_problem(health) is not None:
            assert not worker.done(), f"the worker ended: {worker}"
            assert time.monotonic() < deadline, heartbeat_problem(health)
            await asyncio.sleep(0.2)
        code, output = await onceflow_health(health)
        assert (code, output.strip()) == (0, "healthy")
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)
    assert not health.exists(), "a stopped worker left its heartbeat behind"
    code, output = await onceflow_health(health)
    assert code == 1
    assert f"unhealthy: no heartbeat at {health}" in output


async def test_onceflow_health_without_a_heartbeat_file_configured_fails() -> None:
    code, output = await onceflow_health(None)
    assert code == 1
    assert "ONCEFLOW_HEALTH_FILE is not set" in output


@pytest.mark.parametrize("max_age", ["0", "-5"])
async def test_onceflow_health_rejects_a_max_age_below_one_second(max_age: str) -> None:
    process = await asyncio.create_subprocess_exec(
        ONCEFLOW,
        "health",
        "--max-age",
        max_age,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "--max-age" in stderr.decode()


async def test_the_api_probe_fails_while_nothing_answers_at_its_url(
    temporal_env: WorkflowEnvironment, ledger: Ledger
) -> None:
    url = f"http://127.0.0.1:{free_port()}/healthz"
    problem = await api_probe(temporal_env.client, ledger, url)
    assert problem is not None and problem.startswith(f"the API at {url} does not answer")


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
async def test_onceflow_health_passes_while_the_api_serves_and_fails_once_it_stopped(
    temporal_env: WorkflowEnvironment, database_url: str, tmp_path: Path, https: bool
) -> None:
    """Over HTTPS too (`--tls-cert`/`--tls-key`): the probe reaches the process's own listener,
    whose certificate names the host browsers use, and its metrics listener serves beside it."""
    from onceflow.api.options import ApiOptions
    from onceflow.api.server import serve
    from tests.support.tls import self_signed

    health = tmp_path / "api-health.json"
    settings = Settings(
        temporal_address=temporal_env.client.service_client.config.target_host,
        temporal_namespace=temporal_env.client.namespace,
        task_queue=f"health-{uuid.uuid4().hex}",
        database_url=database_url,
        agents_path=str(ROOT / "agents.yaml"),
        health_file=str(health),
    )
    stop = asyncio.Event()
    tls = self_signed(tmp_path / "tls", "console.example.test") if https else None
    port, metrics_port = free_port(), free_port()
    options = ApiOptions(metrics_port=metrics_port)
    api = asyncio.create_task(
        serve(settings, host="127.0.0.1", port=port, stop=stop, options=options, tls=tls)
    )
    try:
        deadline = time.monotonic() + 30
        while heartbeat_problem(health) is not None:
            assert not api.done(), f"the API ended: {api}"
            assert time.monotonic() < deadline, heartbeat_problem(health)
            await asyncio.sleep(0.2)
        code, output = await onceflow_health(health)
        assert (code, output.strip()) == (0, "healthy")
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            scheme = "https" if https else "http"
            assert (await http.get(f"{scheme}://127.0.0.1:{port}/healthz")).status_code == 200
            assert (await http.get(f"{scheme}://127.0.0.1:{port}/metrics")).status_code == 404
            assert (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).status_code == 200
    finally:
        stop.set()
        await asyncio.wait_for(api, 60)
    assert not health.exists(), "a stopped API left its heartbeat behind"
    code, _ = await onceflow_health(health)
    assert code == 1
