"""A worker's host vanishes from the network without closing anything: the ledger's server notices it
through the TCP keepalives the ledger sets on its connections, and lets go of what it held.

The worker side is a process in a network namespace of its own (onceflow/drill/netns.py: a veth pair
to a bridge that carries the server's address), holding an advisory lock inside a transaction on one
of the ledger's connections. Its network is then cut with nftables: packets vanish both ways, so
the server gets no FIN and no RST, and client_connection_check_interval alone (which sees closed
sockets) would never fire while the backend idles in its transaction. Only the keepalive probes
(ledger/connections.py, KEEPALIVES) find the peer gone. The whole partition drill (worker cut from
PostgreSQL, from Temporal, from both, while its calls are on the wire) is `make partition-drill`.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from onceflow.drill import netns
from onceflow.ledger.connections import KEEPALIVES
from onceflow.local.replication import ReplicatedPostgres

ROOT = Path(__file__).resolve().parent.parent
LOCK = 424242


@pytest.fixture
def lab() -> Iterator[netns.NetworkLab]:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(f"network namespaces cannot be made here: {why}")
    with netns.NetworkLab() as made:
        yield made


@pytest.fixture
def server(lab: netns.NetworkLab) -> Iterator[ReplicatedPostgres]:
    """PostgreSQL alone, listening on the lab's service address (TCP: keepalives apply)."""
    folder = Path(tempfile.mkdtemp(prefix="onceflow-partition-"))
    made = ReplicatedPostgres(folder / "pg", standby=False, hosts=(lab.service_address, lab.service_address))
    try:
        made.start()
        yield made
    finally:
        made.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _start_client(host: netns.Host, dsn: str, mode: str, lock: int) -> subprocess.Popen[str]:
    """The ledger client, inside the host's namespace."""
    return subprocess.Popen(
        host.command([sys.executable, "-m", "tests.support.partition_client", dsn, str(lock), mode]),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _wait_for_line(process: subprocess.Popen[str], wanted: str, timeout: float) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.strip() == wanted:
            return
        if process.poll() is not None:
            break
    raise AssertionError(f"the client never said {wanted!r}: {process.poll()}")


async def test_worker_hosts_that_vanish_without_a_fin_lose_their_locks_within_the_ledgers_timeouts(
    lab: netns.NetworkLab, server: ReplicatedPostgres
) -> None:
    """Two worker hosts, each holding a lock in a transaction, vanish at once. One idles in its
    transaction: the keepalive probes go unanswered. The other vanishes while the server's answer to
    its last statement is on its way, so the server holds data nobody acknowledges, keepalives never
    start, and tcp_user_timeout ends it."""
    dsn = server.dsn()
    hosts = {mode: lab.add_host(mode) for mode in ("idle", "answering")}
    clients = {mode: _start_client(host, dsn, mode, LOCK + n) for n, (mode, host) in enumerate(hosts.items())}
    locks = {mode: LOCK + n for n, mode in enumerate(hosts)}
    conn = await asyncpg.connect(dsn)
    freed: dict[str, float] = {}
    try:
        for client in clients.values():
            await asyncio.to_thread(_wait_for_line, client, "locked", 60)
        await asyncio.to_thread(_wait_for_line, clients["answering"], "asking", 10)
        await asyncio.sleep(1)  # the idle one's last acknowledgement has left: its socket is idle
        for lock in locks.values():
            assert not await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock)  # held
        backends = {
            mode: await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE client_addr = $1::inet", host.address
            )
            for mode, host in hosts.items()
        }
        assert None not in backends.values()

        for mode in hosts:  # the hosts are gone: nothing more arrives, nothing closes
            lab.cut(mode, (server.primary.port,))
        cut = time.monotonic()
        while time.monotonic() - cut < 90 and len(freed) < len(locks):
            for mode, lock in locks.items():
                if mode not in freed and await conn.fetchval("SELECT pg_try_advisory_lock($1)", lock):
                    freed[mode] = time.monotonic() - cut
            await asyncio.sleep(0.5)
        alive = {mode: client.poll() is None for mode, client in clients.items()}
        gone = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", list(backends.values())
        )
    finally:
        await conn.close()
        for client in clients.values():
            client.kill()
            client.wait()
            assert client.stdout is not None
            client.stdout.close()
    assert alive == {"idle": True, "answering": True}  # the workers did not die: their network vanished
    assert set(freed) == set(locks), f"the server never let go of {set(locks) - set(freed)}"
    probing = (
        KEEPALIVES["tcp_keepalives_idle"]
        + KEEPALIVES["tcp_keepalives_interval"] * KEEPALIVES["tcp_keepalives_count"]
    )
    unacknowledged = KEEPALIVES["tcp_user_timeout"] / 1000 + 3  # the answer leaves 3 s after the cut
    # Not at once (no FIN, no RST reached the server), and within the ledger's timeouts (and slack).
    assert 3 <= freed["idle"] <= probing + 10, freed
    assert 3 <= freed["answering"] <= unacknowledged + 10, freed
    assert gone == 0
