"""What the MCP leg of a tool call costs: the example billing MCP server, over stdio and HTTP.

For each transport: the time to start the server and list its tools (what the worker pays at
start-up), then N sequential write calls (`issue_credit` through `McpTool.invoke`, i.e. the session
check that makes "could not connect" mean "not sent", plus the call with its key in `_meta`) and N
reads (`lookup_order`, no check). No Temporal and no ledger here: those costs are bench/e2e.py's.

    .venv/bin/python bench/mcp_calls.py [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Python puts this script's folder first on sys.path, where bench/ledger.py would shadow the ledger
# package; the repository root goes there instead (for tests.support).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from onceflow.mcp.runtime import mcp_toolsets  # noqa: E402
from onceflow.runtime.agents import build_registry  # noqa: E402
from onceflow.sdk.tools import ToolContext  # noqa: E402
from tests.support.mcp_servers import HttpBillingServer  # noqa: E402


def _context() -> ToolContext:
    run = f"bench-{uuid.uuid4().hex[:8]}"
    return ToolContext(
        idempotency_key=f"{run}:call_0_0", run_id=run, tool_call_id="call_0_0", tenant="t", attempt=1
    )


async def _measure(server: dict[str, Any], calls: int) -> dict[str, float]:
    registry = build_registry(
        {
            "mcp_servers": {"billing": {**server, "tools": {"issue_credit": {"reconcile": "find_credit"}}}},
            "agents": {
                "a": {"model": {"provider": "scripted", "script": [{"final": "x"}]}, "toolsets": ["billing"]}
            },
        }
    )
    started = time.perf_counter()
    async with mcp_toolsets(registry) as servers:
        start_up = time.perf_counter() - started
        tools = registry.agent("a").tools
        connection = servers.connections["billing"]
        checks, writes, reads = [], [], []
        for i in range(calls):
            t = time.perf_counter()
            await connection.session(check=True)
            checks.append(time.perf_counter() - t)
            t = time.perf_counter()
            await tools["issue_credit"].invoke({"account_id": f"acct_{i}", "amount_cents": 100}, _context())
            writes.append(time.perf_counter() - t)
            t = time.perf_counter()
            await tools["lookup_order"].invoke({"order_id": f"ord_{i}"}, _context())
            reads.append(time.perf_counter() - t)

    def ms(values: list[float], q: int) -> float:
        return 1000 * statistics.quantiles(values, n=100)[q - 1]

    return {
        "start_s": start_up,
        "check_p50_ms": ms(checks, 50),
        "write_p50_ms": ms(writes, 50),
        "write_p95_ms": ms(writes, 95),
        "read_p50_ms": ms(reads, 50),
        "read_p95_ms": ms(reads, 95),
    }


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="onceflow-mcp-bench-") as tmp:
        directory = Path(tmp)
        stdio = {
            "command": sys.executable,
            "args": ["-m", "onceflow.examples.billing_mcp", "--db", str(directory / "s.db")],
        }
        results = {"stdio": await _measure(stdio, calls)}
        http = HttpBillingServer(directory, "bench-token")
        await http.start()
        try:
            server = {"url": http.url, "headers": {"Authorization": "Bearer bench-token"}}
            results["http"] = await _measure(server, calls)
        finally:
            http.stop()
    print(f"{calls} sequential calls each; start = start the server (stdio) or connect (http) and list tools")
    print("check = the session check before a write (one tools/list); write = check + issue_credit")
    header = f"{'transport':<10} {'start':>8} {'check p50':>10} {'write p50':>10} {'write p95':>10}"
    print(f"{header} {'read p50':>9} {'read p95':>9}")
    for name, r in results.items():
        print(
            f"{name:<10} {r['start_s']:>7.2f}s {r['check_p50_ms']:>8.1f}ms"
            f" {r['write_p50_ms']:>8.1f}ms {r['write_p95_ms']:>8.1f}ms"
            f" {r['read_p50_ms']:>7.1f}ms {r['read_p95_ms']:>7.1f}ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
