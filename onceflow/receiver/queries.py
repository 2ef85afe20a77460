"""Every statement the receiver kit's key store runs, by name (the table: migrations/0001_keys.sql).

A key's writers (a request in either form, and a fence) first take a transaction-scoped advisory
lock on (LOCK_CLASS, hashtext(scope, key)) with *try* semantics: whoever holds it is "in progress",
and the others are told so at once instead of waiting. In the transactional form that lock is the
only sign of a request in flight (its row commits with the answer), so a lookup checks the lock
table for it before it reads the row.
"""

from __future__ import annotations

# "keys" in ASCII: the first half of every key lock; the second is hashtext of scope and key.
LOCK_CLASS = 0x6B657973

# Scope and key joined by a unit separator, a character a key can never hold (keys.check_key).
_LOCK_TARGET = "hashtext($1 || chr(31) || $2)"

# Held by someone else right now: a request of the transactional form is in flight. Two-key
# advisory locks show their keys as oids in classid and objid, with objsubid 2.
LOCK_HELD = f"""
SELECT EXISTS (
    SELECT 1 FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND objsubid = 2
       AND classid = {LOCK_CLASS}::oid
       AND objid = ({_LOCK_TARGET})::oid
       AND pid <> pg_backend_pid())
"""

_COLUMNS = """scope, key, state, fingerprint, method, path, response_status, response_headers,
    response_body, created_at, completed_at, expires_at, coalesce(expires_at <= now(), false) AS expired"""

GET = f"SELECT {_COLUMNS} FROM onceflow_receiver_keys WHERE scope = $1 AND key = $2"

# The key's lock and its row in one round trip (`state` is NULL when there is no row). The row is
# read in the statement's snapshot: a holder that commits between that snapshot and the lock leaves
# its row unseen, and then the new record meets the primary key and is refused as in progress.
TRY_LOCK_AND_GET = f"""
SELECT pg_try_advisory_xact_lock({LOCK_CLASS}, {_LOCK_TARGET}) AS locked, found.*
  FROM (SELECT 1) AS one LEFT JOIN ({GET}) AS found ON true
"""

# An answer past its expiry is no longer honoured: the request that meets it starts afresh.
DELETE_EXPIRED_ONE = """
DELETE FROM onceflow_receiver_keys
 WHERE scope = $1 AND key = $2 AND state = 'completed' AND expires_at <= now()
"""

# The middleware's claim, committed before its handler runs.
CLAIM = f"""
INSERT INTO onceflow_receiver_keys (scope, key, state, fingerprint, method, path, expires_at)
VALUES ($1, $2, 'in_progress', $3, $4, $5, now() + $6::interval)
RETURNING {_COLUMNS}
"""

# The middleware's record of the handler's answer, over its own claim only.
COMPLETE_CLAIM = f"""
UPDATE onceflow_receiver_keys
   SET state = 'completed', response_status = $4, response_headers = $5, response_body = $6,
       completed_at = now()
 WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fingerprint = $3
RETURNING {_COLUMNS}
"""

# A handler of the middleware that said "nothing was done" (the service's release statuses).
RELEASE_CLAIM = """
DELETE FROM onceflow_receiver_keys
 WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND fingerprint = $3
"""

# The transactional form's record, in the transaction of the service's own writes.
RECORD = f"""
INSERT INTO onceflow_receiver_keys (scope, key, state, fingerprint, method, path, response_status,
                                    response_headers, response_body, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, $4, $5, $6, $7, $8, now(), now() + $9::interval)
RETURNING {_COLUMNS}
"""

# The same when the receiver honours no key (drills count sends that way): every request applies;
# the first answer stays the key's record; a fence still wins, and then nothing is returned.
RECORD_UNLESS_FENCED = f"""
INSERT INTO onceflow_receiver_keys AS k (scope, key, state, fingerprint, method, path, response_status,
                                         response_headers, response_body, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, $4, $5, $6, $7, $8, now(), now() + $9::interval)
ON CONFLICT (scope, key) DO UPDATE SET state = k.state WHERE k.state <> 'fenced'
RETURNING {_COLUMNS}
"""

# ON CONFLICT: a writer that takes no lock (a receiver honouring no key) may have inserted the key
# meanwhile; the fence then waits for it and reports what it left.
FENCE = f"""
INSERT INTO onceflow_receiver_keys (scope, key, state)
VALUES ($1, $2, 'fenced')
ON CONFLICT (scope, key) DO NOTHING
RETURNING {_COLUMNS}
"""

# Housekeeping: answers past their expiry, oldest first, a batch at a time.
PURGE_EXPIRED = """
DELETE FROM onceflow_receiver_keys
 WHERE (scope, key) IN (
       SELECT scope, key FROM onceflow_receiver_keys
        WHERE state = 'completed' AND expires_at <= now()
        ORDER BY expires_at LIMIT $1)
"""

# A person's decision about a claim the middleware left in progress (its handler died): release it,
# so the key may be used again. Never touches a completed or fenced key.
RELEASE_STUCK = """
DELETE FROM onceflow_receiver_keys WHERE scope = $1 AND key = $2 AND state = 'in_progress'
"""
