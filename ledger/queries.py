"""Every SQL statement the ledger runs, by name. Values always travel as $n parameters."""

# Reserve is one atomic statement. A new key is inserted; a key whose last attempt failed (and so
# did not take effect) is re-reserved with attempt + 1 under the same payload; anything else is left
# untouched and RETURNING yields nothing, so the caller reads the row and decides by its status.
RESERVE = """
WITH reserved AS (
    INSERT INTO tool_executions AS t
        (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
         payload, payload_sha256, owner)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11)
    ON CONFLICT (key) DO UPDATE
        SET status = EXCLUDED.status,
            attempt = t.attempt + 1,
            owner = EXCLUDED.owner,
            result = NULL, result_reference = NULL, failure_kind = NULL, error = NULL,
            settled_at = NULL, settled_by = NULL, reason = NULL, evidence = NULL,
            updated_at = clock_timestamp()
        WHERE t.status = 'failed' AND t.payload_sha256 = EXCLUDED.payload_sha256
          AND t.tenant = EXCLUDED.tenant
    RETURNING t.*, (xmax = 0) AS inserted
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, from_status, to_status, detail)
    SELECT key, owner, 'reserved', CASE WHEN inserted THEN NULL ELSE 'failed' END, status,
           jsonb_build_object('attempt', attempt)
    FROM reserved
)
SELECT * FROM reserved
"""

SELECT_RECORD = "SELECT * FROM tool_executions WHERE key = $1"

SELECT_RECORD_FOR_UPDATE = "SELECT * FROM tool_executions WHERE key = $1 FOR UPDATE"

SELECT_EVENTS = "SELECT * FROM tool_execution_events WHERE key = $1 ORDER BY id"

INSERT_EVENT = """
INSERT INTO tool_execution_events
    (key, actor, kind, from_status, to_status, reason, evidence, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb)
"""

# The hot path: the owner of a started call records its result. One statement, event included.
COMPLETE_STARTED = """
WITH done AS (
    UPDATE tool_executions
       SET status = 'completed', result = $3::jsonb, result_reference = $4,
           settled_at = clock_timestamp(), settled_by = owner, updated_at = clock_timestamp()
     WHERE key = $1 AND owner = $2 AND status = 'started'
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, from_status, to_status)
    SELECT key, owner, 'completed', 'started', 'completed' FROM done
)
SELECT * FROM done
"""

FAIL_STARTED = """
WITH done AS (
    UPDATE tool_executions
       SET status = 'failed', failure_kind = $3, error = $4,
           settled_at = clock_timestamp(), settled_by = owner, updated_at = clock_timestamp()
     WHERE key = $1 AND owner = $2 AND status = 'started'
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, from_status, to_status, reason)
    SELECT key, owner, 'failed', 'started', 'failed', failure_kind || ': ' || error FROM done
)
SELECT * FROM done
"""

# Guarded transitions: compare-and-set on the status the caller saw. No row back means it moved.
SET_COMPLETED = """
UPDATE tool_executions
   SET status = 'completed', result = $3::jsonb, result_reference = $4,
       settled_at = clock_timestamp(), settled_by = $5, reason = $6, evidence = $7::jsonb,
       updated_at = clock_timestamp()
 WHERE key = $1 AND status = $2
RETURNING *
"""

SET_FAILED = """
UPDATE tool_executions
   SET status = 'failed', failure_kind = $3, error = $4,
       settled_at = clock_timestamp(), settled_by = $5, reason = $6, evidence = $7::jsonb,
       updated_at = clock_timestamp()
 WHERE key = $1 AND status = $2
RETURNING *
"""

SET_INDETERMINATE = """
UPDATE tool_executions
   SET status = 'indeterminate', error = $2, updated_at = clock_timestamp()
 WHERE key = $1 AND status = 'started'
RETURNING *
"""

# The operator's queue. The literal status list matches the partial index's predicate.
LIST_UNRESOLVED = """
SELECT * FROM tool_executions
 WHERE tenant = $1
   AND status IN ('started', 'indeterminate', 'awaiting_approval')
   AND status = ANY($2::text[])
   AND ($3::timestamptz IS NULL OR (created_at, key) > ($3::timestamptz, $4::text))
 ORDER BY created_at, key
 LIMIT $5
"""
