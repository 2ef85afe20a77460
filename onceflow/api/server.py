"""`onceflow api`: the operator API as a process, configured by the same variables as the worker."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from ledger import Ledger, LedgerError, migrate
from onceflow.agents import AgentConfigError, load_agents
from onceflow.api.app import create_app
from onceflow.client import connect
from onceflow.config import Settings

log = logging.getLogger("onceflow.api")


async def serve(settings: Settings, *, host: str, port: int) -> None:
    if not settings.database_url:
        raise SystemExit("ONCEFLOW_DATABASE_URL is not set: the API needs the ledger database")
    try:
        registry = load_agents(settings.agents_path)
    except AgentConfigError as exc:
        raise SystemExit(f"cannot start the API: {exc}") from exc
    try:
        await migrate(settings.database_url)
        ledger = await Ledger.connect(settings.database_url)
    except (OSError, LedgerError) as exc:
        raise SystemExit(f"cannot reach the ledger database: {exc}") from exc
    try:
        client = await connect(settings)
        app = create_app(ledger=ledger, client=client, registry=registry, task_queue=settings.task_queue)
        config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False)
        log.info("operator API on http://%s:%d (OpenAPI at /openapi.json)", host, port)
        await uvicorn.Server(config).serve()
    finally:
        await ledger.close()


def main(host: str, port: int) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(Settings.from_env(), host=host, port=port))
