"""Resends within a receiver's dedup window (ledger/resends.py)."""

# The call (locked by SELECT_RECORD_FOR_UPDATE just before, in the same transaction) with the
# database's clock and the window's bounds ($2: the window, $3: the lead a resend needs to arrive
# inside it), and what the reconciler already recorded about resends. The clock is read once, so
# the lease is exactly the check plus the lead.
SELECT_FOR_RESEND = """
SELECT t.*, clock.now AS checked_at,
       clock.now + $3::interval AS on_the_wire_until,
       t.created_at + $2::interval AS window_ends_at,
       t.created_at + $2::interval - $3::interval AS send_by,
       (SELECT count(*) FROM tool_execution_events e
         WHERE e.key = t.key AND e.kind = 'resend') AS resends,
       EXISTS (SELECT 1 FROM tool_execution_events e
                WHERE e.key = t.key AND e.kind = 'resend_window_closed') AS window_closed_noted
  FROM tool_executions t
 CROSS JOIN (SELECT clock_timestamp() AS now) clock
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
