"""A ledger client for tests/test_partitions.py, run inside a network namespace: it opens one of the
ledger's own connections (the session settings ledger/connections.py makes, keepalives among them), takes
an advisory lock in a transaction, says `locked`, and then either idles in the transaction
(`idle`) or says `asking` and sends one more statement, whose answer comes back three seconds later
(`answering`): by then the test has cut the host off, so the answer goes unacknowledged.

`python -m tests.support.partition_client DSN LOCK idle|answering`
"""

from __future__ import annotations

import asyncio
import sys

from onceflow.ledger import Ledger


async def main(dsn: str, lock: int, mode: str) -> None:
    ledger = await Ledger.connect(dsn, max_size=1, process="partition-client")
    async with ledger.connection("hold") as conn, conn.transaction():
        await conn.execute(f"SELECT pg_advisory_xact_lock({int(lock)})")
        print("locked", flush=True)
        if mode == "answering":
            await asyncio.sleep(1)
            print("asking", flush=True)
            await conn.execute("SELECT pg_sleep(3), repeat('x', 20000)")
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
