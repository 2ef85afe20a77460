"""The operator API's routes, by what they do: reading the queue (listing), an operator's decisions
(decisions), undoing a completed call (compensation), an operator assertion for a signal (assertions). Each module builds an APIRouter over the
ledger and the Temporal client it is given; onceflow/api/app.py includes them."""

from __future__ import annotations

from fastapi import FastAPI
from temporalio.client import Client

from onceflow.api.routes import assertions, compensation, decisions, listing
from onceflow.ledger import Ledger
from onceflow.runtime.agents import AgentRegistry


def include_routes(
    app: FastAPI,
    *,
    ledger: Ledger,
    client: Client,
    registry: AgentRegistry,
    task_queue: str,
    signal_key: str = "",
) -> None:
    """Add every route to `app`, in the order the OpenAPI document lists them."""
    app.include_router(listing.router(ledger=ledger))
    app.include_router(decisions.router(ledger=ledger, client=client))
    app.include_router(
        compensation.router(ledger=ledger, client=client, registry=registry, task_queue=task_queue)
    )
    app.include_router(assertions.router(ledger=ledger, signal_key=signal_key))
