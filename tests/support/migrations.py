"""A ledger schema as it stood before a given migration: to test that migration on real rows."""

from __future__ import annotations

import shutil
from pathlib import Path

from onceflow.ledger.migrate import discover


def version_of(name: str) -> int:
    """The version of the migration file `NNNN_<name>.sql`."""
    return next(m.version for m in discover() if m.path.name.endswith(f"_{name}.sql"))


def migrations_before(name: str, directory: Path) -> Path:
    """`directory`, holding copies of every migration before `name`'s (for `migrate(directory=)`)."""
    directory.mkdir(parents=True, exist_ok=True)
    for migration in discover():
        if migration.version < version_of(name):
            shutil.copy(migration.path, directory / migration.path.name)
    return directory
