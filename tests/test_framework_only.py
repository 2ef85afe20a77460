"""A deployment whose agents are all another framework's needs no agents.yaml: onceflow's worker,
`onceflow api` and its console start without one, each a real process in a folder that has none,
against the real Temporal dev server and PostgreSQL. An agents file may also list toolsets and no
agent. A missing file that ONCEFLOW_AGENTS names explicitly is still refused, naming it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.runtime.agents import load_agents
from onceflow.runtime.config import Settings
from onceflow.runtime.worker import check_configuration, run_worker
from tests.support.processes import free_port

REPO = Path(__file__).resolve().parent.parent
ONCEFLOW = Path(sys.executable).parent / "onceflow"


def _environment(temporal_env: WorkflowEnvironment, database_url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "TEMPORAL_", "OTEL_"))}
    return {
        **clean,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": temporal_env.client.namespace,
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:8]}",
    }


async def _until_line(stream: asyncio.StreamReader, fragment: str, seen: list[str]) -> None:
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError(f"ended before {fragment!r}:\n{''.join(seen)}")
        seen.append(line)
        if fragment in line:
            return


async def test_the_worker_and_the_api_with_its_console_start_in_a_folder_without_agents_yaml(
    temporal_env: WorkflowEnvironment, database_url: str, tmp_path: Path
) -> None:
    assert not (tmp_path / "agents.yaml").exists()
    env = _environment(temporal_env, database_url)
    port = free_port()
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "worker.py"),
        cwd=tmp_path,
        env=env,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    api = await asyncio.create_subprocess_exec(
        str(ONCEFLOW),
        "api",
        cwd=tmp_path,
        env={**env, "ONCEFLOW_API_PORT": str(port)},
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    worker_log: list[str] = []
    api_log: list[str] = []
    try:
        assert worker.stderr is not None and api.stderr is not None
        await asyncio.wait_for(_until_line(worker.stderr, "polling task queue", worker_log), 60)
        assert "agents: none" in worker_log[-1]
        await asyncio.wait_for(_until_line(api.stderr, "operator API on", api_log), 60)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            for _ in range(100):
                try:
                    if (await http.get("/healthz")).is_success:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            assert (await http.get("/healthz")).status_code == 200
            sign_in = await http.get("/console/sign-in")
            assert sign_in.status_code == 200 and "<form" in sign_in.text
    finally:
        for process in (worker, api):
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in (worker, api):
            await asyncio.wait_for(process.wait(), 60)
    assert "Traceback" not in "".join(worker_log + api_log)


def test_an_agents_file_may_list_toolsets_and_no_agent(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text("toolsets:\n  test-billing: tests.support.downstream:toolset\n")
    assert load_agents(path).agents == {}


async def test_a_missing_file_named_by_onceflow_agents_is_still_refused_naming_it(tmp_path: Path) -> None:
    named = tmp_path / "team-agents.yaml"
    settings = Settings(
        temporal_address="127.0.0.1:1",
        temporal_namespace="default",
        task_queue="never-served",
        database_url="postgresql://onceflow@127.0.0.1:1/never_reached",
        agents_path=str(named),
    )
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings)
    assert f"cannot start the worker: {named}: cannot read" in str(stopped.value.code)


def test_worker_check_says_the_default_file_is_absent_and_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    problem, summary = check_configuration(
        Settings(
            temporal_address="127.0.0.1:1",
            temporal_namespace="default",
            task_queue="never-served",
            database_url="",
            agents_path="agents.yaml",
        )
    )
    assert problem is None
    assert summary == "agents.yaml: absent; the worker serves no onceflow agents"
