"""Every SQL statement the ledger runs, by name. Values always travel as $n parameters."""

# Reserve is one atomic statement. A new key is inserted; a key whose last attempt failed (and so
# did not take effect) is re-reserved with attempt + 1 under the same payload; anything else is left
# untouched and RETURNING yields nothing, so the caller reads the row and decides by its status.
RESERVE = """
WITH reserved AS (
    INSERT INTO tool_executions AS t
        (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
         payload, payload_sha256, owner, lease_expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, clock_timestamp() + $12::interval)
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

SELECT_RECORD_FOR_UPDATE = "SELECT * FROM tool_executions WHERE key = $1 FOR UPDATE"
STATUS_OF_KEY = "SELECT status FROM tool_executions WHERE key = $1"

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
     WHERE key = $1 AND owner = $2 AND status = 'started'
    RETURNING *
), logged AS (
    INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status)
    SELECT key, owner, 'completed', 'owner', 'started', 'completed' FROM done
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

# The operator's queue: unknown calls, calls awaiting approval, started calls whose owner's lease
# ran out ($2: the statuses wanted, possibly none), and calls with an open conflict ($9). Each half
# repeats its partial index's predicate literally, so each is served by its own index; the halves
# are disjoint (a conflict is only ever flagged on a settled call).
LIST_UNRESOLVED = """
(SELECT * FROM tool_executions
  WHERE tenant = $1
    AND status IN ('started', 'indeterminate', 'awaiting_approval', 'held')
    AND status = ANY($2::text[])
    AND (status <> 'started' OR coalesce(lease_expires_at < clock_timestamp(), false))
    AND ($3::text IS NULL OR tool_name = $3)
    AND ($4::text IS NULL OR agent = $4)
    AND ($5::boolean IS NULL OR (escalated_at IS NOT NULL) = $5)
    AND ($6::timestamptz IS NULL OR (created_at, key) > ($6::timestamptz, $7::text))
  ORDER BY created_at, key
  LIMIT $8)
UNION ALL
(SELECT * FROM tool_executions
  WHERE $9::boolean
    AND tenant = $1
    AND conflict_at IS NOT NULL AND conflict_cleared_at IS NULL
    AND ($3::text IS NULL OR tool_name = $3)
    AND ($4::text IS NULL OR agent = $4)
    AND ($5::boolean IS NULL OR (escalated_at IS NOT NULL) = $5)
    AND ($6::timestamptz IS NULL OR (created_at, key) > ($6::timestamptz, $7::text))
  ORDER BY created_at, key
  LIMIT $8)
ORDER BY created_at, key
LIMIT $8
"""

# The operator console's counts per status: LIST_UNRESOLVED's two halves, counted instead of listed
# ($2 tool, $3 agent, either NULL for any).
COUNT_UNRESOLVED = """
SELECT status, escalated_at IS NOT NULL AS escalated, false AS conflict, count(*) AS n
  FROM tool_executions
 WHERE tenant = $1
   AND status IN ('started', 'indeterminate', 'awaiting_approval', 'held')
   AND (status <> 'started' OR coalesce(lease_expires_at < clock_timestamp(), false))
   AND ($2::text IS NULL OR tool_name = $2)
   AND ($3::text IS NULL OR agent = $3)
 GROUP BY 1, 2
UNION ALL
SELECT status, escalated_at IS NOT NULL, true, count(*)
  FROM tool_executions
 WHERE tenant = $1
   AND conflict_at IS NOT NULL AND conflict_cleared_at IS NULL
   AND ($2::text IS NULL OR tool_name = $2)
   AND ($3::text IS NULL OR agent = $3)
 GROUP BY 1, 2
"""


# -- guards (ledger/guards.py, ledger/guarded.py) ---------------------------------------------------

# A guarded reservation, whole: locks, checks, write and event in one server-side function
# (migrations/0010_guarded_reserve_function.sql). $1 the advisory lock names (Guard.locks), then the
# call, then the guard's values; the answer's extra columns are dropped by to_record.
GUARDED_RESERVE = """
SELECT r.o_outcome AS outcome, r.o_action AS action, r.o_previous_status AS previous_status,
       r.o_previous_updated_at AS previous_updated_at, (r.o_record).*
  FROM onceflow_guarded_reserve($1::text[], $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12,
                                $13::interval, $14, $15, $16, $17, $18::numeric, $19::numeric, $20,
                                $21::text[], $22, $23) r
"""

# -- resends within a receiver's dedup window (ledger/resends.py) ---------------------------------

# The call (locked by SELECT_RECORD_FOR_UPDATE just before, in the same transaction) with the
# database's clock and the window's bounds ($2: the window, $3: the lead a resend needs to arrive
# inside it), and what the reconciler already recorded about resends.
SELECT_FOR_RESEND = """
SELECT t.*, clock_timestamp() AS checked_at,
       clock_timestamp() + $3::interval AS on_the_wire_until,
       t.created_at + $2::interval AS window_ends_at,
       t.created_at + $2::interval - $3::interval AS send_by,
       (SELECT count(*) FROM tool_execution_events e
         WHERE e.key = t.key AND e.kind = 'resend') AS resends,
       EXISTS (SELECT 1 FROM tool_execution_events e
                WHERE e.key = t.key AND e.kind = 'resend_window_closed') AS window_closed_noted
  FROM tool_executions t
 WHERE t.key = $1
"""

# The latest resend under a key and its lease. The lease ends at `on_the_wire_until` (its timeout
# plus margin, by the database's clock when it was recorded; resend events written before leases
# carry `lead_seconds` instead), or earlier when its answer came back (`resend_inconclusive` with
# `answered`). After the lease comes a quiet spell as long again, in which no resend leaves, so an
# operator told to decide after the lease gets a turn.
LATEST_RESEND = """
SELECT resend, actor, lease_ends_at,
       lease_ends_at + lead AS quiet_until,
       lease_ends_at > clock_timestamp() AS on_the_wire,
       lease_ends_at + lead > clock_timestamp() AS quiet
  FROM (SELECT (e.detail->>'resend')::int AS resend, e.actor,
               (e.detail->>'lead_seconds')::float8 * interval '1 second' AS lead,
               least(coalesce((e.detail->>'on_the_wire_until')::timestamptz,
                              e.at + (e.detail->>'lead_seconds')::float8 * interval '1 second'),
                     coalesce((SELECT min(a.at) FROM tool_execution_events a
                                WHERE a.key = e.key AND a.id > e.id AND a.kind = 'resend_inconclusive'
                                  AND (a.detail->>'answered')::boolean),
                              'infinity'::timestamptz)) AS lease_ends_at
          FROM tool_execution_events e
         WHERE e.key = $1 AND e.kind = 'resend'
         ORDER BY e.id DESC
         LIMIT 1) latest
"""

# -- operator decisions ---------------------------------------------------------------------------

# Decisions lock the row first, so the check, the change and its event see one state.
SELECT_FOR_DECISION = """
SELECT *, coalesce(lease_expires_at < clock_timestamp(), false) AS owner_gone
  FROM tool_executions WHERE key = $1 FOR UPDATE
"""

APPROVE = """
UPDATE tool_executions
   SET approved_by = $2, approved_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE key = $1 AND status = 'awaiting_approval' AND approved_at IS NULL
RETURNING *
"""

DENY = """
UPDATE tool_executions
   SET status = 'denied', failure_kind = 'denied', settled_at = clock_timestamp(), settled_by = $2,
       reason = $3, updated_at = clock_timestamp()
 WHERE key = $1 AND status = 'awaiting_approval' AND approved_at IS NULL
RETURNING *
"""

# The approved call is dispatched by the reservation that claims it: once, with the approved payload.
CLAIM_APPROVED = """
WITH claimed AS (
    UPDATE tool_executions
       SET status = 'started', owner = $2, lease_expires_at = clock_timestamp() + $4::interval,
           updated_at = clock_timestamp()
     WHERE key = $1 AND status = 'awaiting_approval' AND approved_at IS NOT NULL
       AND payload_sha256 = $3
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
 WHERE key = $1
   AND (status = 'held' OR (status = 'awaiting_approval' AND approved_at IS NOT NULL))
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
 WHERE key = $1 AND status = 'completed'
RETURNING *
"""

# -- conflicts ------------------------------------------------------------------------------------

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
 WHERE key = $1 AND status IN ('completed', 'failed', 'denied', 'compensated')
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
 WHERE key = $1 AND conflict_at IS NOT NULL AND conflict_cleared_at IS NULL
RETURNING *
"""

# -- retention --------------------------------------------------------------------------------------

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

# -- operator tokens ------------------------------------------------------------------------------

INSERT_TOKEN = """
INSERT INTO operator_tokens (id, token_sha256, tenant, operator) VALUES ($1, $2, $3, $4)
RETURNING *
"""

SELECT_ACTIVE_TOKEN = "SELECT * FROM operator_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL"

REVOKE_TOKEN = """
UPDATE operator_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp()) WHERE id = $1
RETURNING *
"""

LIST_TOKENS = """
SELECT * FROM operator_tokens WHERE ($1::text IS NULL OR tenant = $1) ORDER BY created_at, id
"""

# -- conversations (ledger/conversations.py) ------------------------------------------------------

INSERT_CONVERSATION_MESSAGE = """
INSERT INTO conversation_messages (sha256, parent, tenant, run_id, position, message)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (sha256) DO NOTHING
"""

# From the head back to the first message, then in order.
SELECT_CONVERSATION = """
WITH RECURSIVE chain AS (
    SELECT sha256, parent, position, message FROM conversation_messages WHERE sha256 = $1
    UNION ALL
    SELECT m.sha256, m.parent, m.position, m.message
      FROM conversation_messages m JOIN chain c ON m.sha256 = c.parent
)
SELECT position, message FROM chain ORDER BY position
"""

# -- lineage (ledger/lineage.py) ------------------------------------------------------------------

# The family of a call: up the `replaces` links to the first call, then every call that replaces
# one of the family, oldest first. Depth is capped so that a cycle (no path writes one) cannot loop.
LINEAGE = """
WITH RECURSIVE up (key, replaces, depth) AS (
    SELECT key, replaces, 0 FROM tool_executions WHERE key = $1 AND tenant = $2
    UNION ALL
    SELECT t.key, t.replaces, up.depth + 1
      FROM tool_executions t JOIN up ON t.key = up.replaces
     WHERE t.tenant = $2 AND up.depth < 100
), first_call AS (
    SELECT key FROM up ORDER BY depth DESC LIMIT 1
), down (key, depth) AS (
    SELECT key, 0 FROM first_call
    UNION ALL
    SELECT t.key, down.depth + 1
      FROM tool_executions t JOIN down ON t.replaces = down.key
     WHERE t.tenant = $2 AND down.depth < 100
)
SELECT * FROM tool_executions
 WHERE tenant = $2 AND key IN (SELECT key FROM down)
 ORDER BY created_at, key
"""

# The calls held behind $2 (waiting for it to settle). Spelled so that the partial index over
# unresolved rows serves it.
HELD_BEHIND = """
SELECT key FROM tool_executions
 WHERE tenant = $1 AND status = 'held' AND held_by = $2
 ORDER BY created_at, key
 LIMIT $3
"""

# What an entity's budget already carries apart from call $4 ($1 tenant, $2 tool, $3 entity, $5
# toolset, $6 currency): the function the guarded reservation decides with (migration 0010).
ENTITY_BUDGET_USED = """
SELECT completed, unresolved FROM onceflow_budget_used($1, $2, $3, $4, $5, $6)
"""

# -- metrics (ledger/queue.py) --------------------------------------------------------------------

# The operator queue in figures, for the operator API's gauges: per tenant, tool and status, how many
# calls are unresolved, how long the oldest has been in its status, and how many indeterminate ones
# have been unknown longer than their agent's reconcile deadline ($1 agents, $2 their deadlines in
# seconds, $3 the deadline of an agent not listed); open conflicts come back as status 'conflict'.
# A call entered its status at its last event that moved it there (the row's own time otherwise).
QUEUE_FIGURES = """
WITH open AS (
    SELECT t.tenant, t.tool_name, t.status, t.agent,
           coalesce((SELECT max(e.at) FROM tool_execution_events e
                      WHERE e.key = t.key AND e.to_status = t.status), t.created_at) AS since
      FROM tool_executions t
     WHERE t.status IN ('started', 'indeterminate', 'awaiting_approval', 'held')
       AND (t.status <> 'started' OR coalesce(t.lease_expires_at < clock_timestamp(), false))
), deadlines AS (
    SELECT * FROM unnest($1::text[], $2::float8[]) AS d (agent, seconds)
)
SELECT o.tenant, o.tool_name AS tool, o.status, count(*) AS calls,
       extract(epoch FROM clock_timestamp() - min(o.since))::float8 AS oldest_seconds,
       count(*) FILTER (
           WHERE o.status = 'indeterminate'
             AND o.since + make_interval(secs => coalesce(d.seconds, $3::float8)) < clock_timestamp()
       ) AS overdue
  FROM open o LEFT JOIN deadlines d USING (agent)
 GROUP BY o.tenant, o.tool_name, o.status
UNION ALL
SELECT tenant, tool_name, 'conflict', count(*),
       extract(epoch FROM clock_timestamp() - min(conflict_at))::float8, 0
  FROM tool_executions
 WHERE conflict_at IS NOT NULL AND conflict_cleared_at IS NULL
 GROUP BY tenant, tool_name
ORDER BY 1, 2, 3
"""

# When the call entered status $2: its last event that moved it there.
ENTERED_STATUS_AT = """
SELECT max(at) FROM tool_execution_events WHERE key = $1 AND to_status = $2
"""

# -- compensation requests -------------------------------------------------------------------------

# The latest event of one kind under a key (compensation requests and their claims).
LATEST_EVENT_OF_KIND = """
SELECT * FROM tool_execution_events WHERE key = $1 AND kind = $2 ORDER BY id DESC LIMIT 1
"""

# The claim made on one compensation request, if any.
CLAIM_OF_REQUEST = """
SELECT * FROM tool_execution_events
 WHERE key = $1 AND kind = 'compensation_claimed' AND (detail->>'request_event')::bigint = $2
 ORDER BY id LIMIT 1
"""

EVENT_OF_KEY = """
SELECT * FROM tool_execution_events WHERE key = $1 AND id = $2
"""
