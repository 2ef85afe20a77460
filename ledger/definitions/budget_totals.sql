-- The budget totals: what a call draws on its budget key, the running total per key that triggers
-- on tool_executions keep in the transaction of every write that changes one (budget_totals), and
-- what the guarded reservation reads of it (onceflow_budget_used).
--
-- A definition, not history: ledger/migrate.py applies this file after the numbered migrations
-- whenever its text changes (recorded by checksum in onceflow_definitions), in one transaction.
-- Migrations 0013, 0014 and 0019 hold the versions before it; the tables stay in numbered
-- migrations. tests/test_budget_totals.py holds every total to the full sum over random histories.
--
-- What a call draws, said once (onceflow_budget_draws): its amount when it is not a reused result and
-- is awaiting approval, started, indeterminate, completed, or failed with an open conflict;
-- otherwise nothing. A purged call keeps its completed amount in its key's total.

-- What a call draws on its budget key, from the columns the rule reads.
CREATE OR REPLACE FUNCTION onceflow_budget_draws(
    p_status text, p_amount numeric, p_reused_from text, p_conflict_at timestamptz,
    p_conflict_cleared_at timestamptz
) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_amount IS NOT NULL AND p_reused_from IS NULL
                 AND (p_status IN ('awaiting_approval', 'started', 'indeterminate', 'completed')
                      OR (p_status = 'failed' AND p_conflict_at IS NOT NULL
                          AND p_conflict_cleared_at IS NULL))
                THEN p_amount ELSE 0 END
$$;

-- The same, for a whole row (as the queries use it).
CREATE OR REPLACE FUNCTION onceflow_budget_carried(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT onceflow_budget_draws(t.status, t.amount, t.reused_from, t.conflict_at, t.conflict_cleared_at)
$$;

-- The part of it nobody can yet rule out: what a deleted call takes out of its key's total.
CREATE OR REPLACE FUNCTION onceflow_budget_unresolved(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t.amount IS NOT NULL AND t.reused_from IS NULL
                 AND (t.status IN ('awaiting_approval', 'started', 'indeterminate')
                      OR (t.status = 'failed' AND t.conflict_at IS NOT NULL
                          AND t.conflict_cleared_at IS NULL))
                THEN t.amount ELSE 0 END
$$;

-- Add a change to one key's total. A key's row is made by its first amount; a change that takes
-- something away finds the row its amount was added to (the CHECK refuses anything else).
CREATE OR REPLACE FUNCTION budget_totals_add(
    p_tenant text, p_tool_name text, p_entity text, p_toolset text, p_currency text, p_change numeric
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE budget_totals b SET carried = b.carried + p_change
     WHERE b.tenant = p_tenant AND b.tool_name = p_tool_name AND b.entity = p_entity
       AND b.toolset IS NOT DISTINCT FROM p_toolset AND b.currency IS NOT DISTINCT FROM p_currency;
    IF NOT FOUND THEN
        INSERT INTO budget_totals AS b (tenant, tool_name, entity, toolset, currency, carried)
        VALUES (p_tenant, p_tool_name, p_entity, p_toolset, p_currency, p_change)
        ON CONFLICT ON CONSTRAINT budget_totals_key DO UPDATE SET carried = b.carried + EXCLUDED.carried;
    END IF;
END;
$$;

-- What the entity's budget carries apart from call p_key: the totals of every key the call's budget
-- meets (a row or caller without a toolset meets every toolset's tool) less p_key's own amount, and
-- the unresolved part from the unresolved calls alone (a partial index). A set-returning function
-- of one row, so that it is inlined into the reservation's statement and planned with it.
CREATE OR REPLACE FUNCTION onceflow_budget_used(
    p_tenant text, p_tool_name text, p_entity text, p_key text, p_toolset text, p_currency text
) RETURNS TABLE (completed numeric, unresolved numeric)
LANGUAGE sql STABLE ROWS 1 AS $$
    WITH carried AS (
        SELECT coalesce(sum(b.carried), 0)
               -- p_key's row by its key alone (the tests on it are not the WHERE clause, so that no
               -- plan reaches it through the entity's index, along the whole history)
               - coalesce((SELECT CASE WHEN t.tenant = p_tenant AND t.tool_name = p_tool_name
                                        AND t.entity = p_entity
                                        AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
                                        AND t.currency IS NOT DISTINCT FROM p_currency
                                       THEN onceflow_budget_carried(t) ELSE 0 END
                             FROM tool_executions t WHERE t.key = p_key), 0) AS amount
          FROM budget_totals b
         WHERE b.tenant = p_tenant AND b.tool_name = p_tool_name AND b.entity = p_entity
           AND (b.toolset IS NULL OR p_toolset IS NULL OR b.toolset = p_toolset)
           AND b.currency IS NOT DISTINCT FROM p_currency
    ), unresolved AS (
        SELECT coalesce(sum(t.amount), 0) AS amount
          FROM tool_executions t
         WHERE t.tenant = p_tenant AND t.tool_name = p_tool_name AND t.entity = p_entity
           AND t.key <> p_key
           AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
           AND t.currency IS NOT DISTINCT FROM p_currency
           AND t.amount IS NOT NULL AND t.reused_from IS NULL
           AND (t.status IN ('awaiting_approval', 'started', 'indeterminate')
                OR (t.status = 'failed' AND t.conflict_at IS NOT NULL AND t.conflict_cleared_at IS NULL))
    )
    SELECT c.amount - u.amount, u.amount FROM carried c, unresolved u
$$;

-- An inserted call's amount joins its key's total: one statement (a PL/pgSQL call or IF would be
-- prepared again in every transaction). The fields are passed one by one, not the row, which would be
-- copied, payload and all, to be read.
CREATE OR REPLACE FUNCTION tool_executions_budget_totals_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO budget_totals AS b (tenant, tool_name, entity, toolset, currency, carried)
    SELECT NEW.tenant, NEW.tool_name, NEW.entity, NEW.toolset, NEW.currency, d.draws
      FROM (SELECT onceflow_budget_draws(NEW.status, NEW.amount, NEW.reused_from, NEW.conflict_at,
                                         NEW.conflict_cleared_at) AS draws) d
     WHERE d.draws <> 0
    ON CONFLICT ON CONSTRAINT budget_totals_key DO UPDATE SET carried = b.carried + EXCLUDED.carried;
    RETURN NULL;
END;
$$;

-- Updates and deletes. First one test of the common case, narrower than the rule: a row that drew
-- its amount before (not reused) and draws the same amount after on the same budget key (a
-- completion, a dispatch, an unknown outcome, a lease renewed) changes no total. Every other change is
-- worked out in full.
CREATE OR REPLACE FUNCTION tool_executions_budget_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old numeric := 0;
    v_new numeric := 0;
    v_old_first boolean;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.amount = OLD.amount
       AND OLD.status IN ('awaiting_approval', 'started', 'indeterminate') AND OLD.reused_from IS NULL
       AND NEW.status IN ('started', 'indeterminate', 'completed') AND NEW.reused_from IS NULL
       AND NEW.entity = OLD.entity AND NEW.tenant = OLD.tenant AND NEW.tool_name = OLD.tool_name
       AND NEW.toolset IS NOT DISTINCT FROM OLD.toolset AND NEW.currency IS NOT DISTINCT FROM OLD.currency THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        v_old := onceflow_budget_carried(OLD);
        v_new := onceflow_budget_carried(NEW);
    ELSE
        -- A deleted call keeps its completed amount: only what was unresolved leaves the total.
        v_old := onceflow_budget_unresolved(OLD);
    END IF;
    IF TG_OP = 'UPDATE' AND NOT (
           OLD.tenant = NEW.tenant AND OLD.tool_name = NEW.tool_name
           AND OLD.entity IS NOT DISTINCT FROM NEW.entity AND OLD.toolset IS NOT DISTINCT FROM NEW.toolset
           AND OLD.currency IS NOT DISTINCT FROM NEW.currency) THEN
        -- Moved to another budget key: both keys' rows, in one order (0014).
        v_old_first := (OLD.tenant, OLD.tool_name, coalesce(OLD.entity, ''), coalesce(OLD.toolset, ''),
                        coalesce(OLD.currency, ''))
                    <= (NEW.tenant, NEW.tool_name, coalesce(NEW.entity, ''), coalesce(NEW.toolset, ''),
                        coalesce(NEW.currency, ''));
        IF v_old_first AND v_old <> 0 THEN
            PERFORM budget_totals_add(OLD.tenant, OLD.tool_name, OLD.entity, OLD.toolset, OLD.currency, -v_old);
        END IF;
        IF v_new <> 0 THEN
            PERFORM budget_totals_add(NEW.tenant, NEW.tool_name, NEW.entity, NEW.toolset, NEW.currency, v_new);
        END IF;
        IF NOT v_old_first AND v_old <> 0 THEN
            PERFORM budget_totals_add(OLD.tenant, OLD.tool_name, OLD.entity, OLD.toolset, OLD.currency, -v_old);
        END IF;
    ELSIF TG_OP = 'DELETE' THEN
        IF v_old <> 0 THEN  -- never for a purge: it deletes no unresolved call
            PERFORM budget_totals_add(OLD.tenant, OLD.tool_name, OLD.entity, OLD.toolset, OLD.currency, -v_old);
        END IF;
    ELSIF v_new <> v_old THEN
        -- One key: its row exists when the old row drew something, and is made when only the new
        -- one does.
        UPDATE budget_totals b SET carried = b.carried + (v_new - v_old)
         WHERE b.tenant = NEW.tenant AND b.tool_name = NEW.tool_name AND b.entity = NEW.entity
           AND b.toolset IS NOT DISTINCT FROM NEW.toolset AND b.currency IS NOT DISTINCT FROM NEW.currency;
        IF NOT FOUND THEN
            PERFORM budget_totals_add(NEW.tenant, NEW.tool_name, NEW.entity, NEW.toolset, NEW.currency,
                                      v_new - v_old);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tool_executions_budget_totals_insert
    AFTER INSERT ON tool_executions
    FOR EACH ROW WHEN (NEW.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals_insert();

CREATE OR REPLACE TRIGGER tool_executions_budget_totals_update
    AFTER UPDATE ON tool_executions
    FOR EACH ROW WHEN (OLD.amount IS NOT NULL OR NEW.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals();

CREATE OR REPLACE TRIGGER tool_executions_budget_totals_delete
    AFTER DELETE ON tool_executions
    FOR EACH ROW WHEN (OLD.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals();
