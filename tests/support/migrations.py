"""A ledger schema as it stood before a given migration: to test that migration on real rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import asyncpg

from onceflow.ledger.migrate import discover, migrate

# Today's Ledger reserves through onceflow_guarded_reserve's current signature (the heard calls'
# statuses and settlements, the attempt's deadline and start: ledger/definitions/guarded_reserve.sql). A schema
# from before that file has only the 23-argument one; this forwards the current call to it, so that
# today's Ledger can write a history into an old schema. The definitions replace it on migrating.
_CURRENT_SIGNATURE_ON_AN_OLD_SCHEMA = """
CREATE OR REPLACE FUNCTION onceflow_guarded_reserve(
    p_locks text[], p_key text, p_tenant text, p_run_id text, p_tool_call_id text, p_agent text,
    p_tool_name text, p_side_effect text, p_payload jsonb, p_sha256 text, p_owner text,
    p_approval boolean, p_lease interval, p_intent text, p_entity text, p_exclusive boolean,
    p_on_busy text, p_amount numeric, p_limit numeric, p_replaces text, p_heard text[],
    p_toolset text, p_currency text, p_heard_status text[], p_heard_at timestamptz[],
    p_not_after timestamptz, p_began timestamptz
) RETURNS TABLE (o_outcome text, o_action text, o_previous_status text,
                 o_previous_updated_at timestamptz, o_record tool_executions)
LANGUAGE sql AS $$
    SELECT * FROM onceflow_guarded_reserve(
        p_locks, p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect,
        p_payload, p_sha256, p_owner, p_approval, p_lease, p_intent, p_entity, p_exclusive, p_on_busy,
        p_amount, p_limit, p_replaces, p_heard, p_toolset, p_currency)
$$;
"""


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


async def migrate_to_just_before(dsn: str, name: str, directory: Path) -> int:
    """The schema as the numbered migrations before `name`'s left it (no definitions: they are the
    current text, written for the current tables), and today's Ledger able to reserve on it."""
    version = await migrate(dsn, directory=migrations_before(name, directory), definitions=None)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(_CURRENT_SIGNATURE_ON_AN_OLD_SCHEMA)
    finally:
        await conn.close()
    return version
