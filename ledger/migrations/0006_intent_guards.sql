-- Intent guards: a key stops the runtime from repeating a call; these stop the model (and other
-- runs) from making the same effect again under a new key. See ledger/guards.py.

-- `held`: recorded, not sent, waiting for another call to settle (same intent, or same entity).
-- Two final failures: the receiver refused on policy grounds, or a guard of the ledger refused the
-- call before anything was sent. Neither is ever re-reserved under its key.
ALTER TABLE tool_executions
    DROP CONSTRAINT tool_executions_status_check,
    ADD CONSTRAINT tool_executions_status_check
        CHECK (status IN ('awaiting_approval', 'held', 'started', 'completed', 'failed',
                          'indeterminate', 'denied', 'compensated')),
    DROP CONSTRAINT tool_executions_failure_kind_check,
    ADD CONSTRAINT tool_executions_failure_kind_check
        CHECK (failure_kind IN ('not_attempted', 'rejected', 'not_applied', 'denied',
                                'policy_refused', 'guard_refused'));

ALTER TABLE tool_executions
    -- The business entity the call acts on (the value of the tool's declared entity argument), and
    -- whether at most one unresolved call per tenant, tool and entity may exist.
    ADD COLUMN entity            text,
    ADD COLUMN entity_exclusive  boolean NOT NULL DEFAULT false,
    -- The amount the call draws on its entity's budget, and the limit it was checked against.
    ADD COLUMN amount            numeric,
    ADD COLUMN budget_limit      numeric,
    -- Lineage: the key of the call this one replaces (same run, same tool).
    ADD COLUMN replaces          text,
    -- Held: which call it waits for, and why.
    ADD COLUMN held_by           text,
    ADD COLUMN hold_reason       text,
    -- Reused: a same-intent call whose recorded result this call was given; nothing was sent.
    ADD COLUMN reused_from       text,
    ADD CONSTRAINT exclusive_needs_entity CHECK (NOT entity_exclusive OR entity IS NOT NULL),
    ADD CONSTRAINT amount_needs_entity CHECK (amount IS NULL OR entity IS NOT NULL),
    ADD CONSTRAINT amount_not_negative CHECK (amount IS NULL OR amount >= 0),
    ADD CONSTRAINT held_names_blocker CHECK ((status = 'held') = (held_by IS NOT NULL)),
    ADD CONSTRAINT reused_is_completed CHECK (reused_from IS NULL OR status = 'completed');

-- The entity guard, enforced by the database itself: two unresolved calls for one exclusive entity
-- cannot both exist, whatever path wrote them. `held` is not in the set: a held call waits.
CREATE UNIQUE INDEX tool_executions_one_unresolved_per_entity
    ON tool_executions (tenant, tool_name, entity)
    WHERE entity_exclusive AND status IN ('awaiting_approval', 'started', 'indeterminate');

-- Budgets sum an entity's amounts; the intent guard looks for the same payload in the same run.
CREATE INDEX tool_executions_entity ON tool_executions (tenant, tool_name, entity)
    WHERE entity IS NOT NULL;
CREATE INDEX tool_executions_intent ON tool_executions (run_id, payload_sha256);
CREATE INDEX tool_executions_replaces ON tool_executions (replaces) WHERE replaces IS NOT NULL;
-- The calls held behind a call: woken when it is settled, and shown on its record.
CREATE INDEX tool_executions_held_by ON tool_executions (held_by) WHERE status = 'held';

-- The operator's queue now holds held calls too.
DROP INDEX tool_executions_unresolved;
CREATE INDEX tool_executions_unresolved
    ON tool_executions (tenant, created_at, key)
    WHERE status IN ('started', 'indeterminate', 'awaiting_approval', 'held');

-- Guard decisions (held, released, reused, refused) are events of their own source.
ALTER TABLE tool_execution_events
    DROP CONSTRAINT tool_execution_events_source_check,
    ADD CONSTRAINT tool_execution_events_source_check
        CHECK (source IN ('owner', 'inspector', 'signal', 'update', 'api', 'reconciler',
                          'deadline', 'compensation', 'guard', 'unrecorded'));
