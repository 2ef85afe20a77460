"""`onceflow api`: the operator API as a process, configured by the same variables as the worker.

Two listeners: the API and its console on `--port` (ONCEFLOW_API_PORT), over TLS when given a
certificate; and /metrics for Prometheus on ONCEFLOW_API_METRICS_HOST:ONCEFLOW_API_METRICS_PORT
(none when the port is 0), so that reaching the console's port never shows every tenant's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from onceflow.api.app import create_app
from onceflow.api.metrics import metrics_app, start_metrics
from onceflow.api.options import ApiOptions
from onceflow.runtime.client import connect
from onceflow.runtime.config import Settings
from onceflow.runtime.health import api_probe, keep_heartbeat, remove_heartbeat
from onceflow.runtime.worker import open_agents_and_ledger

log = logging.getLogger("onceflow.api")


@dataclass(frozen=True)
class Tls:
    """A certificate (chain) and its private key, PEM files: the API then serves HTTPS itself."""

    certfile: Path
    keyfile: Path


async def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    stop: asyncio.Event | None = None,
    options: ApiOptions | None = None,
    tls: Tls | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, or until `stop` is set (for callers in the same process)."""
    options = options or ApiOptions.from_env()
    registry, ledger = await open_agents_and_ledger(settings, "API")
    tasks: list[asyncio.Task[None]] = []
    try:
        client = await connect(settings)
        app = create_app(
            ledger=ledger, client=client, registry=registry, task_queue=settings.task_queue, options=options
        )
        prometheus = start_metrics(ledger, registry, options.tenant_label)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=False,
            # Whose X-Forwarded-Proto and X-Forwarded-For count: a TLS proxy in front must be here,
            # or the console refuses to sign anyone in through it (onceflow/api/console/forms.py).
            forwarded_allow_ips=options.forwarded_allow_ips,
            ssl_certfile=str(tls.certfile) if tls else None,
            ssl_keyfile=str(tls.keyfile) if tls else None,
        )
        server = uvicorn.Server(config)
        scheme = "https" if tls else "http"
        log.info("operator API on %s://%s:%d (OpenAPI at /openapi.json)", scheme, host, port)
        servers = [server]
        if options.metrics_port:
            metrics_config = uvicorn.Config(
                metrics_app(prometheus, ledger, registry),
                host=options.metrics_host,
                port=options.metrics_port,
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
            servers.append(uvicorn.Server(metrics_config))
            log.info(
                "metrics for Prometheus on http://%s:%d/metrics", options.metrics_host, options.metrics_port
            )
        if settings.health_file:
            # The image's HEALTHCHECK (`onceflow health`) reads this, as it reads the worker's. A
            # heartbeat left by an earlier run of this container must not vouch for this one.
            path = Path(settings.health_file)
            remove_heartbeat(path)
            own = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
            check = functools.partial(api_probe, client, ledger, f"{scheme}://{own}:{port}/healthz")
            tasks.append(asyncio.create_task(keep_heartbeat(path, check)))
        if stop is not None:
            tasks.append(asyncio.create_task(_exit_when(stop, servers)))
        await _serve_all(servers)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ledger.close()


async def _serve_all(servers: list[uvicorn.Server]) -> None:
    """Run every listener; when one stops (a signal, or it could not bind), stop the others."""
    running = [asyncio.create_task(server.serve()) for server in servers]
    try:
        await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*running, return_exceptions=True)
    for task in running:
        task.result()  # a listener that failed says why


async def _exit_when(stop: asyncio.Event, servers: list[uvicorn.Server]) -> None:
    await stop.wait()
    for server in servers:
        server.should_exit = True


def main(host: str, port: int, tls: Tls | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = ApiOptions.from_env()
    except ValueError as exc:
        raise SystemExit(f"cannot start the operator API: {exc}") from exc
    asyncio.run(serve(Settings.from_env(), host=host, port=port, options=options, tls=tls))
