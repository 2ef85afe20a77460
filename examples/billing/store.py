"""SQLite storage for credits, their recorded answers and the effect counters tests read.

One connection guarded by a lock: the service calls it from the event loop, but nothing stops a
threadpool route or a test from calling it too, and sqlite3 connections are not safe to share unguarded.
A file path survives a restart of the service (crash drills); None keeps everything in memory.
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

from examples.billing.models import Credit, CreditRequest

SCHEMA = """
CREATE TABLE IF NOT EXISTS credits (
    credit_id            TEXT PRIMARY KEY,
    idempotency_key      TEXT NOT NULL UNIQUE,
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
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY,
    applied         INTEGER NOT NULL DEFAULT 0,
    voided          INTEGER NOT NULL DEFAULT 0
);
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
    """Credits keyed by idempotency key; every method is one transaction under the lock."""

    def __init__(self, path: str | None = None) -> None:
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
        """The answer already given for `key`, None if the key is new; raises IdempotencyConflict."""
        with self._lock:
            return self._recorded(key, request_hash(request))

    def apply_credit(self, key: str, request: CreditRequest) -> RecordedAnswer:
        """Apply the credit once for `key`, or replay the first answer if another request got there first."""
        fingerprint = request_hash(request)
        with self._lock, self._conn:
            # Checked again under the lock: two first-time requests may have raced past recorded_answer.
            existing = self._recorded(key, fingerprint)
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
            # The effect counter moves in the same transaction as the insert, so it counts real
            # applications only: if it ever reads 2, the service applied one key twice.
            self._conn.execute(
                "INSERT INTO effects (idempotency_key, applied) VALUES (?, 1)"
                " ON CONFLICT (idempotency_key) DO UPDATE SET applied = applied + 1",
                (key,),
            )
            return RecordedAnswer(201, body, replayed=False)

    def fence(self, key: str) -> Credit | None:
        """Make `key` unusable unless a credit already exists for it; returns that credit, if any.

        Checked and written under one lock and transaction, so a credit either landed before the
        fence (and is returned) or can never land at all.
        """
        with self._lock, self._conn:
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE idempotency_key = ?", (key,)
            ).fetchone()
            if row is not None:
                return _credit(row)
            self._conn.execute(
                "INSERT INTO fenced_keys (idempotency_key, fenced_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (key, datetime.now(UTC).isoformat()),
            )
            return None

    def credit_by_key(self, key: str) -> Credit | None:
        """The credit applied for `key`, in its current state (applied or voided)."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE idempotency_key = ?", (key,)
            ).fetchone()
        return None if row is None else _credit(row)

    def void_credit(self, credit_id: str, void_key: str) -> tuple[Credit, bool] | None:
        """Void a credit once. Returns (credit, already_voided), or None for an unknown credit.

        Voiding is idempotent on the credit itself, whatever key the repeat carries: the answer is
        the credit as the first void left it.
        """
        with self._lock, self._conn:
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE credit_id = ?", (credit_id,)
            ).fetchone()
            if row is None:
                return None
            if row["status"] == "voided":
                return _credit(row), True
            self._conn.execute(
                "UPDATE credits SET status = 'voided', voided_at = ?, void_idempotency_key = ?"
                " WHERE credit_id = ?",
                (datetime.now(UTC).isoformat(), void_key, credit_id),
            )
            self._conn.execute(
                "UPDATE effects SET voided = 1 WHERE idempotency_key = ?", (row["idempotency_key"],)
            )
            row = self._conn.execute(
                f"SELECT {CREDIT_COLUMNS} FROM credits WHERE credit_id = ?", (credit_id,)
            ).fetchone()
            return _credit(row), False

    def effects(self) -> dict[str, int]:
        """Applications per idempotency key, for every key that ever took effect."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT idempotency_key, applied FROM effects ORDER BY idempotency_key"
            ).fetchall()
        return {row["idempotency_key"]: row["applied"] for row in rows}

    def effect(self, key: str) -> tuple[int, bool]:
        """(applications, voided) for one key; (0, False) for a key that never took effect."""
        with self._lock:
            row = self._conn.execute(
                "SELECT applied, voided FROM effects WHERE idempotency_key = ?", (key,)
            ).fetchone()
        return (0, False) if row is None else (row["applied"], bool(row["voided"]))

    def _recorded(self, key: str, fingerprint: str) -> RecordedAnswer | None:
        row = self._conn.execute(
            "SELECT request_hash, response_status, response_body FROM credits WHERE idempotency_key = ?",
            (key,),
        ).fetchone()
        if row is None:
            return None
        if row["request_hash"] != fingerprint:
            raise IdempotencyConflict(key)
        return RecordedAnswer(row["response_status"], json.loads(row["response_body"]), replayed=True)
