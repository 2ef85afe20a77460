"""`onceflow api`: the operator API as a process, configured by the same variables as the worker."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from onceflow.api.app import create_app
from onceflow.client import connect
from onceflow.config import Settings
from onceflow.worker import open_agents_and_ledger

log = logging.getLogger("onceflow.api")


async def serve(settings: Settings, *, host: str, port: int) -> None:
    registry, ledger = await open_agents_and_ledger(settings, "API")
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
