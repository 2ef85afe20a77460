"""The operator API served for real (uvicorn on a loopback port) over the session's Temporal, a
fresh ledger and an in-process worker, so that HTTP clients, the CLI and fuzzers can all reach it;
and what its tests give an operator to act on: an unknown call, an order for a run."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from temporalio.client import Client

from onceflow.api.app import create_app
from onceflow.api.options import ApiOptions
from onceflow.api.server import Tls
from onceflow.ledger import CallIdentity, Ledger, OperatorTokens, SideEffect
from onceflow.runtime.agents import AgentRegistry
from tests.support.processes import free_port
from tests.workflow_harness import Harness, running_worker

ARGUMENTS = {"account_id": "acct_1", "amount_cents": 500}


@dataclass
class OperatorApi:
    url: str
    http: httpx.AsyncClient
    ledger: Ledger
    runs: Harness
    app: FastAPI

    async def token(self, tenant: str = "acme", operator: str = "alice") -> str:
        _, secret = await OperatorTokens(self.ledger).create(tenant=tenant, operator=operator)
        return secret

    async def as_operator(self, tenant: str = "acme", operator: str = "alice") -> httpx.AsyncClient:
        """An HTTP client that sends this operator's token."""
        token = await self.token(tenant, operator)
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            verify=not self.url.startswith("https://"),  # a test's self-signed certificate
        )


@asynccontextmanager
async def serving_api(
    client: Client,
    ledger: Ledger,
    registry: AgentRegistry,
    *,
    options: ApiOptions | None = None,
    tls: Tls | None = None,
    worker: dict[str, Any] | None = None,
) -> AsyncIterator[OperatorApi]:
    """The API on a free loopback port; over HTTPS with `tls`, trusting the proxies
    `options.forwarded_allow_ips` names; `worker`: build_worker's keywords (a signal door, say)."""
    options = options or ApiOptions()
    async with running_worker(client, ledger, registry, **(worker or {})) as runs:
        app = create_app(
            ledger=ledger, client=client, registry=registry, task_queue=runs.task_queue, options=options
        )
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=port,
                log_level="warning",
                lifespan="off",
                forwarded_allow_ips=options.forwarded_allow_ips,
                ssl_certfile=str(tls.certfile) if tls else None,
                ssl_keyfile=str(tls.keyfile) if tls else None,
            )
        )
        task = asyncio.create_task(server.serve(), name=f"operator-api-{uuid.uuid4().hex[:6]}")
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30, verify=tls is None) as http:
                yield OperatorApi(url=url, http=http, ledger=ledger, runs=runs, app=app)
        finally:
            server.should_exit = True
            await task


async def unknown_call(ledger: Ledger, tenant: str = "acme", tool: str = "issue_credit") -> str:
    """An indeterminate call put straight into the ledger (no run waits on it)."""
    call = CallIdentity(tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:8]}", tool_call_id="call_1_0")
    await ledger.reserve(
        call, tool_name=tool, side_effect=SideEffect.EXTERNAL, arguments=ARGUMENTS, owner="worker-1"
    )
    await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
    return call.key


def order(order_id: str | None = None) -> tuple[str, str]:
    order_id = order_id or f"o{uuid.uuid4().hex[:8]}"
    return json.dumps({"order_id": order_id}), f"acct_{order_id}"
