"""Conflicts (ledger/conflicts.py): a late outcome that contradicts the decision."""

# Did `$2` ever own this call (reserve it or dispatch it)? Its late outcome is then evidence.
WAS_OWNER = """
SELECT EXISTS (
    SELECT 1 FROM tool_execution_events
     WHERE key = $1 AND actor = $2 AND kind IN ('reserved', 'dispatched')
)
"""

# Flag a settled call as contradicted. The status is not touched: the decision stands.
FLAG_CONFLICT = """
UPDATE tool_executions
   SET conflict_at = clock_timestamp(), conflict_detail = $2::jsonb,
       conflict_cleared_at = NULL, conflict_cleared_by = NULL, updated_at = clock_timestamp()
 WHERE key = $1 AND (status IN ('completed', 'failed', 'denied', 'compensated')) IS TRUE  -- see queries/__init__.py
RETURNING *
"""

# The operator says what the world is ($3: completed, failed or compensated). The same status as
# decided only closes the flag; another one is a new settlement by the operator, with their evidence.
# A failure so set is `not_applied`; a completion keeps the result the late report carried, if any.
# Either way the row is final: RESERVE never takes a row that was in conflict.
ACKNOWLEDGE_CONFLICT = """
UPDATE tool_executions
   SET conflict_cleared_at = clock_timestamp(), conflict_cleared_by = $2,
       status = $3,
       failure_kind = CASE WHEN $3 = 'failed' THEN coalesce(failure_kind, 'not_applied') END,
       error = CASE WHEN $3 = 'failed' THEN error END,
       result = CASE WHEN $3 <> 'failed' THEN coalesce(result, conflict_detail -> 'result') END,
       settled_at = CASE WHEN status = $3 THEN settled_at ELSE clock_timestamp() END,
       settled_by = CASE WHEN status = $3 THEN settled_by ELSE $2 END,
       reason = CASE WHEN status = $3 THEN reason ELSE $4 END,
       evidence = CASE WHEN status = $3 THEN evidence ELSE $5::jsonb END,
       updated_at = clock_timestamp()
 WHERE key = $1 AND (conflict_at IS NOT NULL AND conflict_cleared_at IS NULL) IS TRUE  -- see queries/__init__.py
RETURNING *
"""
