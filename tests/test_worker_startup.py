"""The worker checks its configuration before it serves, and stops with a message that says where the
problem is (file, agent) and what it is. A worker that starts is a worker whose tools keep the contract."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import migrate
from onceflow.local.postgres import create_database, drop_database
from onceflow.runtime.agents import load_agents
from onceflow.runtime.config import Settings
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from onceflow.runtime.worker import open_agents_and_ledger, run_worker
from tests.conftest import temporal_cli

REPO = Path(__file__).resolve().parent.parent

# Never reached: agents.yaml is checked before the database is.
UNREACHABLE_DATABASE = "postgresql://onceflow@127.0.0.1:1/never_reached"

VALID = """\
toolsets:
  test-billing: tests.support.downstream:toolset
  retried-write: tests.support.bad_tools:retried_write
  key-argument: tests.support.bad_tools:key_argument
agents:
  clerk:
    model: {provider: scripted, script: [{final: done}]}
    toolsets: [test-billing]
    tool_policy: {on_indeterminate: pause}
"""

# Each case is VALID with one line changed, and the fragments the message must contain.
BROKEN = {
    "malformed-yaml": (
        "    model: {provider: scripted, script: [{final: done}]}",
        "    model: {provider: scripted, script: [{final: done}]",
        ["agent 'clerk'", "not valid YAML at line 8, column 5", "expected ',' or '}'"],
    ),
    "invalid-policy": (
        "    tool_policy: {on_indeterminate: pause}",
        "    tool_policy: {on_indeterminate: sometimes}",
        ["agent 'clerk'", "on_indeterminate", "'pause' or 'fail'"],
    ),
    "unknown-toolset": (
        "    toolsets: [test-billing]",
        "    toolsets: [test-billing, payroll]",
        ["agent 'clerk'", "unknown toolset 'payroll'"],
    ),
    "write-with-three-attempts": (
        "    toolsets: [test-billing]",
        "    toolsets: [retried-write]",
        ["agent 'clerk'", "retried-write.change_address", "attempted 3 times"],
    ),
    "key-like-argument": (
        "    toolsets: [test-billing]",
        "    toolsets: [key-argument]",
        ["agent 'clerk'", "key-argument.send_invoice", "idempotency_key", "look like an idempotency key"],
    ),
}


def broken_file(tmp_path: Path, case: str) -> tuple[Path, list[str]]:
    line, replacement, fragments = BROKEN[case]
    assert VALID.count(line) == 1
    path = tmp_path / f"{case}.yaml"
    path.write_text(VALID.replace(line, replacement))
    return path, fragments


def settings(agents: Path, database_url: str = UNREACHABLE_DATABASE) -> Settings:
    return Settings(
        temporal_address="127.0.0.1:1",
        temporal_namespace="default",
        task_queue="never-served",
        database_url=database_url,
        agents_path=str(agents),
    )


def test_the_valid_file_the_cases_start_from_loads(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(VALID)
    assert sorted(load_agents(path).agents) == ["clerk"]


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_worker_refuses_to_start_naming_the_file_the_agent_and_the_problem(
    tmp_path: Path, case: str
) -> None:
    path, fragments = broken_file(tmp_path, case)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path))
    message = str(stopped.value.code)
    assert message.startswith(f"cannot start the worker: {path}")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


async def test_worker_refuses_to_start_without_a_database_url(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(VALID)
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings(path, database_url=""))
    assert "ONCEFLOW_DATABASE_URL is not set" in str(stopped.value.code)


async def test_worker_process_exits_with_the_message_and_no_traceback(tmp_path: Path) -> None:
    path, _ = broken_file(tmp_path, "key-like-argument")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "TEMPORAL_"))}
    cases = {
        "contract": {
            **environment,
            "ONCEFLOW_AGENTS": str(path),
            "ONCEFLOW_DATABASE_URL": UNREACHABLE_DATABASE,
        },
        "database": {**environment, "ONCEFLOW_AGENTS": str(path)},
    }

    async def worker(env: dict[str, str]) -> tuple[int | None, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "worker.py",
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
        return process.returncode, stderr.decode()

    (contract_code, contract), (database_code, database) = await asyncio.gather(
        *(worker(env) for env in cases.values())
    )
    assert contract_code == 1
    assert f"cannot start the worker: {path}, agent 'clerk'" in contract
    assert "send_invoice" in contract
    assert database_code == 1
    assert "ONCEFLOW_DATABASE_URL is not set" in database
    assert "Traceback" not in contract + database


# -- `onceflow worker --check`: the same checks, with no Temporal and no database ---------------------


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_worker_check_reports_what_the_worker_would_refuse(tmp_path: Path, case: str) -> None:
    from onceflow.runtime.worker import check_configuration

    path, fragments = broken_file(tmp_path, case)
    problem, summary = check_configuration(settings(path, database_url=""))
    assert problem is not None and problem.startswith(f"cannot start the worker: {path}")
    for fragment in fragments:
        assert fragment in problem
    assert summary == ""


async def test_worker_check_exits_0_on_a_good_file_and_1_on_a_bad_one_without_a_traceback(
    tmp_path: Path,
) -> None:
    good = tmp_path / "agents.yaml"
    good.write_text(VALID)
    bad, _ = broken_file(tmp_path, "write-with-three-attempts")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "TEMPORAL_"))}

    async def check(agents: Path) -> tuple[int | None, str, str]:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "onceflow"),
            "worker",
            "--check",
            cwd=REPO,  # the test toolsets import from tests.support
            env={**environment, "ONCEFLOW_AGENTS": str(agents), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode, stdout.decode(), stderr.decode()

    (good_code, good_out, _), (bad_code, _, bad_err) = await asyncio.gather(check(good), check(bad))
    assert good_code == 0
    assert f"{good}: 1 agent(s) (clerk)" in good_out
    assert bad_code == 1
    assert "retried-write.change_address" in bad_err and "attempted 3 times" in bad_err
    assert "Traceback" not in bad_err


# -- ONCEFLOW_MIGRATE and ONCEFLOW_SEARCH_ATTRIBUTES: a worker that only checks what it may not change --


async def _tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_a_worker_that_only_checks_the_schema_refuses_a_ledger_behind_it_and_changes_nothing(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """ONCEFLOW_MIGRATE=check, for deployments whose worker role may not change the schema: a ledger
    the code is ahead of stops the worker with what to run, and the database is left as it was."""
    name = f"onceflow_unmigrated_{uuid.uuid4().hex[:8]}"
    fresh = await create_database(postgres_dsn, name)
    try:
        agents = tmp_path / "agents.yaml"
        agents.write_text(VALID)
        only_check = dataclasses.replace(settings(agents, fresh), migrate="check")
        with pytest.raises(SystemExit) as refused:
            await run_worker(only_check)
        message = str(refused.value)
        assert "the ledger's schema is behind this onceflow" in message
        assert "onceflow migrate" in message and "ONCEFLOW_MIGRATE=apply" in message
        assert await _tables(fresh) == set()  # nothing created
        await migrate(fresh)  # as `onceflow migrate` does
        registry, ledger = await open_agents_and_ledger(only_check, "worker")
        await ledger.close()
        assert set(registry.agents) == {"clerk"}
    finally:
        await drop_database(postgres_dsn, name)


@pytest.mark.parametrize(
    ("variable", "field", "value"),
    [
        ("ONCEFLOW_MIGRATE", "migrate", "sometimes"),
        ("ONCEFLOW_SEARCH_ATTRIBUTES", "search_attributes", "add"),
    ],
)
async def test_a_start_mode_that_is_neither_is_refused_before_anything_is_reached(
    tmp_path: Path, variable: str, field: str, value: str
) -> None:
    base = settings(tmp_path / "agents.yaml")
    wrong = (
        dataclasses.replace(base, migrate=value)
        if field == "migrate"
        else dataclasses.replace(base, search_attributes=value)
    )
    with pytest.raises(SystemExit) as refused:
        await run_worker(wrong)  # the database is unreachable: refused before it is tried
    assert f"{variable} must be" in str(refused.value) and repr(value) in str(refused.value)


async def test_a_worker_that_only_checks_search_attributes_refuses_a_namespace_without_them(
    database_url: str, tmp_path: Path
) -> None:
    """ONCEFLOW_SEARCH_ATTRIBUTES=check, for namespaces whose attributes an administrator adds (as
    docker-compose.yml's register-search-attributes does): missing ones stop the worker, named,
    and nothing is added."""
    namespace = "onceflow-check-only"
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=["--namespace", namespace],
        dev_server_log_level="error",
    )
    try:
        address = env.client.service_client.config.target_host
        agents = tmp_path / "agents.yaml"
        agents.write_text(VALID)
        only_check = dataclasses.replace(
            settings(agents, database_url),
            temporal_address=address,
            temporal_namespace=namespace,
            search_attributes="check",
        )
        # Were it to serve, it would stop after a minute and the test fail, not hang. (Not under
        # asyncio.wait_for: a SystemExit inside a task leaves the event loop instead.)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(60, stop.set)
        with pytest.raises(SystemExit) as refused:
            await run_worker(only_check, stop=stop)
        assert f"namespace {namespace!r} lacks the search attributes" in str(refused.value)
        client = await Client.connect(address, namespace=namespace)
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        assert not {key.name for key in SEARCH_ATTRIBUTES} & set(listed.custom_attributes)
    finally:
        await env.shutdown()
