"""Operator decisions (ledger/decisions.py): approve, deny, claim the approved call, release,
escalate, compensated."""

# Decisions lock the row first, so the check, the change and its event see one state.
SELECT_FOR_DECISION = """
SELECT *, coalesce(lease_expires_at < clock_timestamp(), false) AS owner_gone
  FROM tool_executions WHERE key = $1 FOR UPDATE
"""

APPROVE = """
UPDATE tool_executions
   SET approved_by = $2, approved_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE key = $1 AND (status = 'awaiting_approval' AND approved_at IS NULL) IS TRUE  -- see queries/__init__.py
RETURNING *
"""

DENY = """
UPDATE tool_executions
   SET status = 'denied', failure_kind = 'denied', settled_at = clock_timestamp(), settled_by = $2,
       reason = $3, updated_at = clock_timestamp()
 WHERE key = $1 AND (status = 'awaiting_approval' AND approved_at IS NULL) IS TRUE  -- see queries/__init__.py
RETURNING *
"""

# The approved call is dispatched by the reservation that claims it: once, with the approved payload.
CLAIM_APPROVED = """
WITH claimed AS (
    UPDATE tool_executions
       SET status = 'started', owner = $2, lease_expires_at = clock_timestamp() + $4::interval,
           updated_at = clock_timestamp()
     WHERE key = $1 AND payload_sha256 = $3
       AND (status = 'awaiting_approval' AND approved_at IS NOT NULL) IS TRUE  -- see queries/__init__.py
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, detail)
    SELECT key, owner, 'dispatched', 'owner', 'awaiting_approval', 'started',
           jsonb_build_object('approved_by', approved_by)
    FROM claimed
)
SELECT * FROM claimed
"""

# An operator releases a call that was never sent: held, or approved and not yet claimed. It is
# settled failed (`released`, final), so it holds no entity slot or budget amount any more.
RELEASE = """
UPDATE tool_executions
   SET status = 'failed', failure_kind = 'released', held_by = NULL, lease_expires_at = NULL,
       settled_at = clock_timestamp(), settled_by = $2, reason = $3, updated_at = clock_timestamp()
 WHERE key = $1  -- and the state test IS TRUE: see queries/__init__.py
   AND (status = 'held' OR (status = 'awaiting_approval' AND approved_at IS NOT NULL)) IS TRUE
RETURNING *
"""

ESCALATE = """
UPDATE tool_executions
   SET escalated_to = $2, escalated_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE key = $1 AND escalated_at IS NULL
RETURNING *
"""

SET_COMPENSATED = """
UPDATE tool_executions
   SET status = 'compensated', updated_at = clock_timestamp()
 WHERE key = $1 AND (status = 'completed') IS TRUE  -- by its key: see queries/__init__.py
RETURNING *
"""
