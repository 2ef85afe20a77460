"""A worker SIGKILLed while it waits for a real provider's answer: the model call is tried again on the
next worker, as often as it takes within the agent's retry budget, and the run ends as if nothing
happened. Real worker processes (`python worker.py`), the real `openai`/`anthropic` SDK, a local
wire-checking model server, the example billing service behind a proxy that counts every send.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, Status
from onceflow.runtime.client import start_run
from onceflow.sdk.keys import call_key
from onceflow.sdk.payloads import AgentRunInput
from tests.support.model_server import Answer, Call, Hang, ModelServer, Provider, serving
from tests.support.processes import ChildProcesses
from tests.support.proxy import DroppingProxy

KEY_ENV = "ONCEFLOW_TEST_MODEL_KEY"
KEY = "sk-test-kill-0123456789SECRET"
AGENTS_YAML = """\
toolsets:
  process-billing: tests.support.billing_tools:toolset
agents:
  assistant:
    model:
      provider: {provider}
      model: test-model
      base_url: {url}
      api_key_env: {key_env}
      request_timeout: 60s
      retry_budget: 5m
    instructions: You resolve billing complaints.
    toolsets: [process-billing]
    tool_policy: {{on_indeterminate: pause, reconcile_initial_interval: 0.2s, reconcile_max_interval: 1s}}
"""
KILLS = 3


# Each kill costs a heartbeat timeout (8 s): one provider in the default suite, the other under `slow`
# (the retry is Temporal's, the same for both; the wire format is covered per provider elsewhere).
@pytest.fixture(params=["openai", pytest.param("anthropic", marks=pytest.mark.slow)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[ModelServer]:
    provider: Provider = request.param
    async with serving(provider, KEY) as running:
        yield running
    assert running.problems == [], f"requests the real {provider} API would refuse: {running.problems}"


async def wait_for_requests(server: ModelServer, count: int, processes: ChildProcesses) -> None:
    for _ in range(600):
        if len(server.requests) >= count:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"the model server got {len(server.requests)} requests, not {count}\n{processes.logs_text()}")


async def test_a_worker_killed_three_times_during_one_model_call_does_not_fail_the_run(
    server: ModelServer,
    temporal_env: WorkflowEnvironment,
    ledger: Ledger,
    database_url: str,
    billing: BillingClient,
    proxy: DroppingProxy,
    tmp_path: Path,
) -> None:
    order_id = f"ord_{uuid.uuid4().hex[:10]}"
    order = await billing.get_order(order_id)
    credit = Call("issue_credit", {"account_id": order.account_id, "amount_cents": order.amount_cents})
    # The first answer hangs for every worker that asks, until the fourth.
    server.answer(*[Hang()] * KILLS, Answer(calls=(Call("lookup_order", {"order_id": order_id}),)))
    server.answer(Answer(calls=(credit,)), Answer(text="Credited."))

    agents = tmp_path / "agents.yaml"
    agents.write_text(AGENTS_YAML.format(provider=server.provider, url=server.url, key_env=KEY_ENV))
    client = temporal_env.client
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "ONCEFLOW_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_AGENTS_ENABLED": "assistant",
        "ONCEFLOW_BILLING_URL": proxy.url,
        KEY_ENV: KEY,
    }
    processes = ChildProcesses(tmp_path / "logs")
    try:
        workers: list[subprocess.Popen[bytes]] = [processes.start("worker-1", ["worker.py"], env)]
        handle = await start_run(
            client,
            AgentRunInput(agent="assistant", tenant="acme", input=json.dumps({"order_id": order_id})),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
            task_queue=env["ONCEFLOW_TASK_QUEUE"],
        )
        for kill in range(1, KILLS + 1):
            await wait_for_requests(server, kill, processes)  # this worker is waiting for the model
            processes.kill(workers[-1])
            workers.append(processes.start(f"worker-{kill + 1}", ["worker.py"], env))
        try:
            result = await asyncio.wait_for(handle.result(), 90)
        except TimeoutError:
            pytest.fail(f"the run did not finish\n{processes.logs_text()}")
    finally:
        processes.close()

    assert result.final == "Credited."
    assert len(server.requests) == KILLS + 3  # the hung first turn four times, then two more turns
    key = call_key(handle.id, result.calls[-1].tool_call_id)
    assert (await ledger.get(key)).status is Status.COMPLETED
    # One send of the credit, whatever happened before, counted where it arrives.
    sent = (await billing.received_counts()).counts
    assert {k: n for k, n in sent.items() if k.startswith(f"{handle.id}:")} == {key: 1}
    assert (await billing.effects()).count(key) == 1
