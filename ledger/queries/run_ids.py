"""Run ids, claimed once (ledger/run_ids.py)."""

# Claim a run id for an execution, or read who holds it; one row back either way (empty only when a
# claim committed between the two halves: read again).
CLAIM_RUN_ID = """
WITH claimed AS (
    INSERT INTO run_ids (run_id, execution, tenant, agent) VALUES ($1, $2, $3, $4)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING execution, tenant, claimed_at
)
SELECT execution, tenant, claimed_at FROM claimed
UNION ALL
SELECT execution, tenant, claimed_at FROM run_ids
 WHERE run_id = $1 AND NOT EXISTS (SELECT 1 FROM claimed)
"""
