"""Debian's PgBouncer in front of a test PostgreSQL, in transaction or session mode."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from onceflow.local.replication import as_user, free_port, give_to, run_as

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).exists()


def _server_of(dsn: str) -> tuple[str, int]:
    """Host (or Unix socket folder) and port of a libpq-style DSN."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = int(query.get("port", [parts.port or 5432])[0])
    return host, port


@contextmanager
def pgbouncer(server_dsn: str, *, pool_mode: str) -> Iterator[str]:
    """PgBouncer (trust auth, every database) in front of the server of `server_dsn`; yields a DSN
    to the same database through it."""
    host, port = _server_of(server_dsn)
    folder = Path(tempfile.mkdtemp(prefix="onceflow-pgbouncer-"))
    user = run_as()  # PgBouncer refuses to run as root
    listen = free_port()
    config = folder / "pgbouncer.ini"
    config.write_text(
        f"[databases]\n* = host={host} port={port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\ndefault_pool_size = 4\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits\nlogfile =\n"
    )
    (folder / "users.txt").write_text('"postgres" ""\n')
    for path in (folder, config, folder / "users.txt"):
        give_to(path, user)
    log = (folder / "pgbouncer.log").open("wb")
    process = subprocess.Popen(
        [PGBOUNCER, str(config)], stdout=log, stderr=subprocess.STDOUT, **as_user(user)
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not start: {(folder / 'pgbouncer.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        database = urlsplit(server_dsn).path.lstrip("/") or "postgres"
        yield f"postgresql://postgres@127.0.0.1:{listen}/{database}"
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
