"""OnceflowPlugin in a team's own Temporal client and worker, with each framework's own plugin.

On a Temporal server that lacks onceflow's search attributes (a dev server started without
`--search-attribute`, one namespace per test), a worker either registers them before it polls, or
refuses to start with an error naming them and the `temporal` commands that add them: never a run
whose every workflow task fails on `BadSearchAttributes` while the worker log only warns. The
commands the refusal prints are then run as printed, and the same worker starts and runs. Both
frameworks, with the plugins in either order. Real parts: the Temporal dev server, PostgreSQL, each
framework's own agent loop; effects counted at the in-process downstream, which honours no key.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow import OnceflowPlugin, OnceflowStartupError
from onceflow.ledger import Ledger, Status, migrate
from onceflow.local.postgres import create_database, drop_database
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from tests.conftest import temporal_cli
from tests.support.downstream import DOWNSTREAM
from tests.support.openai_agents_support import OPENAI_WRITES, lookup_order, openai_agents_plugin
from tests.support.openai_agents_workflow import OpenAIBillingWorkflow
from tests.support.pydantic_ai_agents import AGENT, WRITES, AdapterRunInput
from tests.support.pydantic_ai_workflow import PydanticBillingWorkflow

FRAMEWORKS = ("pydantic_ai", "openai_agents")
NAMESPACES = [f"{framework}-{mode}" for framework in FRAMEWORKS for mode in ("check", "register")]
CREDIT = {"tool": "issue_credit", "args": {"account_id": "acct_o1", "amount_cents": 500}, "id": "c1"}


@pytest.fixture(scope="module")
async def bare_temporal() -> AsyncIterator[str]:
    """A dev server started without onceflow's search attributes; one namespace per test below
    (search attributes are kept per namespace). Yields its address."""
    extra = [arg for namespace in NAMESPACES for arg in ("--namespace", namespace)]
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), dev_server_extra_args=extra, dev_server_log_level="error"
    )
    yield env.client.service_client.config.target_host
    await env.shutdown()


async def _custom_attributes(address: str, namespace: str) -> set[str]:
    client = await Client.connect(address, namespace=namespace)
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    return set(listed.custom_attributes)


@asynccontextmanager
async def framework_worker(
    framework: str, address: str, namespace: str, onceflow: OnceflowPlugin, *, onceflow_first: bool
) -> AsyncIterator[tuple[Client, Worker]]:
    """A worker as docs/adapters.md builds it for `framework`: both plugins on the client."""
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    if framework == "pydantic_ai":
        theirs: Any = PydanticAIPlugin()
        workflows: list[type] = [PydanticBillingWorkflow]
        worker_plugins: list[Any] = [AgentPlugin(AGENT)]
        activities: list[Any] = []
    else:
        theirs = openai_agents_plugin()
        workflows = [OpenAIBillingWorkflow]
        worker_plugins = []
        activities = [lookup_order]
    plugins = [onceflow, theirs] if onceflow_first else [theirs, onceflow]
    client = await Client.connect(address, namespace=namespace, plugins=plugins)
    worker = Worker(
        client, task_queue=task_queue, workflows=workflows, activities=activities, plugins=worker_plugins
    )
    yield client, worker


async def _one_credit(framework: str, client: Client, worker: Worker) -> tuple[str, dict[str, Any]]:
    run = PydanticBillingWorkflow.run if framework == "pydantic_ai" else OpenAIBillingWorkflow.run
    handle = await client.start_workflow(
        run,
        AdapterRunInput(tenant="acme", script=[[CREDIT]]),
        id=f"{framework}-{uuid.uuid4().hex[:8]}",
        task_queue=worker.task_queue,
    )
    result = json.loads(await asyncio.wait_for(handle.result(), 60))
    return handle.id, result


def _writes(framework: str) -> Any:
    return WRITES if framework == "pydantic_ai" else OPENAI_WRITES


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_worker_refuses_to_start_on_a_namespace_without_the_search_attributes_naming_the_commands(
    bare_temporal: str, database_url: str, ledger: Ledger, framework: str
) -> None:
    DOWNSTREAM.reset()
    namespace = f"{framework}-check"
    onceflow = OnceflowPlugin(database_url, agents=[_writes(framework)], search_attributes="check")
    async with framework_worker(
        framework, bare_temporal, namespace, onceflow, onceflow_first=framework == "pydantic_ai"
    ) as (client, worker):
        with pytest.raises(OnceflowStartupError) as refused:
            async with worker:
                await asyncio.sleep(30)  # never reached: the refusal ends the block
    message = str(refused.value)
    assert f"namespace {namespace!r} lacks the search attributes" in message
    for key in SEARCH_ATTRIBUTES:
        assert key.name in message
    commands = [line.strip() for line in message.splitlines() if line.strip().startswith("temporal ")]
    assert len(commands) == len(SEARCH_ATTRIBUTES)  # one each: the CLI creates one per command
    assert await _custom_attributes(bare_temporal, namespace) == set()  # "check" added nothing

    # The commands work as printed (plus the server's address), and then the same setup serves.
    for command in commands:
        argv = [temporal_cli(), *shlex.split(command)[1:], "--address", bare_temporal]
        done = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(done.communicate(), 60)
        assert done.returncode == 0, stderr.decode()
    assert {key.name for key in SEARCH_ATTRIBUTES} <= await _custom_attributes(bare_temporal, namespace)
    onceflow = OnceflowPlugin(database_url, agents=[_writes(framework)], search_attributes="check")
    async with framework_worker(framework, bare_temporal, namespace, onceflow, onceflow_first=False) as (
        client,
        worker,
    ):
        async with worker:
            run_id, result = await _one_credit(framework, client, worker)
    assert result["results"][0]["ok"] is True
    assert DOWNSTREAM.received == {f"{run_id}:c1": 1}
    assert (await ledger.get(f"{run_id}:c1", with_events=False)).status is Status.COMPLETED


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_worker_registers_the_search_attributes_it_lacks_then_serves(
    bare_temporal: str, database_url: str, ledger: Ledger, framework: str
) -> None:
    DOWNSTREAM.reset()
    namespace = f"{framework}-register"
    assert await _custom_attributes(bare_temporal, namespace) == set()
    onceflow = OnceflowPlugin(database_url, agents=[_writes(framework)])  # "register" is the default
    async with framework_worker(
        framework, bare_temporal, namespace, onceflow, onceflow_first=framework == "openai_agents"
    ) as (client, worker):
        async with worker:
            run_id, result = await _one_credit(framework, client, worker)
            attributes = (await client.get_workflow_handle(run_id).describe()).typed_search_attributes
    assert {key.name for key in SEARCH_ATTRIBUTES} <= await _custom_attributes(bare_temporal, namespace)
    assert result["results"][0]["ok"] is True
    assert DOWNSTREAM.received == {f"{run_id}:c1": 1}
    assert attributes.get(SEARCH_ATTRIBUTES[0]) == "completed"  # OnceflowPhase, set by the run


async def test_migrate_false_refuses_a_ledger_behind_the_code_then_serves_once_migrated(
    temporal_env: WorkflowEnvironment, postgres_dsn: str
) -> None:
    name = f"onceflow_plugin_{uuid.uuid4().hex[:8]}"
    dsn = await create_database(postgres_dsn, name)  # empty: not migrated
    try:
        onceflow = OnceflowPlugin(dsn, agents=[WRITES], migrate=False)
        client = await Client.connect(
            temporal_env.client.service_client.config.target_host,
            namespace=temporal_env.client.namespace,
            plugins=[onceflow],
        )
        worker = Worker(client, task_queue=f"tq-{uuid.uuid4().hex[:8]}", workflows=[PydanticBillingWorkflow])
        with pytest.raises(OnceflowStartupError) as refused:
            await worker.run()
        message = str(refused.value)
        assert "the ledger's schema is behind" in message and "0001_" in message
        assert "onceflow migrate" in message
        await migrate(dsn)
        worker = Worker(client, task_queue=f"tq-{uuid.uuid4().hex[:8]}", workflows=[PydanticBillingWorkflow])
        async with worker:
            await asyncio.wait_for(onceflow.ready.wait(), 30)
        assert not onceflow.ledger.is_open  # closed with its last worker
    finally:
        await drop_database(postgres_dsn, name)


async def test_the_production_profile_stops_a_plugin_worker_on_a_ledger_that_can_lose_writes(
    temporal_env: WorkflowEnvironment, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test's PostgreSQL has no synchronous standby: under ONCEFLOW_PROFILE=production a worker
    hosting onceflow through the plugin alone refuses to poll, naming the setting; declared as a
    managed service's copy, the same worker starts."""
    monkeypatch.setenv("ONCEFLOW_PROFILE", "production")
    onceflow = OnceflowPlugin(database_url, agents=[WRITES])
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        namespace=temporal_env.client.namespace,
        plugins=[onceflow],
    )
    worker = Worker(client, task_queue=f"tq-{uuid.uuid4().hex[:8]}", workflows=[PydanticBillingWorkflow])
    with pytest.raises(OnceflowStartupError, match="synchronous_standby") as refused:
        await worker.run()
    assert "production" in str(refused.value) and not onceflow.ready.is_set()
    assert not onceflow.ledger.is_open

    monkeypatch.setenv("ONCEFLOW_LEDGER_REPLICATION", "managed")
    worker = Worker(client, task_queue=f"tq-{uuid.uuid4().hex[:8]}", workflows=[PydanticBillingWorkflow])
    async with worker:
        await asyncio.wait_for(onceflow.ready.wait(), 30)


async def test_a_worker_whose_client_cannot_carry_onceflows_payloads_is_refused_when_built(
    temporal_env: WorkflowEnvironment, database_url: str
) -> None:
    plain = await Client.connect(
        temporal_env.client.service_client.config.target_host, namespace=temporal_env.client.namespace
    )
    with pytest.raises(ValueError, match="Put OnceflowPlugin on the client"):
        Worker(plain, task_queue="never-polled", plugins=[OnceflowPlugin(database_url, agents=[WRITES])])


def test_agents_declared_without_a_tool_policy_take_the_plugins_and_its_default_is_fail(
    tmp_path: Path,
) -> None:
    from onceflow.adapters.host import WriteTools
    from tests.support.downstream import issue_credit

    chosen_by_plugin = WriteTools([issue_credit], agent="policy-from-plugin")
    own = WriteTools([issue_credit], agent="own-policy", tool_policy={"on_indeterminate": "fail"})
    assert chosen_by_plugin.spec.policy.on_indeterminate == "fail"  # agents.yaml's default
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(
        "toolsets: {billing: tests.support.downstream:toolset}\n"
        "agents:\n"
        "  unset: {model: {provider: scripted, script: [{final: x}]}, toolsets: [billing]}\n"
        "  set:\n"
        "    model: {provider: scripted, script: [{final: x}]}\n"
        "    toolsets: [billing]\n"
        "    tool_policy: {on_indeterminate: fail}\n"
    )
    plugin = OnceflowPlugin(
        agents=[chosen_by_plugin, own, agents_file], tool_policy={"on_indeterminate": "pause"}
    )
    assert chosen_by_plugin.spec.policy.on_indeterminate == "pause"
    assert own.spec.policy.on_indeterminate == "fail"
    assert plugin.registry.agent("unset").spec().policy.on_indeterminate == "pause"
    assert plugin.registry.agent("set").spec().policy.on_indeterminate == "fail"
    assert sorted(plugin.registry.agents) == ["own-policy", "policy-from-plugin", "set", "unset"]
    with pytest.raises(ValueError, match="different defaults"):
        OnceflowPlugin(agents=[chosen_by_plugin], tool_policy={"on_indeterminate": "fail"})


async def test_on_a_client_the_plugin_brings_a_converter_for_its_payloads_and_tracing_beside_either_framework(
    temporal_env: WorkflowEnvironment, database_url: str
) -> None:
    from temporalio.contrib.opentelemetry import TracingInterceptor
    from temporalio.contrib.pydantic import PydanticPayloadConverter

    from onceflow.adapters.heard import OnceflowInterceptor
    from onceflow.workflows import ALL_WORKFLOWS

    address = temporal_env.client.service_client.config.target_host

    async def client_with(*plugins: Any) -> Client:
        return await Client.connect(address, namespace=temporal_env.client.namespace, plugins=list(plugins))

    def converter(client: Client) -> str:
        return client.data_converter.payload_converter_class.__name__

    def tracing(client: Client) -> int:
        interceptors = client.config(active_config=True).get("interceptors") or []
        return sum(isinstance(i, TracingInterceptor) for i in interceptors)

    alone = await client_with(OnceflowPlugin())
    assert alone.data_converter.payload_converter_class is PydanticPayloadConverter and tracing(alone) == 1
    # The frameworks' converters carry pydantic models too; OpenAI's refuses to follow another one.
    for plugins in ([openai_agents_plugin(), OnceflowPlugin()], [OnceflowPlugin(), openai_agents_plugin()]):
        assert converter(await client_with(*plugins)) == "OpenAIPayloadConverter"
    for plugins in ([PydanticAIPlugin(), OnceflowPlugin()], [OnceflowPlugin(), PydanticAIPlugin()]):
        assert converter(await client_with(*plugins)) == "PydanticAIPayloadConverter"

    onceflow = OnceflowPlugin(database_url, agents=[WRITES])
    worker = Worker(
        await client_with(onceflow), task_queue="never-polled", workflows=[PydanticBillingWorkflow]
    )
    config = worker.config(active_config=True)
    assert set(ALL_WORKFLOWS) <= set(config.get("workflows") or [])
    names = {getattr(fn, "__name__", "") for fn in config.get("activities") or []}
    assert {"run_write_tool", "inspect_call", "reconcile_call", "run_compensation"} <= names
    assert [type(i) for i in config.get("interceptors") or []] == [
        OnceflowInterceptor
    ]  # tracing: the client's
    assert not onceflow.ledger.is_open  # reached only when a worker starts
