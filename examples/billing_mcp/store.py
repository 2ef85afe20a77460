"""The billing MCP server's credits, in SQLite: applied once per key, the first answer replayed.

The MCP example keeps this small hand-written store (the HTTP billing service is built on the
receiver kit instead, examples/billing/; the kit's MCP form is onceflow.receiver.mcp). One
connection guarded by a lock; the file outlives the server being killed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from onceflow.examples.billing.models import Credit, CreditRequest

SCHEMA = """
CREATE TABLE IF NOT EXISTS credits (
    credit_id            TEXT PRIMARY KEY,
    -- Unique only while the service dedups; with dedup off one key may carry many credits.
    idempotency_key      TEXT NOT NULL,
    request_hash         TEXT NOT NULL,
    account_id           TEXT NOT NULL,
    amount_cents         INTEGER NOT NULL,
    currency             TEXT NOT NULL,
    memo                 TEXT,
    status               TEXT NOT NULL,
    created_at           TEXT NOT NULL,
    voided_at            TEXT,
    void_idempotency_key TEXT,
    -- The first answer, replayed verbatim for the same key (as payment APIs do).
    response_status      INTEGER NOT NULL,
    response_body        TEXT NOT NULL
);
-- Keys declared dead by a reconciler: a request that arrives later with one of them is refused,
-- so "not found" stays true forever and can be used as proof that the credit never landed.
CREATE TABLE IF NOT EXISTS fenced_keys (
    idempotency_key TEXT PRIMARY KEY,
    fenced_at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS credits_by_key ON credits (idempotency_key);
"""

CREDIT_COLUMNS = (
    "credit_id, idempotency_key, account_id, amount_cents, currency, memo, status, created_at, voided_at"
)


class IdempotencyConflict(Exception):
    """The key was first used with a different request body."""


class KeyFenced(Exception):
    """The key was fenced by a reconciler: nothing may be applied under it any more."""


@dataclass(frozen=True)
class RecordedAnswer:
    """What the service answers for a key: the first answer, and whether this call only replayed it."""

    status_code: int
    body: dict[str, Any]
    replayed: bool


def request_hash(request: CreditRequest) -> str:
    """A stable fingerprint of a credit request; defaults are filled in, so omitted == explicit."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _credit(row: sqlite3.Row) -> Credit:
    return Credit.model_validate(dict(row))


class BillingStore:
    """Credits keyed by idempotency key; every method is one transaction under the lock.

    `dedup=False` makes the store honour no key at all, as many real APIs don't: every credit
    request applies a new credit. Fenced keys stay fenced either way (a reconcile hook's proof of
    absence), and every request is recorded on arrival either way.
    """

    def __init__(self, path: str | None = None, *, dedup: bool = True) -> None:
        self.dedup = dedup
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path or ":memory:", check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        with self._lock, self._conn:
            self._conn.executescript(SCHEMA)

    def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""
        with self._lock:
            self._conn.close()

    def recorded_answer(self, key: str, request: CreditRequest) -> RecordedAnswer | None:
        """The answer already given for `key`, None if the key is new; raises IdempotencyConflict.

        Always None without dedup: nothing is ever replayed then.
        """
        if not self.dedup:
            return None
        with self._lock:
            return self._recorded(key, request_hash(request))

    def apply_credit(self, key: str, request: CreditRequest) -> RecordedAnswer:
        """Apply the credit once for `key`, or replay the first answer if another request got there first.

        Without dedup, apply a new credit every time.
        """
        fingerprint = request_hash(request)
        with self._lock, self._conn:
            # Checked again under the lock: two first-time requests may have raced past recorded_answer.
            existing = self._recorded(key, fingerprint) if self.dedup else None
            if existing is not None:
                return existing
            if self._conn.execute("SELECT 1 FROM fenced_keys WHERE idempotency_key = ?", (key,)).fetchone():
                raise KeyFenced(key)
            credit = Credit(
                credit_id=f"cr_{uuid.uuid4().hex}",
                account_id=request.account_id,
                amount_cents=request.amount_cents,
                currency=request.currency,
                status="applied",
                idempotency_key=key,
                created_at=datetime.now(UTC),
                memo=request.memo,
            )
            body = credit.model_dump(mode="json")
            self._conn.execute(
                "INSERT INTO credits (credit_id, idempotency_key, request_hash, account_id, amount_cents,"
                " currency, memo, status, created_at, response_status, response_body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    credit.credit_id,
                    key,
                    fingerprint,
                    credit.account_id,
                    credit.amount_cents,
                    credit.currency,
                    credit.memo,
                    credit.status,
                    body["created_at"],
                    201,
                    json.dumps(body),
                ),
            )
            return RecordedAnswer(201, body, replayed=False)

    def fence(self, key: str) -> Credit | None:
        """Make `key` unusable unless a credit already exists for it; returns that credit, if any.

        Checked and written under one lock and transaction, so a credit either landed before the
        fence (and is returned) or can never land at all.
        """
        with self._lock, self._conn:
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE idempotency_key = ? ORDER BY rowid LIMIT 1",
                (key,),
            ).fetchone()
            if row is not None:
                return _credit(row)
            self._conn.execute(
                "INSERT INTO fenced_keys (idempotency_key, fenced_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (key, datetime.now(UTC).isoformat()),
            )
            return None

    def credits(self, account_id: str | None = None) -> list[Credit]:
        """Every credit the service applied (voided ones too), oldest first; one account's if given."""
        query = f"SELECT {CREDIT_COLUMNS} FROM credits"
        params: tuple[str, ...] = ()
        if account_id is not None:
            query += " WHERE account_id = ?"
            params = (account_id,)
        with self._lock:
            rows = self._conn.execute(query + " ORDER BY rowid", params).fetchall()
        return [_credit(row) for row in rows]

    def credit_by_key(self, key: str) -> Credit | None:
        """The credit applied for `key`, in its current state (applied or voided)."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE idempotency_key = ? ORDER BY rowid LIMIT 1",
                (key,),
            ).fetchone()
        return None if row is None else _credit(row)

    def effect(self, key: str) -> tuple[int, bool]:
        """(credits applied, any voided) for one key; (0, False) for a key that never took effect."""
        with self._lock:
            row = self._conn.execute(
                "SELECT count(*) AS applied, coalesce(max(status = 'voided'), 0) AS voided"
                " FROM credits WHERE idempotency_key = ?",
                (key,),
            ).fetchone()
        return row["applied"], bool(row["voided"])

    def _recorded(self, key: str, fingerprint: str) -> RecordedAnswer | None:
        row = self._conn.execute(
            "SELECT request_hash, response_status, response_body FROM credits WHERE idempotency_key = ?"
            " ORDER BY rowid LIMIT 1",
            (key,),
        ).fetchone()
        if row is None:
            return None
        if row["request_hash"] != fingerprint:
            raise IdempotencyConflict(key)
        return RecordedAnswer(row["response_status"], json.loads(row["response_body"]), replayed=True)
