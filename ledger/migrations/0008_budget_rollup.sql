-- Releases, and budgets that a retention purge does not refill.

-- `released`: an operator released a call that was never sent (held, or approved and not yet
-- claimed). Final like the two refusals: the key is never reserved again.
ALTER TABLE tool_executions
    DROP CONSTRAINT tool_executions_failure_kind_check,
    ADD CONSTRAINT tool_executions_failure_kind_check
        CHECK (failure_kind IN ('not_attempted', 'rejected', 'not_applied', 'denied',
                                'policy_refused', 'guard_refused', 'released'));

-- What purged calls had drawn on their entity's budget. A budget is the entity's whole history:
-- ENTITY_BUDGET_USED (ledger/queries.py) adds this to the live rows, so deleting a completed call
-- does not give its amount back. Only the delete trigger below writes here; nothing deletes.
-- Keyed as a budget is (migration 0007): a toolset's tool and a currency; '' stands for none.
CREATE TABLE budget_purged_usage (
    tenant      text NOT NULL,
    toolset     text NOT NULL DEFAULT '',
    tool_name   text NOT NULL,
    entity      text NOT NULL,
    currency    text NOT NULL DEFAULT '',
    completed   numeric NOT NULL DEFAULT 0 CHECK (completed >= 0),
    calls       bigint NOT NULL DEFAULT 0 CHECK (calls >= 0),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, toolset, tool_name, entity, currency)
);

-- Folded in by the database itself, in the purge's own transaction, so no path that deletes a call
-- can skip it. Counted as ENTITY_BUDGET_USED counts a completed call: with an amount, not a reused
-- result. (A purge takes only settled calls without an open conflict; of those only completed ones
-- draw on a budget.)
CREATE FUNCTION tool_executions_fold_budget() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'completed' AND OLD.amount IS NOT NULL AND OLD.entity IS NOT NULL
       AND OLD.reused_from IS NULL THEN
        INSERT INTO budget_purged_usage AS u (tenant, toolset, tool_name, entity, currency, completed, calls)
        VALUES (OLD.tenant, coalesce(OLD.toolset, ''), OLD.tool_name, OLD.entity, coalesce(OLD.currency, ''),
                OLD.amount, 1)
        ON CONFLICT (tenant, toolset, tool_name, entity, currency) DO UPDATE
            SET completed = u.completed + EXCLUDED.completed, calls = u.calls + 1,
                updated_at = clock_timestamp();
    END IF;
    RETURN OLD;
END;
$$;

CREATE TRIGGER tool_executions_fold_budget
    AFTER DELETE ON tool_executions
    FOR EACH ROW EXECUTE FUNCTION tool_executions_fold_budget();

CREATE FUNCTION budget_purged_usage_no_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'budget_purged_usage is never deleted from (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER budget_purged_usage_no_delete
    BEFORE DELETE OR TRUNCATE ON budget_purged_usage
    FOR EACH STATEMENT EXECUTE FUNCTION budget_purged_usage_no_delete();
