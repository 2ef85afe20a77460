"""What the console reads and decides, asked of the JSON API in the same process.

The console is one more client of the operator API: every listing, record and decision goes through
the same routes, as the signed-in operator, over ASGI (no socket, no second implementation of any
rule). The console holds no token: it names the operator its session belongs to in the request's
ASGI scope, which no outside request can set (onceflow/api/auth.py). The answers are the API's JSON, problem documents included: a 409
names who decided first exactly as it does for curl.

The counts per status are the one thing the JSON API does not offer; they are read here, scoped to
the token's tenant, with the same predicates as the ledger's listing of unresolved calls
(`queries.COUNT_UNRESOLVED` beside `queries.LIST_UNRESOLVED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from onceflow.api.auth import SIGNED_IN
from onceflow.ledger import Ledger, OperatorToken, queries


@dataclass
class Counts:
    unknown: int = 0
    awaiting_approval: int = 0
    held: int = 0
    conflict: int = 0
    escalated: int = 0

    @property
    def total(self) -> int:
        return self.unknown + self.awaiting_approval + self.held + self.conflict


async def count_queue(ledger: Ledger, tenant: str, *, tool: str | None, agent: str | None) -> Counts:
    counts = Counts()
    async with ledger.connection("console_counts", tenant=tenant) as conn:
        rows = await conn.fetch(queries.COUNT_UNRESOLVED, tenant, tool, agent)
    for row in rows:
        n = int(row["n"])
        if row["conflict"]:
            counts.conflict += n
        elif row["status"] in ("indeterminate", "started"):
            counts.unknown += n
        elif row["status"] == "awaiting_approval":
            counts.awaiting_approval += n
        else:
            counts.held += n
        if row["escalated"]:
            counts.escalated += n
    return counts


@dataclass
class Answer:
    """The API's answer: its status code and JSON body (a problem document when not 2xx)."""

    status: int
    body: Any = field(default=None)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def problem(self) -> dict[str, Any]:
        return self.body if not self.ok and isinstance(self.body, dict) else {}


def execution_path(key: str, action: str = "") -> str:
    path = f"/v1/tool-executions/{quote(key, safe=':')}"
    return f"{path}/{action}" if action else path


class OperatorCalls:
    """Calls to the JSON API as the signed-in operator."""

    def __init__(self, app: FastAPI, operator: OperatorToken) -> None:
        self._app = app
        self._operator = operator

    async def _as_operator(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app({**scope, SIGNED_IN: self._operator}, receive, send)

    async def request(
        self, method: str, path: str, *, params: dict[str, str] | None = None, body: Any = None
    ) -> Answer:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self._as_operator), base_url="http://console.internal"
        ) as http:
            if method == "GET":
                response = await http.get(path, params=params)
            else:
                response = await http.post(path, json=body)
        try:
            payload = response.json()
        except ValueError:
            payload = {"detail": response.text}
        return Answer(status=response.status_code, body=payload)

    async def execution(self, key: str) -> Answer:
        return await self.request("GET", execution_path(key))

    async def decide(self, key: str, action: str, body: Any) -> Answer:
        return await self.request("POST", execution_path(key, action), body=body)
