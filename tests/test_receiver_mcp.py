"""The receiver kit for MCP servers (onceflow.receiver.mcp), against a real server on it
(examples/refunds_mcp, a process over stdio, a PostgreSQL database of its own) through the official
SDK's client (onceflow's own McpConnection):

- a keyed tool takes its key from `_meta` with the HTTP form's semantics: the result replayed (and
  marked) for the same key and arguments, refusals named in `_meta` (missing key, key reused with
  other arguments, key in progress, key fenced), one refund per key in the server's own table;
- lookup and fence are tools, with honest annotations (the lookup read-only);
- onceflow, told `receiver: kit` in agents.yaml, settles an unknown call through them by itself.

Each test judges from the server's own refunds table and what the server answered.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.refunds_mcp.server import FAULTS_ENV, refunds_of
from onceflow.ledger import FailureKind, Ledger, Status
from onceflow.mcp.config import McpServerConfig
from onceflow.mcp.connection import McpConnection
from onceflow.mcp.meta import IDEMPOTENCY_META_KEY, RECEIVER_PROBLEM_META_KEY, REPLAYED_META_KEY
from onceflow.mcp.runtime import mcp_toolsets
from onceflow.runtime.agents import build_registry
from tests.support.mcp_servers import FAST_RECONCILE
from tests.workflow_harness import running_worker

# ord_fail's refund is written, then fails after 3 s: nothing commits.
FAULTS = {"ord_fail": {"mode": "fail_after", "delay_seconds": 3}}


@pytest.fixture(scope="module")
async def refunds_database(postgres_dsn: str) -> AsyncIterator[str]:
    from onceflow.local.postgres import create_database, drop_database

    name = f"refunds_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


def server_config(database_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "onceflow.examples.refunds_mcp", "--database-url", database_url],
        "env": {FAULTS_ENV: json.dumps(FAULTS)},
        **extra,
    }


@pytest.fixture(scope="module")
async def connection(refunds_database: str) -> AsyncIterator[McpConnection]:
    opened = McpConnection("refunds", McpServerConfig.model_validate(server_config(refunds_database)))
    try:
        yield opened
    finally:
        await opened.aclose()


async def call(connection: McpConnection, tool: str, arguments: dict[str, Any], key: str | None) -> Any:
    client = await connection.session()
    meta = {IDEMPOTENCY_META_KEY: key} if key is not None else None
    return await connection.call_tool(client, tool, arguments, meta)


def new_key() -> str:
    return f"run-{uuid.uuid4().hex[:12]}:call_1_0"


def problem(result: Any) -> str | None:
    assert result.is_error, result
    found: str | None = (result.meta or {}).get(RECEIVER_PROBLEM_META_KEY)
    return found


async def test_protocol_tools_are_listed_with_honest_annotations(connection: McpConnection) -> None:
    listed = {tool.name: tool for tool in await connection.list_tools()}
    lookup, fence = listed["onceflow_key_lookup"].annotations, listed["onceflow_key_fence"].annotations
    assert lookup is not None and lookup.read_only_hint is True and lookup.destructive_hint is False
    assert fence is not None and fence.read_only_hint is False and fence.destructive_hint is False
    assert fence.idempotent_hint is True and lookup.idempotent_hint is True
    refund = listed["issue_refund"]
    assert refund.annotations is not None and refund.annotations.read_only_hint is False
    # The key is never an argument: the model cannot choose it.
    assert set(refund.input_schema["properties"]) == {"order_id", "cents"}


async def test_a_keyed_tool_applies_once_and_replays_its_result(
    connection: McpConnection, refunds_database: str
) -> None:
    key = new_key()
    arguments = {"order_id": "ord_a", "cents": 500}
    first = await call(connection, "issue_refund", arguments, key)
    assert not first.is_error and first.structured_content["idempotency_key"] == key
    again = await call(connection, "issue_refund", arguments, key)
    assert (again.meta or {}).get(REPLAYED_META_KEY) is True
    assert again.structured_content == first.structured_content
    assert (
        problem(await call(connection, "issue_refund", {"order_id": "ord_a", "cents": 501}, key))
        == "key-reused"
    )
    assert await refunds_of(refunds_database, key) == 1


async def test_refusals_are_named_and_apply_nothing(connection: McpConnection, refunds_database: str) -> None:
    assert (
        problem(await call(connection, "issue_refund", {"order_id": "ord_b", "cents": 5}, None))
        == "missing-key"
    )
    assert problem(await call(connection, "issue_refund", {"order_id": "ord_b", "cents": 5}, "")) == "bad-key"
    assert (
        problem(await call(connection, "issue_refund", {"order_id": "ord_b", "cents": 5}, "k" * 256))
        == "bad-key"
    )
    # A tool that raises records nothing: the key is still free afterwards.
    key = new_key()
    refused = await call(connection, "issue_refund", {"order_id": "ord_b", "cents": -1}, key)
    assert refused.is_error and problem(refused) is None
    assert (await call(connection, "onceflow_key_lookup", {"idempotency_key": key}, None)).structured_content[
        "state"
    ] == "absent"
    assert not (await call(connection, "issue_refund", {"order_id": "ord_b", "cents": 5}, key)).is_error
    assert await refunds_of(refunds_database, key) == 1


async def test_a_second_call_while_the_first_runs_is_told_in_progress(
    connection: McpConnection, refunds_database: str
) -> None:
    key = new_key()
    arguments = {"order_id": "ord_fail", "cents": 7}
    first = asyncio.create_task(call(connection, "issue_refund", arguments, key))
    await asyncio.sleep(1)
    assert problem(await call(connection, "issue_refund", arguments, key)) == "key-in-progress"
    lookup = await call(connection, "onceflow_key_lookup", {"idempotency_key": key}, None)
    assert lookup.structured_content["state"] == "in_progress"
    assert (await first).is_error  # the fault: it failed after writing, and nothing committed
    assert await refunds_of(refunds_database, key) == 0


async def test_lookup_and_fence_as_tools(connection: McpConnection, refunds_database: str) -> None:
    done, missing = new_key(), new_key()
    result = await call(connection, "issue_refund", {"order_id": "ord_c", "cents": 9}, done)
    found = (
        await call(connection, "onceflow_key_lookup", {"idempotency_key": done}, None)
    ).structured_content
    assert found["state"] == "completed" and found["response"]["status"] == 200
    assert found["response"]["body"]["structuredContent"] == result.structured_content

    fenced = (
        await call(connection, "onceflow_key_fence", {"idempotency_key": missing}, None)
    ).structured_content
    assert fenced["state"] == "fenced" and fenced["fenced_now"] is True
    assert (
        problem(await call(connection, "issue_refund", {"order_id": "ord_c", "cents": 9}, missing))
        == "key-fenced"
    )
    assert await refunds_of(refunds_database, missing) == 0
    kept = (await call(connection, "onceflow_key_fence", {"idempotency_key": done}, None)).structured_content
    assert kept["state"] == "completed" and kept["fenced_now"] is False


# -- onceflow's side: `receiver: kit` in agents.yaml ------------------------------------------------


REFUND_SCRIPT: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "issue_refund", "arguments": {"order_id": "{{ input.order_id }}", "cents": 1200}}
        ]
    },
    {"final": "refund: {{ results.issue_refund }}"},
]


async def test_onceflow_settles_an_unknown_call_through_the_servers_kit(
    temporal_env: WorkflowEnvironment, ledger: Ledger, refunds_database: str
) -> None:
    """The refund outlives the tool's timeout and then fails on the server: unknown to onceflow,
    which asks the server's own record (lookup: in progress, later absent; fence: now never) and
    settles the call failed, not applied, with nobody's help; the late answer can never apply."""
    registry = build_registry(
        {
            "mcp_servers": {
                "refunds": server_config(
                    refunds_database, tools={"issue_refund": {"timeout": "1s", "receiver": "kit"}}
                )
            },
            "agents": {
                "refunds": {
                    "model": {"provider": "scripted", "script": REFUND_SCRIPT},
                    "instructions": "You refund orders.",
                    "toolsets": ["refunds"],
                    "tool_policy": {"on_indeterminate": "pause", **FAST_RECONCILE},
                }
            },
        },
        "test_receiver_mcp",
    )
    async with mcp_toolsets(registry) as servers:
        offered = {tool.name for tool in registry.agents["refunds"].tools.values()}
        assert offered == {"issue_refund", "list_refunds"}  # the protocol tools are not the model's
        async with running_worker(temporal_env.client, ledger, registry) as harness:
            handle = await harness.start("refunds", json.dumps({"order_id": "ord_fail"}))
            result = await asyncio.wait_for(handle.result(), 90)
        key = f"{handle.id}:call_0_0"
        record = await ledger.get(key)
        assert record.status is Status.FAILED and record.failure_kind is FailureKind.NOT_APPLIED
        assert record.settled_by == "reconciler"
        assert (Status.STARTED, Status.INDETERMINATE) in [(e.from_status, e.to_status) for e in record.events]
        assert record.evidence is not None and record.evidence.get("no_record_of_key") is True
        assert "receiver kit" in (record.reason or "")
        assert "took_effect" in result.final or "failed" in result.final
        assert await refunds_of(refunds_database, key) == 0
        client = await servers.connections["refunds"].session()
        late = await servers.connections["refunds"].call_tool(
            client, "issue_refund", {"order_id": "ord_x", "cents": 1200}, {IDEMPOTENCY_META_KEY: key}
        )
        assert (late.meta or {}).get(RECEIVER_PROBLEM_META_KEY) == "key-fenced"
        assert await refunds_of(refunds_database, key) == 0


# -- agents.yaml's `receiver: kit`, checked before anything runs ------------------------------------


def _listed(name: str, read_only: bool) -> Any:
    from mcp.types import Tool as McpListedTool
    from mcp.types import ToolAnnotations

    return McpListedTool(
        name=name,
        input_schema={"type": "object"},
        annotations=ToolAnnotations(read_only_hint=read_only, destructive_hint=False),
    )


def test_a_kit_receiver_needs_the_servers_protocol_tools_and_keeps_them_from_the_model() -> None:
    from onceflow.mcp.runtime import plan_server

    config = McpServerConfig.model_validate({"command": "x", "tools": {"pay": {"receiver": "kit"}}})
    assert {"onceflow_key_lookup", "onceflow_key_fence"} <= config.declared_tools()
    plans, errors = plan_server(config, [_listed("pay", False)])
    assert any("onceflow_key_lookup" in error for error in errors), errors

    listing = [
        _listed("pay", False),
        _listed("onceflow_key_lookup", True),
        _listed("onceflow_key_fence", False),
    ]
    plans, errors = plan_server(config, listing)
    assert errors == []
    by_name = {plan.name: plan for plan in plans}
    assert by_name["pay"].receiver_kit and by_name["pay"].offered
    assert not by_name["onceflow_key_lookup"].offered and not by_name["onceflow_key_fence"].offered
    # A lookup that does not say it is read-only is not a lookup the kit would serve.
    lying = [
        _listed("pay", False),
        _listed("onceflow_key_lookup", False),
        _listed("onceflow_key_fence", False),
    ]
    assert any("read-only" in error for error in plan_server(config, lying)[1])


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ({"pay": {"receiver": "kit", "reconcile": "find"}}, "not both"),
        ({"pay": {"receiver": "other"}}, "kit"),
    ],
)
def test_a_kit_receiver_is_declared_alone_and_by_name(tools: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        McpServerConfig.model_validate({"command": "x", "tools": tools})


def test_a_kit_receiver_is_for_writes_only() -> None:
    from onceflow.mcp.runtime import plan_server

    config = McpServerConfig.model_validate(
        {"command": "x", "tools": {"look": {"receiver": "kit", "effect": "read"}}}
    )
    listing = [
        _listed("look", True),
        _listed("onceflow_key_lookup", True),
        _listed("onceflow_key_fence", False),
    ]
    assert any("not reads" in error for error in plan_server(config, listing)[1])
