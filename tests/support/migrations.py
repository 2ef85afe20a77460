"""A ledger schema as it stood before a given migration: to test that migration on real rows."""

from __future__ import annotations

import shutil
from pathlib import Path

from onceflow.ledger.migrate import discover


def version_of(name: str) -> int:
    """The version of the migration file `NNNN_<name>.sql`."""
    return next(m.version for m in discover() if m.path.name.endswith(f"_{name}.sql"))


def migrations_before(name: str, directory: Path, *, including: bool = False) -> Path:
    """`directory`, holding copies of every migration before `name`'s (for `migrate(directory=)`),
    and `name`'s own too when `including`: a schema as that migration left it, whatever came later."""
    directory.mkdir(parents=True, exist_ok=True)
    last = version_of(name) + (1 if including else 0)
    for migration in discover():
        if migration.version < last:
            shutil.copy(migration.path, directory / migration.path.name)
    return directory
