"""The worker starts MCP servers before it serves, and refuses to serve, naming the server and the
problem, when one does not start or does not offer what agents.yaml relies on. `onceflow mcp inspect`
shows what each tool would become. Real server processes (examples/billing_mcp)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from onceflow.cli.commands import app
from onceflow.ledger import Ledger, Status
from onceflow.mcp.runtime import McpStartupError, mcp_toolsets
from onceflow.runtime.agents import AgentConfigError, build_registry
from onceflow.runtime.client import start_run
from onceflow.runtime.config import Settings
from onceflow.runtime.worker import run_worker
from onceflow.sdk.payloads import AgentRunInput
from tests.support.mcp_servers import CREDIT_SCRIPT, agent, received, stdio_server, wait_until


def _agents(server: dict[str, Any], name: str = "billing-mcp") -> dict[str, Any]:
    return {"mcp_servers": {name: server}, "agents": {"clerk": agent(CREDIT_SCRIPT, [name])}}


async def test_worker_refuses_to_start_when_a_server_does_not_start(
    tmp_path: Path, database_url: str
) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(_agents({"command": str(tmp_path / "no-such-server")})))
    settings = Settings("127.0.0.1:1", "default", "never-served", database_url, str(path))
    with pytest.raises(SystemExit) as stopped:
        await run_worker(settings)
    message = str(stopped.value.code)
    assert message.startswith("cannot start the worker: MCP server 'billing-mcp': cannot start or reach it")
    assert "no-such-server" in message


async def test_a_server_exiting_before_it_initializes_is_a_clear_start_up_error(tmp_path: Path) -> None:
    registry = build_registry(_agents({"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}))
    with pytest.raises(
        McpStartupError,
        match="MCP server 'billing-mcp': cannot start or reach it: MCPError: Connection closed",
    ):
        async with mcp_toolsets(registry):
            pass


async def test_start_up_names_missing_tools_and_a_lookup_that_is_not_a_read(tmp_path: Path) -> None:
    server = stdio_server(
        tmp_path,
        "billing",
        allow=["lookup_order", "refund_everything"],
        tools={"send_statement": {"reconcile": "issue_credit"}},
    )
    registry = build_registry(_agents(server))
    with pytest.raises(McpStartupError) as refused:
        async with mcp_toolsets(registry):
            pass
    message = str(refused.value)
    assert "agents.yaml names tool 'refund_everything', which the server does not list" in message
    assert "'issue_credit' is the reconcile lookup for 'send_statement' but is classified external" in message
    assert "lookup 'issue_credit' takes no 'idempotency_key' argument" in message


async def test_a_tool_with_a_key_like_argument_is_not_offered_to_the_model(tmp_path: Path) -> None:
    registry = build_registry(_agents(stdio_server(tmp_path, "billing", allow=["find_credit"])))
    with pytest.raises(AgentConfigError) as refused:
        async with mcp_toolsets(registry):
            pass
    message = str(refused.value)
    assert "tool billing-mcp.find_credit breaks the contract" in message
    assert "idempotency_key look like an idempotency key" in message
    assert "leave it out with `allow`" in message


async def test_an_unset_header_variable_stops_start_up_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ONCEFLOW_TEST_UNSET", raising=False)
    server = {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${ONCEFLOW_TEST_UNSET}"}}
    with pytest.raises(McpStartupError, match=r"headers.Authorization uses \$\{ONCEFLOW_TEST_UNSET\}"):
        async with mcp_toolsets(build_registry(_agents(server))):
            pass


def test_inspect_prints_each_tool_with_its_class_and_why(tmp_path: Path) -> None:
    server = stdio_server(
        tmp_path,
        "billing",
        tools={
            "issue_credit": {"reconcile": "find_credit", "dedup_window": "24h"},
            "send_statement": {"effect": "write"},
        },
    )
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(_agents(server)))
    runner = CliRunner()
    shown = runner.invoke(app, ["mcp", "inspect", "billing-mcp", "--agents", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    tools = {tool["name"]: tool for tool in report["tools"]}
    assert {name: (t["class"], t["attempts"], t["offered"]) for name, t in tools.items()} == {
        "lookup_order": ("read", 3, True),
        "credit_allowance": ("read", 3, True),
        "issue_credit": ("external", 1, True),
        "find_credit": ("read", 3, False),
        "send_statement": ("write", 1, True),
    }
    assert tools["issue_credit"]["why"] == "readOnlyHint=false, destructiveHint=false, openWorldHint=true"
    assert tools["issue_credit"]["reconcile"] == "find_credit"
    assert tools["issue_credit"]["dedup_window_seconds"] == 24 * 3600
    assert tools["lookup_order"]["dedup_window_seconds"] is None
    assert tools["find_credit"]["note"] == "reconcile lookup for issue_credit, not offered to the model"
    assert tools["send_statement"]["why"].startswith(
        "agents.yaml sets effect: write (server says: readOnlyHint=true"
    )
    text = runner.invoke(app, ["mcp", "inspect", "billing-mcp", "--agents", str(path)])
    assert text.exit_code == 0
    assert "issue_credit         external     1 attempt" in text.stdout
    assert "may be re-sent with its key within 86400s" in text.stdout
    missing = runner.invoke(app, ["mcp", "inspect", "payroll", "--agents", str(path)])
    assert missing.exit_code == 2
    assert "declares no MCP server 'payroll' (declared: billing-mcp)" in missing.output


async def test_the_worker_process_serves_mcp_tools_from_agents_yaml_and_stops_the_server_on_exit(
    tmp_path: Path, temporal_env: WorkflowEnvironment, database_url: str
) -> None:
    path = tmp_path / "agents.yaml"
    server = stdio_server(tmp_path, "billing", tools={"issue_credit": {"reconcile": "find_credit"}})
    path.write_text(yaml.safe_dump(_agents(server)))
    target = temporal_env.client.service_client.config.target_host
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(Settings(target, "default", task_queue, database_url, str(path)), stop=stop)
    )
    try:
        handle = await start_run(
            temporal_env.client,
            AgentRunInput(agent="clerk", tenant="acme", input=json.dumps({"order_id": "ord_worker"})),
            run_id=f"run-{uuid.uuid4().hex[:10]}",
            task_queue=task_queue,
        )
        await asyncio.wait_for(handle.result(), 90)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
    key = f"{handle.id}:call_1_0"
    ledger = await Ledger.connect(database_url)
    try:
        assert (await ledger.get(key)).status is Status.COMPLETED
    finally:
        await ledger.close()
    assert received(tmp_path, "billing", key) == 1
    pid = int((tmp_path / "billing.pid").read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_until(gone, timeout=10, what="the MCP server to exit with the worker")


async def test_without_the_sdk_installed_a_declared_server_stops_start_up_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if `pip install onceflow` without the `mcp` extra: importing the SDK fails.
    monkeypatch.setitem(sys.modules, "mcp", None)
    registry = build_registry(_agents({"command": sys.executable}))
    with pytest.raises(
        McpStartupError, match=r"MCP toolsets need the official SDK: pip install 'onceflow\[mcp\]'"
    ):
        async with mcp_toolsets(registry):
            pass


async def test_every_server_that_fails_to_start_is_named_in_one_error(tmp_path: Path) -> None:
    registry = build_registry(
        {
            "mcp_servers": {
                "first": {"command": str(tmp_path / "missing-one")},
                "second": {"command": str(tmp_path / "missing-two")},
            },
            "agents": {"clerk": agent(CREDIT_SCRIPT, ["first", "second"])},
        }
    )
    with pytest.raises(McpStartupError) as refused:
        async with mcp_toolsets(registry):
            pass
    message = str(refused.value)
    assert message.startswith("MCP server 'first': cannot start or reach it")
    assert "; and MCP server 'second': cannot start or reach it" in message
    assert "missing-two" in message
