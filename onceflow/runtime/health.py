"""Heartbeats of the worker and the operator API, and the check a container runtime runs on them.

A running worker probes what it needs every few seconds: that its Temporal worker still runs, that
the Temporal frontend answers its health check over the worker's own connection, and that the
ledger answers a query. The operator API probes its own HTTP endpoint, Temporal and the ledger.
Each writes the outcome to a small JSON file (ONCEFLOW_HEALTH_FILE, one per container).
`onceflow health` passes only if the last good probe is recent, so a hung event loop, a dead
Temporal connection or an unreachable ledger all turn the container unhealthy, while the check
itself opens no connection and costs one file read. One HEALTHCHECK in the image serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from onceflow.ledger import Ledger

log = logging.getLogger("onceflow.runtime.health")

PROBE_INTERVAL = 10.0  # seconds between probes
RETRY_INTERVAL = 2.0  # after a failed probe (also while the worker starts): look again sooner
PROBE_TIMEOUT = 5.0  # a probe step slower than this counts as failed
MAX_AGE = 30.0  # seconds since the last good probe before `onceflow health` fails


@dataclass(frozen=True)
class Heartbeat:
    """What the file holds: when a probe last passed, and what the latest one found."""

    last_ok: float | None  # time.time() of the last good probe
    checked: float  # time.time() of the latest probe
    problem: str | None  # why the latest probe failed, None if it passed
    pid: int

    def to_json(self) -> str:
        return json.dumps(
            {"last_ok": self.last_ok, "checked": self.checked, "problem": self.problem, "pid": self.pid}
        )

    @classmethod
    def from_json(cls, text: str) -> Heartbeat:
        data: Any = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("checked"), int | float):
            raise ValueError("not a heartbeat")
        last_ok = data.get("last_ok")
        problem = data.get("problem")
        return cls(
            last_ok=float(last_ok) if isinstance(last_ok, int | float) else None,
            checked=float(data["checked"]),
            problem=str(problem) if problem is not None else None,
            pid=int(data.get("pid") or 0),
        )


Probe = Callable[[], Awaitable[str | None]]  # why the process is not healthy, or None


async def temporal_and_ledger_problem(client: Client, ledger: Ledger) -> str | None:
    """What the worker and the API both need: Temporal's frontend and the ledger answer."""
    try:
        await asyncio.wait_for(client.service_client.check_health(), PROBE_TIMEOUT)
    except Exception as exc:
        return f"Temporal at {client.service_client.config.target_host} does not answer: {exc!r}"
    try:
        async with ledger.connection("health") as conn:
            await asyncio.wait_for(conn.fetchval("SELECT 1"), PROBE_TIMEOUT)
    except Exception as exc:
        return f"the ledger database does not answer: {exc!r}"
    return None


async def probe(client: Client, ledger: Ledger, worker: Worker) -> str | None:
    """Why this worker is not healthy, or None if it is."""
    if not worker.is_running:
        return "the Temporal worker is not running"
    return await temporal_and_ledger_problem(client, ledger)


async def api_probe(client: Client, ledger: Ledger, url: str) -> str | None:
    """Why this operator API is not healthy: its own HTTP endpoint (`url`) must answer, which a
    started but not listening (or wedged) server does not, and so must Temporal and the ledger."""
    # Over HTTPS the certificate names the host browsers use, not the loopback address this probe
    # reaches the process's own listener at: whether it answers is the question, not who it is.
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT, verify=not url.startswith("https://")) as http:
            answer = await http.get(url)
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        return f"the API at {url} does not answer: {exc!r}"
    return await temporal_and_ledger_problem(client, ledger)


def write_heartbeat(path: Path, heartbeat: Heartbeat) -> None:
    """Replace the file in one step, so a reader never sees half of it. (A few bytes on a local
    disk: written from the event loop directly.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(heartbeat.to_json())
    partial.replace(path)


async def keep_heartbeat(path: Path, check: Probe, interval: float = PROBE_INTERVAL) -> None:
    """Probe and write the heartbeat until cancelled; the file is removed on the way out, so a
    stopped process is never reported healthy."""
    last_ok: float | None = None
    try:
        while True:
            problem = await check()
            now = time.time()
            if problem is None:
                last_ok = now
            else:
                log.warning("health probe failed: %s", problem)
            write_heartbeat(path, Heartbeat(last_ok=last_ok, checked=now, problem=problem, pid=os.getpid()))
            await asyncio.sleep(interval if problem is None else min(interval, RETRY_INTERVAL))
    finally:
        remove_heartbeat(path)


def remove_heartbeat(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def heartbeat_problem(path: Path, max_age: float = MAX_AGE, now: float | None = None) -> str | None:
    """Why the process behind the heartbeat at `path` is not healthy, or None if it is."""
    now = time.time() if now is None else now
    try:
        heartbeat = Heartbeat.from_json(path.read_text())
    except FileNotFoundError:
        return f"no heartbeat at {path}: the process is not running, or has not finished starting"
    except (OSError, ValueError) as exc:
        return f"unreadable heartbeat at {path}: {exc}"
    if heartbeat.last_ok is None:
        return f"process {heartbeat.pid} has not passed a probe yet: {heartbeat.problem}"
    age = now - heartbeat.last_ok
    if age > max_age:
        reason = f"; latest probe: {heartbeat.problem}" if heartbeat.problem else " (no probe since)"
        return f"the last good probe was {age:.0f} s ago, more than {max_age:.0f} s{reason}"
    return None
