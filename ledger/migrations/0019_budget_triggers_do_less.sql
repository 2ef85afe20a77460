-- The budget totals' triggers (migration 0014) do less on the calls that change nothing.
--
-- PL/pgSQL prepares each expression of a function again in every transaction that runs it, and
-- each ledger write is a transaction of its own: measured in instructions (callgrind, one backend,
-- docs/benchmarks.md "Issue 22, eighth pass"), 0014's trigger cost a budgeted call 131 k on its
-- reservation and 61 k on its completion, of a 2.5 M cycle, mostly in preparing expressions that
-- only find nothing to do. Here:
--   - an inserted call has a trigger function of its own, one statement: add what the row draws to
--     its key's total (made by its first amount), or nothing when it draws nothing;
--   - an update first asks, in one expression, whether the row drew its amount before and draws
--     the same amount after on the same budget key (a completion, a dispatch, an unknown outcome, a
--     resolve, a lease renewed), and returns at once when it does; anything else runs 0014's body.
-- What a row draws is unchanged, and still said once: onceflow_budget_draws over the columns the
-- rule reads; onceflow_budget_carried (a whole row, as the queries use it) now calls it. What
-- counts, and every total, stay what 0014 keeps (tests/test_budget_totals.py holds them to the full
-- sum over a random history of the ledger's operations, and under concurrent writers).

-- What a call draws on its budget key, from the columns the rule reads: its amount when it is not a
-- reused result and is awaiting approval, started, indeterminate, completed, or failed with an
-- open conflict; otherwise nothing.
CREATE FUNCTION onceflow_budget_draws(
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

CREATE OR REPLACE FUNCTION onceflow_budget_carried(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT onceflow_budget_draws(t.status, t.amount, t.reused_from, t.conflict_at, t.conflict_cleared_at)
$$;

-- An inserted call's amount joins its key's total. budget_totals_add's upsert, written out as one
-- statement: its call, and the IF around it, are PL/pgSQL expressions prepared again in every
-- transaction, which is the cost this migration takes away. The fields are passed one by one rather
-- than the row as a whole, which would be copied, payload and all, to be read.
CREATE FUNCTION tool_executions_budget_totals_insert() RETURNS trigger
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

DROP TRIGGER tool_executions_budget_totals_insert ON tool_executions;
CREATE TRIGGER tool_executions_budget_totals_insert
    AFTER INSERT ON tool_executions
    FOR EACH ROW WHEN (NEW.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals_insert();

-- Updates and deletes: 0014's function, for them alone, after one test of the common case. The
-- test is narrower than the rule (an old status that draws whatever the conflict columns say, a new
-- one that draws unless reused), so a row it lets through draws the same amount before and after;
-- every other change is worked out in full below.
CREATE OR REPLACE FUNCTION tool_executions_budget_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old numeric := 0;
    v_new numeric := 0;
    v_old_first boolean;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.amount = OLD.amount
       AND OLD.status IN ('awaiting_approval', 'started', 'indeterminate')
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
