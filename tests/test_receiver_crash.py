"""A receiver process SIGKILLed in the middle of a keyed handler, in each of the kit's forms.

- transactional: the handler has written its row on the kit's connection and holds, inside the open
  transaction. Killed there, neither the row nor the key survive: lookup says no record, the service
  has no effect, a fence makes the key "never" and the late retry is refused.
- middleware: the handler's row is committed and the answer not yet recorded. Killed there, the
  effect exists and the key stays `in_progress`: lookup answers unknown, never absent, and a fence
  writes nothing.

The service is tests/support/receiver_app.py in a process of its own, restarted on the same
database after the kill; the effects are what its own tables hold.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from onceflow.local.postgres import create_database, drop_database
from onceflow.receiver import KeyStore, key_header_value
from tests.support.processes import ChildProcesses, free_port

AUTH = {"Authorization": "Bearer acme-token"}


@pytest.fixture
async def service_database(postgres_dsn: str) -> AsyncIterator[str]:
    name = f"receiver_crash_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ChildProcesses]:
    children = ChildProcesses(tmp_path / "logs")
    yield children
    children.close()


async def start_service(
    processes: ChildProcesses, name: str, database_url: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = ["-m", "tests.support.receiver_app", "--database-url", database_url, "--port", str(port)]
    process = processes.start(name, args, dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=1) as http:
        for _ in range(300):
            if process.poll() is not None:
                raise RuntimeError(f"the service exited:\n{processes.log(name)}")
            try:
                if (await http.get("/openapi.json")).is_success:
                    return process, url
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the service did not answer:\n{processes.log(name)}")


async def wait_for_file(path: Path, timeout: float = 15) -> None:
    for _ in range(int(timeout / 0.02)):
        if os.path.exists(path):  # noqa: ASYNC240 -- a poll, a stat per 20 ms
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the handler never reached its hold ({path})")


async def lookup_settled(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    """The lookup once the killed process's database session is gone (its lock goes with it)."""
    for _ in range(200):
        found: dict[str, Any] = (await http.get(f"/idempotency-keys/{key}")).json()
        if found["state"] != "in_progress":
            return found
        await asyncio.sleep(0.05)
    return found


async def test_killed_mid_handler_the_transactional_form_leaves_no_effect_and_no_record(
    processes: ChildProcesses, service_database: str, tmp_path: Path
) -> None:
    process, url = await start_service(processes, "service-1", service_database)
    key = f"crash-{uuid.uuid4().hex}:call_1_0"
    holding = tmp_path / "holding"
    headers = {
        **AUTH,
        "Idempotency-Key": key_header_value(key),
        "X-Hold-Seconds": "60",
        "X-Hold-File": str(holding),
    }
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        sent = asyncio.create_task(
            http.post("/transfers", json={"account": "k1", "cents": 500}, headers=headers)
        )
        await wait_for_file(holding)
        # The handler has written its row and holds the key: in flight, not absent.
        assert (await http.get(f"/idempotency-keys/{key}", headers=AUTH)).json()["state"] == "in_progress"
        processes.kill(process)
        with pytest.raises(httpx.TransportError):
            await sent

    _, url = await start_service(processes, "service-2", service_database)
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=AUTH) as http:
        assert (await lookup_settled(http, key))["state"] == "absent"
        assert (await http.get(f"/effects/{key}")).json()["transfers"] == 0
        fenced = (await http.post(f"/idempotency-keys/{key}/fence")).json()
        assert fenced["state"] == "fenced" and fenced["fenced_now"] is True
        late = await http.post(
            "/transfers",
            json={"account": "k1", "cents": 500},
            headers={"Idempotency-Key": key_header_value(key)},
        )
        assert late.status_code == 409 and late.json()["type"].endswith("key-fenced")
        assert (await http.get(f"/effects/{key}")).json()["transfers"] == 0


async def test_killed_mid_handler_the_middleware_form_leaves_the_key_unknown(
    processes: ChildProcesses, service_database: str, tmp_path: Path
) -> None:
    process, url = await start_service(processes, "service-1", service_database)
    key = f"crash-{uuid.uuid4().hex}:call_1_0"
    holding = tmp_path / "holding"
    headers = {
        **AUTH,
        "Idempotency-Key": key_header_value(key),
        "X-Hold-Seconds": "60",
        "X-Hold-File": str(holding),
    }
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        sent = asyncio.create_task(http.post("/notes", json={"text": "written"}, headers=headers))
        await wait_for_file(holding)
        processes.kill(process)
        with pytest.raises(httpx.TransportError):
            await sent

    _, url = await start_service(processes, "service-2", service_database)
    async with httpx.AsyncClient(base_url=url, timeout=10, headers=AUTH) as http:
        # The effect happened; its answer was never recorded.
        assert (await http.get(f"/effects/{key}")).json()["notes"] == 1
        for _ in range(5):  # and it stays unknown: never "absent", never fenceable
            assert (await http.get(f"/idempotency-keys/{key}")).json()["state"] == "in_progress"
            await asyncio.sleep(0.1)
        fence = (await http.post(f"/idempotency-keys/{key}/fence")).json()
        assert fence["state"] == "in_progress" and fence["fenced_now"] is False
        retry = await http.post(
            "/notes", json={"text": "written"}, headers={"Idempotency-Key": key_header_value(key)}
        )
        assert retry.status_code == 409 and retry.json()["type"].endswith("key-in-progress")
        assert (await http.get(f"/effects/{key}")).json()["notes"] == 1

    # Only a person who checked may release it; the kit never does by itself.
    pool = await asyncpg.create_pool(service_database, min_size=1, max_size=2)
    try:
        assert await KeyStore(pool).release_stuck("acme", key) is True
        assert (await KeyStore(pool).lookup("acme", key)).state == "absent"
    finally:
        await pool.close()
