"""How calls relate under the guards (ledger/lineage.py): replacement chains, and who waits for whom."""

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

# The held calls' runs as recorded, not cut out of their keys: a run is found by exact match.
HELD_RUNS_BEHIND = """
SELECT key, run_id FROM tool_executions
 WHERE tenant = $1 AND status = 'held' AND held_by = $2
 ORDER BY created_at, key
"""
