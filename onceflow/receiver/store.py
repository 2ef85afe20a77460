"""The receiver kit's key store on PostgreSQL: claims, records, replays, lookups and fences.

Two ways to keep a request's answer with its key, with different windows:

- `transaction()` (the transactional form): the service's own writes and the key's record commit in
  one transaction. The effect exists if and only if the key is recorded; a crash anywhere before the
  commit leaves neither. Use it when the service's state is in the same PostgreSQL database.
- `claim()` then `complete()` (what the ASGI middleware does): the claim commits before the handler
  runs and the answer after it. A crash between the handler's effect and the record leaves the key
  `in_progress`, which a lookup reports as unknown, never as absent.

`lookup()` and `fence()` are the reconcile protocol. Every method is safe to call from many
processes at once: a key's writers take a transaction-scoped advisory lock first (queries.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from onceflow.ledger.migrate import Component, component, migrate_component
from onceflow.receiver import queries
from onceflow.receiver.keys import RequestShape
from onceflow.receiver.records import (
    ExpiryPolicy,
    KeyRecord,
    KeyState,
    StoredResponse,
    key_fenced,
    key_in_progress,
    key_reused,
)

log = logging.getLogger("onceflow.receiver")

# A connection of the store's pool or one of the service's own.
Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy

MIGRATIONS = component("receiver", Path(__file__).parent / "migrations", oldest_server=(14,))


async def migrate_receiver(dsn_or_conn: str | asyncpg.Connection) -> int:
    """Create or upgrade the key store's tables (in any database: the ledger's or a service's own)."""
    return await migrate_component(dsn_or_conn, MIGRATIONS)


# Read under the lock, and there was no row (distinct from "not read yet").
_ABSENT: Any = object()


class KeyNotRecordedError(RuntimeError):
    """A keyed transaction ended without `record()`: its writes were rolled back, nothing is kept."""


@dataclass(frozen=True)
class FenceResult:
    """A fence's answer: the key's record after it, and whether this call is what fenced it."""

    record: KeyRecord
    fenced_now: bool

    def protocol(self) -> dict[str, object]:
        return self.record.protocol(fenced_now=self.fenced_now)


class KeyedTransaction:
    """A request's transaction in the transactional form (see `KeyStore.transaction`).

    `replay` is the stored answer when the key already completed with this fingerprint: answer with
    it and write nothing. Otherwise do the service's writes on `connection`, then `record()` the
    answer, which commits them together with the key.
    """

    def __init__(
        self,
        connection: Connection,
        transaction: asyncpg.transaction.Transaction,
        store: KeyStore,
        scope: str,
        key: str,
        shape: RequestShape,
        fingerprint: str,
        replay: KeyRecord | None,
    ) -> None:
        self.connection = connection
        self._transaction = transaction
        self._store = store
        self.scope = scope
        self.key = key
        self._shape = shape
        self._fingerprint = fingerprint
        self.replay_record = replay
        self.recorded: KeyRecord | None = None

    @property
    def replay(self) -> StoredResponse | None:
        """The answer to give again (the key completed before), or None: a new request."""
        record = self.replay_record
        return record.response if record is not None else None

    async def record(
        self, status: int, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
    ) -> KeyRecord:
        """Record the answer with the key and commit the service's writes with it. Call it last,
        before answering: after it the connection is no longer the request's."""
        if self.replay_record is not None:
            raise RuntimeError("this request is a replay: answer with `replay`, record nothing")
        if self.recorded is not None:
            raise RuntimeError("the answer was already recorded")
        statement = queries.RECORD if self._store.honour_keys else queries.RECORD_UNLESS_FENCED
        try:
            row = await self.connection.fetchrow(
                statement,
                self.scope,
                self.key,
                self._fingerprint,
                self._shape.method,
                self._shape.path,
                status,
                json.dumps([list(pair) for pair in headers]),
                body,
                self._store.policy.lifetime,
            )
        except asyncpg.UniqueViolationError:
            # Only a writer that ignored the key's lock can get here; its record stands, ours goes.
            raise key_in_progress(self.key, self._store.policy.retry_after_seconds) from None
        if row is None:  # honouring no key, and a fence got there first
            raise key_fenced(self.key)
        await self._transaction.commit()
        self.recorded = KeyRecord.from_row(row)
        return self.recorded


class KeyStore:
    """Keys within scopes, on an asyncpg pool. Open with `KeyStore.connect(dsn)` (which migrates),
    or around a pool of the service's own with `KeyStore(pool)` after `migrate_receiver`.

    `honour_keys=False` is for drills and tests that count sends: every request applies, whatever
    its key (no replay, no 422, no 409); keys are still recorded, so lookups answer, and a fenced key
    is still refused.
    """

    def __init__(
        self, pool: asyncpg.Pool, *, policy: ExpiryPolicy | None = None, honour_keys: bool = True
    ) -> None:
        self.pool = pool
        self.policy = policy or ExpiryPolicy()
        self.honour_keys = honour_keys
        self._owns_pool = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        policy: ExpiryPolicy | None = None,
        honour_keys: bool = True,
        min_size: int = 1,
        max_size: int = 10,
        migrate: bool = True,
    ) -> KeyStore:
        """A store with a pool of its own on `dsn`, its tables migrated first (unless `migrate=False`)."""
        if migrate:
            await migrate_receiver(dsn)
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)
        store = cls(pool, policy=policy, honour_keys=honour_keys)
        store._owns_pool = True
        return store

    async def close(self) -> None:
        """Close the pool, if the store opened it."""
        if self._owns_pool:
            await self.pool.close()

    # -- the reconcile protocol ------------------------------------------------------------------

    async def lookup(self, scope: str, key: str) -> KeyRecord:
        """What the store knows about the key: its record, `in_progress` while a transactional
        request with it is in flight, or ABSENT. Read-only: it takes no lock and writes nothing."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(queries.GET, scope, key)
            if row is None and await conn.fetchval(queries.LOCK_HELD, scope, key):
                return KeyRecord(scope, key, KeyState.IN_PROGRESS)
            if row is None:  # looked again: a request may have committed between the two reads
                row = await conn.fetchrow(queries.GET, scope, key)
        return KeyRecord.from_row(row) if row is not None else KeyRecord.absent(scope, key)

    async def fence(self, scope: str, key: str) -> FenceResult:
        """Atomically: a completed key is returned; an absent one is recorded fenced (then refused
        for good); one in progress is reported so, and nothing is written."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="read_committed"):
            locked = await conn.fetchrow(queries.TRY_LOCK_AND_GET, scope, key)
            assert locked is not None
            if not locked["locked"]:
                # Someone holds the key: a request in flight, or a replay of a completed key.
                held = await conn.fetchrow(queries.GET, scope, key)
                if held is not None and held["state"] != KeyState.IN_PROGRESS:
                    return FenceResult(KeyRecord.from_row(held), fenced_now=False)
                return FenceResult(KeyRecord(scope, key, KeyState.IN_PROGRESS), fenced_now=False)
            if locked["state"] is not None:
                return FenceResult(KeyRecord.from_row(locked), fenced_now=False)
            fenced = await conn.fetchrow(queries.FENCE, scope, key)
            if fenced is None:
                return FenceResult(
                    KeyRecord.from_row(await conn.fetchrow(queries.GET, scope, key)), fenced_now=False
                )
        log.info("fenced key %r in scope %r: no record of it", key, scope)
        return FenceResult(KeyRecord.from_row(fenced), fenced_now=True)

    # -- the transactional form ------------------------------------------------------------------

    @asynccontextmanager
    async def transaction(
        self, scope: str, key: str, shape: RequestShape, *, connection: Connection | None = None
    ) -> AsyncIterator[KeyedTransaction]:
        """A transaction holding the key: see `KeyedTransaction`. Raises a `Refusal` (fenced,
        in progress, reused with another fingerprint) before anything runs. Leaving the block
        without `record()` rolls everything back; an exception does too."""
        fingerprint = shape.fingerprint()
        if connection is not None:
            async with self._transaction(connection, scope, key, shape, fingerprint) as keyed:
                yield keyed
            return
        async with (
            self.pool.acquire() as conn,
            self._transaction(conn, scope, key, shape, fingerprint) as keyed,
        ):
            yield keyed

    @asynccontextmanager
    async def _transaction(
        self, conn: Connection, scope: str, key: str, shape: RequestShape, fingerprint: str
    ) -> AsyncIterator[KeyedTransaction]:
        transaction = conn.transaction(isolation="read_committed")
        await transaction.start()
        keyed: KeyedTransaction | None = None
        try:
            replay = await self._decide(conn, scope, key, fingerprint)
            keyed = KeyedTransaction(conn, transaction, self, scope, key, shape, fingerprint, replay)
            yield keyed
        except BaseException:
            if keyed is None or keyed.recorded is None:  # recorded: committed already
                await _rollback(transaction)
            raise
        if keyed.recorded is None:
            await _rollback(transaction)
            if replay is None:
                raise KeyNotRecordedError(
                    f"the request with key {key!r} ended without recording its answer; "
                    "its writes were rolled back"
                )

    async def _decide(self, conn: Connection, scope: str, key: str, fingerprint: str) -> KeyRecord | None:
        """Inside the request's transaction: the record to replay, None to go ahead, or a refusal."""
        if not self.honour_keys:
            row = await conn.fetchrow(queries.GET, scope, key)
            if row is not None and row["state"] == KeyState.FENCED:
                raise key_fenced(key)
            return None
        return await self._locked(conn, scope, key, fingerprint)

    async def _locked(self, conn: Connection, scope: str, key: str, fingerprint: str) -> KeyRecord | None:
        """Take the key's lock and decide under it: the record to replay, None when the key is now
        this request's, or a refusal. Whoever holds the lock may be replaying a completed key: a
        completed answer (or a fence) needs no lock, since neither changes, so repeats of a
        completed key never meet one another as "in progress"."""
        row = await conn.fetchrow(queries.TRY_LOCK_AND_GET, scope, key)
        assert row is not None
        if row["locked"]:
            return await self._existing(
                conn, scope, key, fingerprint, row if row["state"] is not None else _ABSENT
            )
        held = await conn.fetchrow(queries.GET, scope, key)
        if held is not None and held["state"] != KeyState.IN_PROGRESS and not held["expired"]:
            return await self._existing(conn, scope, key, fingerprint, held)
        raise key_in_progress(key, self.policy.retry_after_seconds)

    async def _existing(
        self, conn: Connection, scope: str, key: str, fingerprint: str, row: Any = None
    ) -> KeyRecord | None:
        """With the key's lock held (or `row`, a completed or fenced one, read without it): the
        record to replay, None when the key is free, or a refusal."""
        if row is None:
            row = await conn.fetchrow(queries.GET, scope, key)
        if row is None or row is _ABSENT:
            return None
        record = KeyRecord.from_row(row)
        if record.state is KeyState.FENCED:
            raise key_fenced(key)
        if record.state is KeyState.IN_PROGRESS:
            raise key_in_progress(key, self.policy.retry_after_seconds)
        if record.expired:
            await conn.execute(queries.DELETE_EXPIRED_ONE, scope, key)
            return None
        if record.fingerprint != fingerprint:
            raise key_reused(key)
        return record

    # -- the middleware's form -------------------------------------------------------------------

    async def claim(self, scope: str, key: str, shape: RequestShape) -> KeyRecord:
        """Claim the key before the handler runs (committed at once): the claim (`in_progress`,
        with its expiry), or the `completed` record to replay instead; raises a `Refusal` otherwise.
        Honouring no key, the record is ABSENT: go ahead, nothing is claimed."""
        fingerprint = shape.fingerprint()
        async with self.pool.acquire() as conn, conn.transaction(isolation="read_committed"):
            if not self.honour_keys:
                row = await conn.fetchrow(queries.GET, scope, key)
                if row is not None and row["state"] == KeyState.FENCED:
                    raise key_fenced(key)
                return KeyRecord.absent(scope, key)
            replay = await self._locked(conn, scope, key, fingerprint)
            if replay is not None:
                return replay
            row = await conn.fetchrow(
                queries.CLAIM, scope, key, fingerprint, shape.method, shape.path, self.policy.lifetime
            )
        return KeyRecord.from_row(row)

    async def complete(self, scope: str, key: str, shape: RequestShape, response: StoredResponse) -> None:
        """Record the handler's answer over this request's claim."""
        headers = json.dumps([list(pair) for pair in response.headers])
        fingerprint = shape.fingerprint()
        async with self.pool.acquire() as conn:
            if not self.honour_keys:
                await conn.fetchrow(
                    queries.RECORD_UNLESS_FENCED,
                    scope,
                    key,
                    fingerprint,
                    shape.method,
                    shape.path,
                    response.status,
                    headers,
                    response.body,
                    self.policy.lifetime,
                )
                return
            row = await conn.fetchrow(
                queries.COMPLETE_CLAIM, scope, key, fingerprint, response.status, headers, response.body
            )
        if row is None:
            log.warning("the claim on key %r in scope %r was gone when its answer came", key, scope)

    async def release(self, scope: str, key: str, shape: RequestShape) -> None:
        """Give up this request's claim: the handler said nothing was done (a release status)."""
        if self.honour_keys:
            await self.pool.execute(queries.RELEASE_CLAIM, scope, key, shape.fingerprint())

    async def release_stuck(self, scope: str, key: str) -> bool:
        """Release a claim left in progress by a handler that died, once a person has made sure the
        effect did not happen. True if there was one. A completed or fenced key is never touched."""
        result = await self.pool.execute(queries.RELEASE_STUCK, scope, key)
        return str(result).endswith(" 1")

    # -- housekeeping ----------------------------------------------------------------------------

    async def purge_expired(self, batch: int = 1000) -> int:
        """Delete answers past their expiry, a batch at a time; returns how many went."""
        removed = 0
        while True:
            result = await self.pool.execute(queries.PURGE_EXPIRED, batch)
            count = int(str(result).rsplit(" ", 1)[-1])
            removed += count
            if count < batch:
                return removed


def migrations() -> Component:
    """The key store's migrations, for a service that runs its own migration step."""
    return MIGRATIONS


async def _rollback(transaction: asyncpg.transaction.Transaction) -> None:
    """Roll back; a connection that is already gone has rolled back by itself."""
    try:
        await transaction.rollback()
    except (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError) as exc:
        log.warning(
            "could not roll back a keyed transaction (%s); the server drops it with the connection", exc
        )
