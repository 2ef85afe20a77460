"""A call's own path: reserve it, read it, and the owner's outcome (ledger/calls.py, ledger/reads.py)."""

# Reserve is one atomic statement. A new key is inserted; a key whose last attempt failed (and so
# did not take effect) is re-reserved with attempt + 1 under the same payload; anything else is left
# untouched and RETURNING yields nothing, so the caller reads the row and decides by its status.
# $13: the attempt's deadline (NULL: none); past it nothing is inserted or re-reserved. $14: when the
# attempt began (NULL: not known); a failure settled since is not re-reserved by it.
RESERVE = """
WITH reserved AS (
    INSERT INTO tool_executions AS t
        (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
         payload, payload_sha256, owner, lease_expires_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, clock_timestamp() + $12::interval
     WHERE $13::timestamptz IS NULL OR clock_timestamp() <= $13::timestamptz
    ON CONFLICT (key) DO UPDATE
        SET status = EXCLUDED.status,
            attempt = t.attempt + 1,
            owner = EXCLUDED.owner,
            lease_expires_at = EXCLUDED.lease_expires_at,
            result = NULL, result_reference = NULL, failure_kind = NULL, error = NULL,
            settled_at = NULL, settled_by = NULL, reason = NULL, evidence = NULL,
            approved_by = NULL, approved_at = NULL, escalated_to = NULL, escalated_at = NULL,
            conflict_at = NULL, conflict_detail = NULL,
            conflict_cleared_at = NULL, conflict_cleared_by = NULL,
            updated_at = clock_timestamp()
        WHERE t.status = 'failed' AND t.payload_sha256 = EXCLUDED.payload_sha256
          AND t.tenant = EXCLUDED.tenant
          -- A refusal on policy grounds or by a guard, and a release, are final for their key.
          AND coalesce(t.failure_kind, '') NOT IN ('policy_refused', 'guard_refused', 'released')
          -- A call that was ever in conflict is never sent again: open, its owner says it took
          -- effect; acknowledged, an operator set what the world is, for good.
          AND t.conflict_at IS NULL
          AND ($13::timestamptz IS NULL OR clock_timestamp() <= $13::timestamptz)
          -- A retry the workflow decides on begins after it heard the failure; an attempt that
          -- began before it is one its workflow gave up on (an execution a reset replaced).
          AND ($14::timestamptz IS NULL OR t.settled_at IS NULL OR t.settled_at < $14::timestamptz)
    RETURNING t.*, (xmax = 0) AS inserted
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, detail)
    SELECT key, owner, 'reserved', 'owner', CASE WHEN inserted THEN NULL ELSE 'failed' END, status,
           jsonb_build_object('attempt', attempt)
    FROM reserved
)
SELECT * FROM reserved
"""

SELECT_RECORD = "SELECT * FROM tool_executions WHERE key = $1"

# Is the database's clock past $1? (A plain reservation that found nothing to take.)
PAST = "SELECT clock_timestamp() > $1::timestamptz"

SELECT_RECORD_FOR_UPDATE = "SELECT * FROM tool_executions WHERE key = $1 FOR UPDATE"

SELECT_EVENTS = "SELECT * FROM tool_execution_events WHERE key = $1 ORDER BY id"

INSERT_EVENT = """
INSERT INTO tool_execution_events
    (key, actor, kind, from_status, to_status, reason, evidence, detail, source)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9)
"""

# The hot path: the owner of a started call records its result. One statement, event included.
COMPLETE_STARTED = """
WITH done AS (
    UPDATE tool_executions
       SET status = 'completed', result = $3::jsonb, result_reference = $4,
           settled_at = clock_timestamp(), settled_by = owner, updated_at = clock_timestamp()
     WHERE key = $1 AND owner = $2 AND (status = 'started') IS TRUE  -- by its key: see queries/__init__.py
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status)
    SELECT key, owner, 'completed', 'owner', 'started', 'completed' FROM done
)
SELECT * FROM done
"""

# The hot path when this process holds the reservation's answer (ledger/acknowledged.py): the same
# update and event, but only over the row as it was answered ($5, its updated_at: every write to a
# call sets it, but for a held twin's `holds_calls` mark, which is returned). Only what the update
# sets comes back; the caller builds the record from the reservation it holds. No row back: the row
# moved since (or is not started by this owner), and the caller sends COMPLETE_STARTED instead.
# Returning the whole row cost about as many instructions as the update itself (docs/benchmarks.md).
COMPLETE_RESERVED = """
WITH done AS (
    UPDATE tool_executions
       SET status = 'completed', result = $3::jsonb, result_reference = $4,
           settled_at = clock_timestamp(), settled_by = owner, updated_at = clock_timestamp()
     WHERE key = $1 AND owner = $2 AND (status = 'started' AND updated_at = $5::timestamptz) IS TRUE
    RETURNING key, owner, result, settled_at, updated_at, holds_calls
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status)
    SELECT key, owner, 'completed', 'owner', 'started', 'completed' FROM done
)
SELECT result, settled_at, updated_at, holds_calls FROM done
"""

FAIL_STARTED = """
WITH done AS (
    UPDATE tool_executions
       SET status = 'failed', failure_kind = $3, error = $4,
           settled_at = clock_timestamp(), settled_by = owner, updated_at = clock_timestamp()
     WHERE key = $1 AND owner = $2 AND (status = 'started') IS TRUE  -- by its key: see queries/__init__.py
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, reason)
    SELECT key, owner, 'failed', 'owner', 'started', 'failed', failure_kind || ': ' || error FROM done
)
SELECT * FROM done
"""

# Guarded transitions: compare-and-set on the status the caller saw. No row back means it moved.
SET_COMPLETED = """
UPDATE tool_executions
   SET status = 'completed', result = $3::jsonb, result_reference = $4,
       settled_at = clock_timestamp(), settled_by = $5, reason = $6, evidence = $7::jsonb,
       updated_at = clock_timestamp()
 WHERE key = $1 AND (status = $2) IS TRUE  -- by its key: see queries/__init__.py
RETURNING *
"""

SET_FAILED = """
UPDATE tool_executions
   SET status = 'failed', failure_kind = $3, error = $4,
       settled_at = clock_timestamp(), settled_by = $5, reason = $6, evidence = $7::jsonb,
       updated_at = clock_timestamp()
 WHERE key = $1 AND (status = $2) IS TRUE  -- by its key: see queries/__init__.py
RETURNING *
"""

# $3: only once the owner's lease has run out (an inspector); false for the owner itself.
SET_INDETERMINATE = """
UPDATE tool_executions
   SET status = 'indeterminate', error = $2, updated_at = clock_timestamp()
 WHERE key = $1  -- by its key, the rest IS TRUE: see queries/__init__.py
   AND (status = 'started' AND (NOT $3 OR coalesce(lease_expires_at <= clock_timestamp(), true))) IS TRUE
RETURNING *
"""
