"""SQLite storage for credits, their recorded answers, the effect counters and every request received.

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
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY,
    applied         INTEGER NOT NULL DEFAULT 0,
    voided          INTEGER NOT NULL DEFAULT 0
);
-- Every request to a business route, written when it arrives: before dedup, fencing or faults can
-- answer it, so a key sent twice shows twice here whatever the service then made of it.
CREATE TABLE IF NOT EXISTS received_requests (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    method          TEXT NOT NULL,
    path            TEXT NOT NULL,
    idempotency_key TEXT,              -- the Idempotency-Key header as it arrived; NULL if absent
    received_at     TEXT NOT NULL,
    applied         INTEGER NOT NULL DEFAULT 0,  -- set in the transaction that applies the credit
    status_code     INTEGER            -- the answer's status; NULL: none (dropped, or the service died)
);
CREATE INDEX IF NOT EXISTS received_by_key ON received_requests (idempotency_key);
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


@dataclass(frozen=True)
class ReceivedRow:
    """One request as the service received it (see the `received_requests` table)."""

    id: int
    method: str
    path: str
    idempotency_key: str | None
    received_at: str
    applied: bool
    status_code: int | None


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

    def apply_credit(
        self, key: str, request: CreditRequest, received_id: int | None = None
    ) -> RecordedAnswer:
        """Apply the credit once for `key`, or replay the first answer if another request got there first.

        Without dedup, apply a new credit every time. `received_id` (the request's row in
        `received_requests`) is marked applied in the same transaction as the credit.
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
            # The effect counter moves in the same transaction as the insert, so it counts real
            # applications only: if it ever reads 2, the service applied one key twice.
            self._conn.execute(
                "INSERT INTO effects (idempotency_key, applied) VALUES (?, 1)"
                " ON CONFLICT (idempotency_key) DO UPDATE SET applied = applied + 1",
                (key,),
            )
            if received_id is not None:
                self._conn.execute("UPDATE received_requests SET applied = 1 WHERE id = ?", (received_id,))
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
            "SELECT request_hash, response_status, response_body FROM credits WHERE idempotency_key = ?"
            " ORDER BY rowid LIMIT 1",
            (key,),
        ).fetchone()
        if row is None:
            return None
        if row["request_hash"] != fingerprint:
            raise IdempotencyConflict(key)
        return RecordedAnswer(row["response_status"], json.loads(row["response_body"]), replayed=True)

    # -- requests as received ---------------------------------------------------------------------

    def receive(self, method: str, path: str, key: str | None) -> int:
        """Write down a request that just arrived; returns its id, for `answered` and `apply_credit`."""
        with self._lock, self._conn:
            cursor = self._conn.execute(
                "INSERT INTO received_requests (method, path, idempotency_key, received_at)"
                " VALUES (?, ?, ?, ?)",
                (method, path, key, datetime.now(UTC).isoformat()),
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def answered(self, received_id: int, status_code: int) -> None:
        """Note the status the service answered a received request with."""
        with self._lock, self._conn:
            self._conn.execute(
                "UPDATE received_requests SET status_code = ? WHERE id = ?", (status_code, received_id)
            )

    def received(self, key: str) -> list[ReceivedRow]:
        """Every request that arrived carrying `key` as its Idempotency-Key, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM received_requests WHERE idempotency_key = ? ORDER BY id", (key,)
            ).fetchall()
        return [_received(row) for row in rows]

    def received_counts(
        self, method: str | None = None, path: str | None = None, prefix: str | None = None
    ) -> dict[str | None, int]:
        """Requests received per Idempotency-Key (None: without one), filtered by method and path."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT idempotency_key, count(*) AS n FROM received_requests"
                " WHERE (?1 IS NULL OR method = ?1) AND (?2 IS NULL OR path = ?2)"
                " AND (?3 IS NULL OR substr(path, 1, length(?3)) = ?3)"
                " GROUP BY idempotency_key ORDER BY idempotency_key",
                (method, path, prefix),
            ).fetchall()
        return {row["idempotency_key"]: row["n"] for row in rows}


def _received(row: sqlite3.Row) -> ReceivedRow:
    return ReceivedRow(
        id=row["id"],
        method=row["method"],
        path=row["path"],
        idempotency_key=row["idempotency_key"],
        received_at=row["received_at"],
        applied=bool(row["applied"]),
        status_code=row["status_code"],
    )
