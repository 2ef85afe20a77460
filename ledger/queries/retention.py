"""Retention (ledger/retention.py): purge, or archive, settled runs past their age."""

# Keys a purge may take: every call of the run is purgeable (settled, untouched since the cutoff, no
# open conflict, no event since the cutoff), so a run's keys go together or not at all.
PURGE_CANDIDATES = """
WITH calls AS (
    SELECT t.key, t.run_id,
           onceflow_purgeable(t, $1::timestamptz)
           AND NOT EXISTS (SELECT 1 FROM tool_execution_events e WHERE e.key = t.key AND e.at >= $1)
           AS purgeable
      FROM tool_executions t
), runs AS (
    SELECT run_id FROM calls GROUP BY run_id HAVING bool_and(purgeable)
)
SELECT calls.key FROM calls JOIN runs USING (run_id) ORDER BY calls.key
"""

SET_PURGE_CUTOFF = "SELECT set_config('onceflow.purge_before', $1::timestamptz::text, true)"

# Inside a purge's transaction: lock the batch, and keep only what is still purgeable now.
LOCK_PURGEABLE = """
SELECT t.key FROM tool_executions t
 WHERE t.key = ANY($1::text[])
   AND onceflow_purgeable(t, $2::timestamptz)
   AND NOT EXISTS (SELECT 1 FROM tool_execution_events e WHERE e.key = t.key AND e.at >= $2)
 ORDER BY t.key
   FOR UPDATE OF t
"""

ARCHIVE_EVENTS = """
INSERT INTO tool_execution_events_archive (id, key, event)
SELECT id, key, to_jsonb(e) FROM tool_execution_events e WHERE key = ANY($1::text[])
ON CONFLICT (id) DO NOTHING
"""

ARCHIVE_EXECUTIONS = """
INSERT INTO tool_executions_archive (key, tenant, run_id, settled_at, record)
SELECT key, tenant, run_id, settled_at, to_jsonb(t) FROM tool_executions t WHERE key = ANY($1::text[])
ON CONFLICT (key) DO NOTHING
"""

DELETE_EVENTS = "DELETE FROM tool_execution_events WHERE key = ANY($1::text[])"

DELETE_EXECUTIONS = "DELETE FROM tool_executions WHERE key = ANY($1::text[])"

COUNT_EVENTS = "SELECT count(*) FROM tool_execution_events WHERE key = ANY($1::text[])"

DATABASE_NOW = "SELECT clock_timestamp()"

# The purge's cutoff: the database's clock less the age ($1).
PURGE_CUTOFF = "SELECT clock_timestamp() - $1::interval"

# Runs whose stored conversation may be past use: no message since the cutoff, and no unresolved
# call (whatever Temporal says, a run that waits on a call will read its conversation again).
# Temporal decides the rest (ledger/retention.py, purge_conversations). A whole scan of the table:
# a maintenance job's read, kept off the write path (no index on created_at to keep up).
CONVERSATION_CANDIDATES = """
SELECT m.run_id
  FROM conversation_messages m
 GROUP BY m.run_id
HAVING max(m.created_at) < $1
   AND NOT EXISTS (
       SELECT 1 FROM tool_executions t
        WHERE t.run_id = m.run_id
          AND t.status IN ('held', 'awaiting_approval', 'started', 'indeterminate'))
 ORDER BY m.run_id
"""

CONVERSATION_BYTES = """
SELECT count(*) AS messages, coalesce(sum(pg_column_size(m.*)), 0) AS bytes
  FROM conversation_messages m WHERE m.run_id = ANY($1::text[])
"""

# Inside the purge's transaction (SET_PURGE_CUTOFF first): the whole chain of each run at once, so
# the chain's own foreign key (parent) is satisfied at the end of the statement.
DELETE_CONVERSATIONS = """
DELETE FROM conversation_messages m
 WHERE m.run_id = ANY($1::text[])
   AND NOT EXISTS (SELECT 1 FROM conversation_messages y WHERE y.run_id = m.run_id AND y.created_at >= $2)
"""
