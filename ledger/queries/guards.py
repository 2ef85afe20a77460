"""Guarded reservations (ledger/guards.py, ledger/guarded.py): one server-side function decides."""

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

# What an entity's budget already carries apart from call $4 ($1 tenant, $2 tool, $3 entity, $5
# toolset, $6 currency): the function the guarded reservation decides with (migration 0010).
ENTITY_BUDGET_USED = """
SELECT completed, unresolved FROM onceflow_budget_used($1, $2, $3, $4, $5, $6)
"""
