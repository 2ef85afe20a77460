"""`onceflow api`: the operator API as a process, configured by the same variables as the worker."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

import uvicorn

from onceflow.api.app import create_app
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings
from onceflow.runtime.health import api_probe, keep_heartbeat, remove_heartbeat
from onceflow.runtime.worker import open_agents_and_ledger

log = logging.getLogger("onceflow.api")


async def serve(settings: Settings, *, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGINT/SIGTERM, or until `stop` is set (for callers in the same process)."""
    registry, ledger = await open_agents_and_ledger(settings, "API")
    tasks: list[asyncio.Task[None]] = []
    try:
        client = await connect(settings)
        app = create_app(ledger=ledger, client=client, registry=registry, task_queue=settings.task_queue)
        config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=False)
        server = uvicorn.Server(config)
        log.info("operator API on http://%s:%d (OpenAPI at /openapi.json)", host, port)
        if settings.health_file:
            # The image's HEALTHCHECK (`onceflow health`) reads this, as it reads the worker's. A
            # heartbeat left by an earlier run of this container must not vouch for this one.
            path = Path(settings.health_file)
            remove_heartbeat(path)
            own = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
            check = functools.partial(api_probe, client, ledger, f"http://{own}:{port}/healthz")
            tasks.append(asyncio.create_task(keep_heartbeat(path, check)))
        if stop is not None:
            tasks.append(asyncio.create_task(_exit_when(stop, server)))
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ledger.close()


async def _exit_when(stop: asyncio.Event, server: uvicorn.Server) -> None:
    await stop.wait()
    server.should_exit = True


def main(host: str, port: int) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(Settings.from_env(), host=host, port=port))
