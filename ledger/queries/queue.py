"""The operator's queue: listed, counted and in figures (ledger/reads.py, ledger/queue.py), and when
a call entered its status (the settle metrics)."""

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
