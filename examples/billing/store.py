"""The billing service's records on PostgreSQL: credits, and every request received.

The tables (migrations/, a component of onceflow's migration runner, beside the receiver kit's key
store in the same database) hold no idempotency rule of their own: a credit is inserted on the
connection of the kit's keyed transaction (credits.py), so the credit and its key commit together
and the kit alone keeps a key from applying twice. Effects per key are counted from the credits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from onceflow.examples.billing.models import Credit, CreditRequest
from onceflow.ledger.migrate import component, migrate_component
from onceflow.receiver import migrate_receiver

MIGRATIONS = component("billing", Path(__file__).parent / "migrations", oldest_server=(14,))

CREDIT_COLUMNS = (
    "credit_id, idempotency_key, account_id, amount_cents, currency, memo, status, created_at, voided_at"
)

INSERT_CREDIT = f"""
INSERT INTO billing_credits (credit_id, idempotency_key, account_id, amount_cents, currency, memo, status)
VALUES ($1, $2, $3, $4, $5, $6, 'applied')
RETURNING {CREDIT_COLUMNS}
"""
MARK_APPLIED = "UPDATE billing_received_requests SET applied = true WHERE id = $1"
CREDITS = f"""
SELECT {CREDIT_COLUMNS} FROM billing_credits WHERE $1::text IS NULL OR account_id = $1 ORDER BY seq
"""
CREDIT_BY_KEY = (
    f"SELECT {CREDIT_COLUMNS} FROM billing_credits WHERE idempotency_key = $1 ORDER BY seq LIMIT 1"
)
CREDIT_BY_ID = f"SELECT {CREDIT_COLUMNS} FROM billing_credits WHERE credit_id = $1"
VOID = f"""
UPDATE billing_credits SET status = 'voided', voided_at = now(), void_idempotency_key = $2
 WHERE credit_id = $1 AND status = 'applied'
RETURNING {CREDIT_COLUMNS}
"""
EFFECTS = "SELECT idempotency_key, count(*) AS applied FROM billing_credits GROUP BY 1 ORDER BY 1"
EFFECT = """
SELECT count(*) AS applied, coalesce(bool_or(status = 'voided'), false) AS voided
  FROM billing_credits WHERE idempotency_key = $1
"""
RECEIVE = (
    "INSERT INTO billing_received_requests (method, path, idempotency_key) VALUES ($1, $2, $3) RETURNING id"
)
ANSWERED = "UPDATE billing_received_requests SET status_code = $2 WHERE id = $1"
RECEIVED = "SELECT * FROM billing_received_requests WHERE idempotency_key = $1 ORDER BY id"
RECEIVED_COUNTS = """
SELECT idempotency_key, count(*) AS n FROM billing_received_requests
 WHERE ($1::text IS NULL OR method = $1) AND ($2::text IS NULL OR path = $2)
   AND ($3::text IS NULL OR starts_with(path, $3))
 GROUP BY idempotency_key ORDER BY idempotency_key
"""


async def migrate_billing(dsn: str) -> None:
    """The kit's key store and the service's own tables, each a component of its own."""
    await migrate_receiver(dsn)
    await migrate_component(dsn, MIGRATIONS)


def _credit(row: asyncpg.Record) -> Credit:
    return Credit.model_validate(dict(row))


@dataclass(frozen=True)
class ReceivedRow:
    """One request as the service received it (see the `billing_received_requests` table)."""

    id: int
    method: str
    path: str
    idempotency_key: str | None
    received_at: datetime
    applied: bool
    status_code: int | None


class BillingStore:
    """Credits and received requests over one asyncpg pool (opened by the app's lifespan)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, dsn: str, max_size: int = 20) -> BillingStore:
        await migrate_billing(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=max_size)
        assert pool is not None
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    @staticmethod
    async def insert_credit(
        conn: Any, key: str, request: CreditRequest, received_id: int | None = None
    ) -> Credit:
        """Apply a credit on `conn` (the keyed transaction's): the credit, and the received request
        marked applied, commit with the key's record or not at all."""
        row = await conn.fetchrow(
            INSERT_CREDIT,
            f"cr_{uuid.uuid4().hex}",
            key,
            request.account_id,
            request.amount_cents,
            request.currency,
            request.memo,
        )
        if received_id is not None:
            await conn.execute(MARK_APPLIED, received_id)
        return _credit(row)

    async def credits(self, account_id: str | None = None) -> list[Credit]:
        """Every credit applied (voided ones too), oldest first; one account's if given."""
        return [_credit(row) for row in await self.pool.fetch(CREDITS, account_id)]

    async def credit_by_key(self, key: str) -> Credit | None:
        """The first credit applied for `key`, in its current state (applied or voided)."""
        row = await self.pool.fetchrow(CREDIT_BY_KEY, key)
        return None if row is None else _credit(row)

    @staticmethod
    async def void_credit(conn: Any, credit_id: str, void_key: str) -> tuple[Credit, bool] | None:
        """Void a credit once, on `conn`. Returns (credit, already_voided), or None if unknown."""
        row = await conn.fetchrow(VOID, credit_id, void_key)
        if row is not None:
            return _credit(row), False
        row = await conn.fetchrow(CREDIT_BY_ID, credit_id)
        return None if row is None else (_credit(row), True)

    async def effects(self) -> dict[str, int]:
        """Credits applied per idempotency key, for every key that ever took effect."""
        return {row["idempotency_key"]: row["applied"] for row in await self.pool.fetch(EFFECTS)}

    async def effect(self, key: str) -> tuple[int, bool]:
        """(credits applied, any voided) for one key."""
        row = await self.pool.fetchrow(EFFECT, key)
        assert row is not None
        return row["applied"], row["voided"]

    # -- requests as received ---------------------------------------------------------------------

    async def receive(self, method: str, path: str, key: str | None) -> int:
        """Write down a request that just arrived; returns its id."""
        received_id: int = await self.pool.fetchval(RECEIVE, method, path, key)
        return received_id

    async def answered(self, received_id: int, status_code: int) -> None:
        await self.pool.execute(ANSWERED, received_id, status_code)

    async def received(self, key: str) -> list[ReceivedRow]:
        """Every request that arrived carrying `key`, oldest first."""
        return [ReceivedRow(**dict(row)) for row in await self.pool.fetch(RECEIVED, key)]

    async def received_counts(
        self, method: str | None = None, path: str | None = None, prefix: str | None = None
    ) -> dict[str | None, int]:
        """Requests received per key (None: without one), filtered by method, path and prefix."""
        rows = await self.pool.fetch(RECEIVED_COUNTS, method, path, prefix)
        return {row["idempotency_key"]: row["n"] for row in rows}
