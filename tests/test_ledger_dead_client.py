"""A guarded reservation is one statement that commits on its own; a worker killed while that
statement waits on a guard's lock must leave nothing reserved.

Without the client check (ledger/connections.py's `client_connection_check_interval`) the backend of a
killed worker keeps waiting, takes the lock once it comes free, and commits a `started` call that
nobody will send. With it, the backend sees the closed socket while it waits and rolls back.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable

import asyncpg

from onceflow.ledger import Guard, Ledger
from onceflow.ledger.canonical import canonical_payload
from onceflow.ledger.connections import CLIENT_CHECK_INTERVAL
from tests.support.guarded import REFUND, new_run, refund_arguments

# A worker's reservation, in a process of its own so that it can be SIGKILLed mid-statement.
_WORKER = """
import asyncio, sys
from datetime import timedelta
from onceflow.ledger import CallIdentity, Guard, Ledger, SideEffect
from tests.support.guarded import REFUND, refund_arguments

async def main(dsn, run_id):
    ledger = await Ledger.connect(dsn, min_size=1, max_size=1)
    print("connected", flush=True)
    await ledger.reserve(
        CallIdentity(tenant="acme", run_id=run_id, tool_call_id="call-1", agent="refunds"),
        tool_name=REFUND, side_effect=SideEffect.EXTERNAL, arguments=refund_arguments(),
        owner="worker-doomed", lease=timedelta(minutes=5), guard=Guard(), execution="exec-1",
    )
    print("reserved", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

_WAITING_ON = """
SELECT l.pid FROM pg_locks l
 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
   AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1, 0)
"""


async def _until(check: Callable[[], Awaitable[bool]], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_every_pooled_connection_checks_its_client(ledger: Ledger) -> None:
    async with ledger.connection("test_setting") as conn:
        assert await conn.fetchval("SHOW client_connection_check_interval") == CLIENT_CHECK_INTERVAL


async def test_a_reservation_waiting_on_a_lock_for_a_killed_worker_reserves_nothing(
    database_url: str, ledger: Ledger
) -> None:
    run_id = new_run()
    [lock] = Guard().locks(
        tenant="acme",
        run_id=run_id,
        tool_name=REFUND,
        payload_sha256=canonical_payload(REFUND, refund_arguments()).sha256,
    )
    holder = await asyncpg.connect(database_url)
    worker = None
    try:
        await holder.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", lock)
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WORKER, database_url, run_id, stdout=asyncio.subprocess.PIPE
        )
        assert worker.stdout is not None
        assert (await asyncio.wait_for(worker.stdout.readline(), 30)).strip() == b"connected"

        async def waiting() -> bool:
            return await holder.fetchval(_WAITING_ON, lock) is not None

        assert await _until(waiting, 20), "the worker's reservation never waited on the intent lock"
        backend = await holder.fetchval(_WAITING_ON, lock)
        worker.send_signal(signal.SIGKILL)
        await asyncio.wait_for(worker.wait(), 10)

        async def gone() -> bool:
            return not await holder.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend)

        # Still holding the lock: the killed worker's statement must end by itself, not by taking it.
        assert await _until(gone, 5), "the killed worker's statement kept waiting for the lock"
    finally:
        if worker is not None and worker.returncode is None:
            worker.kill()
            await worker.wait()
        await holder.close()  # gives the lock up
    await asyncio.sleep(0.2)
    async with ledger.connection("test_after") as conn:
        rows = await conn.fetchval("SELECT count(*) FROM tool_executions WHERE run_id = $1", run_id)
        claims = await conn.fetchval("SELECT count(*) FROM run_ids WHERE run_id = $1", run_id)
    assert (rows, claims) == (0, 0)
