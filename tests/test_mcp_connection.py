"""One session per server, against the example billing MCP server as a real stdio process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from onceflow.mcp import McpServerConfig
from onceflow.mcp.connection import McpConnection
from tests.support.mcp_servers import stdio_server


def _connection(tmp_path: Path) -> McpConnection:
    return McpConnection("billing", McpServerConfig.model_validate(stdio_server(tmp_path, "billing")))


async def test_a_server_that_died_while_idle_is_noticed_before_a_write_and_replaced(tmp_path: Path) -> None:
    connection = _connection(tmp_path)
    try:
        first = await connection.session()
        assert await connection.session() is first  # reused while it answers
        os.kill(int((tmp_path / "billing.pid").read_text()), signal.SIGKILL)
        await asyncio.sleep(0.5)
        second = await connection.session(check=True)
        assert second is not first
        assert connection.sessions_opened == 2
        answer = await connection.call_tool(second, "lookup_order", {"order_id": "ord_1"}, None)
        assert answer.structured_content is not None
        assert answer.structured_content["account_id"] == "acct_1"
    finally:
        await connection.aclose()


async def test_a_late_failure_on_a_replaced_session_does_not_cut_its_successor(tmp_path: Path) -> None:
    connection = _connection(tmp_path)
    try:
        old = await connection.session()
        await connection.discard(old)
        new = await connection.session()
        await connection.discard(old)  # a call that failed on the old session reports late
        assert await connection.session() is new
        assert connection.sessions_opened == 2
    finally:
        await connection.aclose()
