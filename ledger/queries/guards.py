"""Guarded reservations (ledger/guards.py, ledger/guarded.py): one server-side function decides."""

# A guarded reservation, whole: locks, checks, write and event in one server-side function
# (definitions/guarded_reserve.sql). $1 the advisory lock names (Guard.locks), then the call, then the
# guard's values, then what the model was told of each heard call ($24, $25), the attempt's
# deadline ($26) and when it began ($27); the answer's extra columns are dropped by to_record.
GUARDED_RESERVE = """
SELECT r.o_outcome AS outcome, r.o_action AS action, r.o_previous_status AS previous_status,
       r.o_previous_updated_at AS previous_updated_at, (r.o_record).*
  FROM onceflow_guarded_reserve($1::text[], $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12,
                                $13::interval, $14, $15, $16, $17, $18::numeric, $19::numeric, $20,
                                $21::text[], $22, $23, $24::text[], $25::timestamptz[],
                                $26::timestamptz, $27::timestamptz) r
"""

# The same call, answered briefly: when the function inserted the call as sent (outcome `new`,
# action `proceed`, no row before it), `record` is NULL and only what the caller cannot know comes
# back (the status, the payload as stored, the amounts, the times); the caller builds the record of
# its own values (ledger/guarded.py, `_inserted`). Any other answer carries the row whole, in
# `record`. Expanding the whole row on every reservation cost more instructions than the intent
# guard itself (docs/benchmarks.md).
GUARDED_RESERVE_BRIEF = """
SELECT r.o_outcome AS outcome, r.o_action AS action, r.o_previous_status AS previous_status,
       r.o_previous_updated_at AS previous_updated_at,
       CASE WHEN r.o_outcome = 'new' AND r.o_action = 'proceed' AND r.o_previous_status IS NULL
            THEN NULL ELSE r.o_record END AS record,
       (r.o_record).status, (r.o_record).payload, (r.o_record).amount, (r.o_record).budget_limit,
       (r.o_record).created_at, (r.o_record).updated_at, (r.o_record).lease_expires_at
  FROM onceflow_guarded_reserve($1::text[], $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12,
                                $13::interval, $14, $15, $16, $17, $18::numeric, $19::numeric, $20,
                                $21::text[], $22, $23, $24::text[], $25::timestamptz[],
                                $26::timestamptz, $27::timestamptz) r
"""

# The same, for a run's first write: $28 the run's first execution claims run id $4 first
# (migrations/0011_claim_with_reservation.sql). The reservation takes its run id from the claim's
# answer, a lateral reference, so the claim is decided before it; a refused claim raises and the
# statement reserves nothing.
GUARDED_RESERVE_CLAIMING = """
SELECT r.o_outcome AS outcome, r.o_action AS action, r.o_previous_status AS previous_status,
       r.o_previous_updated_at AS previous_updated_at, (r.o_record).*
  FROM onceflow_claim_run_id($4, $28, $3, $6) AS claim(run_id)
 CROSS JOIN LATERAL
       onceflow_guarded_reserve($1::text[], $2, $3, claim.run_id, $5, $6, $7, $8, $9::jsonb, $10, $11,
                                $12, $13::interval, $14, $15, $16, $17, $18::numeric, $19::numeric,
                                $20, $21::text[], $22, $23, $24::text[], $25::timestamptz[],
                                $26::timestamptz, $27::timestamptz) r
"""

# What an entity's budget already carries apart from call $4 ($1 tenant, $2 tool, $3 entity, $5
# toolset, $6 currency): the function the guarded reservation decides with (definitions/budget_totals.sql).
ENTITY_BUDGET_USED = """
SELECT completed, unresolved FROM onceflow_budget_used($1, $2, $3, $4, $5, $6)
"""
