"""When the ledger's server fails over: its timeline, and calls a failover may have lost
(ledger/timelines.py, ledger/lost_writes.py)."""

# The server's current timeline, from the name of the WAL file it writes (its first 8 hex digits).
# Readable by any role, unlike pg_control_checkpoint(), and current at once after a promotion (the
# checkpoint's timeline changes only at the next checkpoint). Errors on a standby: the ledger never
# writes to one.
TIMELINE = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"

# One statement, so one implicit transaction whose commit does not wait for a synchronous standby
# (set_config(..., true) lasts until that commit): a promoted primary whose new standby has not
# attached yet would hold every commit, and this runs while a pool opens a connection.
RECORD_TIMELINE = """
INSERT INTO onceflow_timelines (timeline, first_seen_by)
SELECT $1, $2 FROM (SELECT set_config('synchronous_commit', 'local', true)) AS commit_locally
ON CONFLICT (timeline) DO NOTHING
"""

# The first switch of timeline seen at or after $1: a timeline above the lowest one recorded (the
# ledger's first is where it started, not a switch). NULL when none.
SWITCH_SEEN_SINCE = """
SELECT timeline, first_seen_at FROM onceflow_timelines
 WHERE first_seen_at >= $1::timestamptz
   AND timeline > (SELECT min(timeline) FROM onceflow_timelines)
 ORDER BY first_seen_at
 LIMIT 1
"""

SELECT_RECORDS = "SELECT * FROM tool_executions WHERE key = ANY($1::text[])"

# A call a failover lost entirely, written back from the row as its acknowledged write returned it:
# as `indeterminate` ($8) when it may have been sent, or exactly as acknowledged when it never was
# (held, awaiting approval, refused by a guard, answered with a twin's result). With the event that
# says why. Nothing if a row for the key exists meanwhile: the caller reads it and decides again.
RESTORE_LOST = """
WITH restored AS (
    INSERT INTO tool_executions
        (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status, payload,
         payload_sha256, attempt, owner, error, created_at, entity, entity_exclusive, amount,
         budget_limit, toolset, currency, replaces, result, failure_kind, reused_from, held_by,
         hold_reason, settled_at, settled_by, lease_expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $19, $20, $21, $22::jsonb, $23, $24, $25, $26, $27, $28, $29)
    ON CONFLICT (key) DO NOTHING
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, reason, detail)
    SELECT key, $30, 'lost_in_failover', $31, NULL, status, $32, $33::jsonb FROM restored
)
SELECT * FROM restored
"""

# A call whose row a failover left behind what its owner had recorded (an older attempt, or the
# reservation without its outcome): it becomes `indeterminate` at the owner's attempt. $5: the
# status the caller saw, compare-and-set.
RESTORE_BEHIND = """
UPDATE tool_executions
   SET status = 'indeterminate', attempt = $2, owner = $3, error = $4,
       result = NULL, result_reference = NULL, failure_kind = NULL,
       settled_at = NULL, settled_by = NULL, reason = NULL, evidence = NULL, held_by = NULL,
       hold_reason = NULL, reused_from = NULL, updated_at = clock_timestamp()
 WHERE key = $1 AND (status = $5 AND attempt = $6) IS TRUE  -- by its key: see queries/__init__.py
RETURNING *
"""
