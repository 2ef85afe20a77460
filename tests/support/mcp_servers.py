"""The example billing MCP server (examples/billing_mcp) as tests declare and run it: real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from onceflow.examples.billing_mcp import requests_received
from tests.support.processes import free_port

# Per-account faults of every server the tests start (see examples/billing_mcp/server.py).
FAULTS: dict[str, dict[str, Any]] = {
    "acct_hang": {"mode": "apply_then_hang", "delay_seconds": 30},
    "acct_slow": {"mode": "slow", "delay_seconds": 60},
    "acct_liar": {"mode": "apply_then_hang", "delay_seconds": 30},
    "acct_closed": {"mode": "reject", "detail": "account closed: the credit was refused"},
}

CREDIT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "{{ input.order_id }}"}}]},
    {
        "tool_calls": [
            {
                "name": "issue_credit",
                "arguments": {
                    "account_id": "{{ results.lookup_order.account_id }}",
                    "amount_cents": "{{ results.lookup_order.amount_cents }}",
                },
            }
        ]
    },
    {"final": "credit: {{ results.issue_credit }}"},
]

STATEMENT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "send_statement", "arguments": {"account_id": "{{ input.account_id }}"}}]},
    {"final": "statement: {{ results.send_statement }}"},
]

# Rounds come quickly; the deadline (after which the reconciler stops asking the lookup) is long
# enough for a killed server to be started again on a loaded machine.
FAST_RECONCILE = {
    "reconcile_deadline": "180s",
    "reconcile_initial_interval": "0.2s",
    "reconcile_max_interval": "1s",
}


def stdio_server(directory: Path, name: str, **extra: Any) -> dict[str, Any]:
    """agents.yaml's entry for an example server over stdio, with its files in `directory`."""
    return {
        "command": sys.executable,
        "args": [
            "-m",
            "onceflow.examples.billing_mcp",
            "--db",
            str(directory / f"{name}.db"),
            "--pid-file",
            str(directory / f"{name}.pid"),
        ],
        "env": {"BILLING_MCP_FAULTS": json.dumps(FAULTS)},
        **extra,
    }


def agent(
    script: list[dict[str, Any]], toolsets: list[str], on_indeterminate: str = "pause"
) -> dict[str, Any]:
    return {
        "model": {"provider": "scripted", "script": script},
        "instructions": "You issue credits for orders.",
        "toolsets": toolsets,
        "tool_policy": {"on_indeterminate": on_indeterminate, **FAST_RECONCILE},
    }


def received(directory: Path, name: str, key: str, tool: str | None = None) -> int:
    """Requests carrying `key` that the server `name` (in `directory`) received."""
    return requests_received(str(directory / f"{name}.db"), key, tool)


def applied(directory: Path, name: str, key: str) -> bool:
    """Whether the server `name` (in `directory`) has committed a credit under `key`.

    Not the same moment as `received`: the server logs a request before it applies it, so a test
    that kills the server "after applying" must wait for this, not for the request to arrive."""
    conn = sqlite3.connect(f"file:{directory / f'{name}.db'}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute("SELECT 1 FROM credits WHERE idempotency_key = ?", (key,)).fetchone()
        return row is not None
    finally:
        conn.close()


def kill_server(directory: Path, name: str) -> int:
    """SIGKILL the server `name` started by the worker; returns its pid."""
    pid = int((directory / f"{name}.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    return pid


async def wait_until(check: Any, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout}s waiting for {what or check}")
        await asyncio.sleep(0.05)


class HttpBillingServer:
    """The example server over streamable HTTP on a free loopback port, requiring a bearer token."""

    def __init__(self, directory: Path, token: str) -> None:
        self.directory = directory
        self.token = token
        self.port = free_port()
        self.db = directory / "http.db"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "BILLING_MCP_TOKEN": self.token, "BILLING_MCP_FAULTS": json.dumps(FAULTS)}
        command = [sys.executable, "-m", "onceflow.examples.billing_mcp", "--db", str(self.db), "--http"]
        with (self.directory / "http.log").open("ab") as log:
            return subprocess.Popen(
                [*command, "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT, env=env
            )

    async def start(self, timeout: float = 60) -> None:
        self.process = self._spawn()
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the HTTP MCP server exited: {(self.directory / 'http.log').read_text()}"
                    )
                try:
                    # Unauthenticated: 401 proves the server is up without opening an MCP session.
                    await client.get(self.url, timeout=1)
                    return
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
