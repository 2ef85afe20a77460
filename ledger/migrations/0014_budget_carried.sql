-- One carried amount per budget key, so that completing a call writes no totals row.
--
-- Migration 0013 kept a key's completed and unresolved amounts apart, so a completion (which moves
-- its amount from one to the other) updated the key's row and held it locked to commit: every
-- completion of an entity waited for the one before it (on one hot entity at c=8, 386 cycles/s
-- here against 552 to 567). Here the row carries both together, which a completion does not change;
-- the unresolved part is summed over the entity's unresolved calls alone (a partial index: as many
-- as are in flight or wait for someone, whatever the history), and completed is the rest. The
-- function keeps its signature and answers.
--
-- What counts is unchanged (onceflow_budget_carried and onceflow_budget_unresolved say it once): a
-- row with an amount, not a reused result, draws its amount when completed (completed) or awaiting
-- approval, started, indeterminate, or failed with an open conflict (unresolved). Held, denied,
-- compensated and other failed calls draw nothing. A deleted (purged) row keeps its completed amount
-- in the total: a purge never refills a budget. budget_purged_usage and its fold (migration 0008)
-- stay as the record of what purges took; nothing reads it for a budget.
--
-- A reservation adds its amount while it holds the entity's advisory lock; what else changes a
-- total (a failure without effect, a conflict opened or acknowledged, a compensation, a release, a
-- denial, an unguarded retry) writes it.
--
-- Locking: a write that changes a total locks the key's row until it commits, so those writes are
-- serialised per budget key. Reservations of an entity already were (the advisory lock is held to
-- commit); a failure, conflict or operator decision waits for an in-flight writer of the same key,
-- and a reservation for them. No deadlock against the advisory locks: every transaction that writes
-- a totals row writes it last (after its advisory locks and its call's row lock) and then only
-- inserts its event and commits; none takes an advisory lock after writing a call. A purge deletes
-- only settled calls without an open conflict, which keep their amount in the total: it writes no
-- totals row. A row moved from one budget key to another writes both keys' rows in one fixed order.
-- (The ledger itself moves only re-decided calls, held or failed without effect, whose old row
-- draws nothing: one row written.)

-- Taken first so that no write lands between the back-fill's snapshot and the triggers.
LOCK TABLE tool_executions IN SHARE ROW EXCLUSIVE MODE;

-- 0013's triggers, their function and its table go; the table is rebuilt from the rows below.
DROP TRIGGER tool_executions_budget_totals_insert ON tool_executions;
DROP TRIGGER tool_executions_budget_totals_update ON tool_executions;
DROP TRIGGER tool_executions_budget_totals_delete ON tool_executions;
DROP FUNCTION tool_executions_budget_totals();
DROP FUNCTION budget_totals_add(text, text, text, text, text, numeric, numeric);
DROP TABLE budget_totals;

-- What a call draws on its budget key: completed and unresolved together, and the unresolved part.
-- Inlined where used.
CREATE FUNCTION onceflow_budget_carried(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t.amount IS NOT NULL AND t.reused_from IS NULL
                 AND (t.status IN ('awaiting_approval', 'started', 'indeterminate', 'completed')
                      OR (t.status = 'failed' AND t.conflict_at IS NOT NULL
                          AND t.conflict_cleared_at IS NULL))
                THEN t.amount ELSE 0 END
$$;

CREATE OR REPLACE FUNCTION onceflow_budget_unresolved(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t.amount IS NOT NULL AND t.reused_from IS NULL
                 AND (t.status IN ('awaiting_approval', 'started', 'indeterminate')
                      OR (t.status = 'failed' AND t.conflict_at IS NOT NULL
                          AND t.conflict_cleared_at IS NULL))
                THEN t.amount ELSE 0 END
$$;

-- The calls whose amount is unresolved, per entity's tool: what the function sums for that part.
-- Its predicate is onceflow_budget_unresolved's, spelled out (a partial index needs it literally).
CREATE INDEX tool_executions_budget_unresolved ON tool_executions (tenant, tool_name, entity)
    WHERE amount IS NOT NULL AND reused_from IS NULL
      AND (status IN ('awaiting_approval', 'started', 'indeterminate')
           OR (status = 'failed' AND conflict_at IS NOT NULL AND conflict_cleared_at IS NULL));

-- What each budget key carries: its calls' amounts, completed or unresolved, purged completed calls
-- included. NULL toolset and currency are values of the key (a call without them), so the key is
-- unique with NULLs equal (NULLS NOT DISTINCT: PostgreSQL 15 or later; docker-compose runs 16, the
-- embedded server 18).
CREATE TABLE budget_totals (
    tenant      text NOT NULL,
    tool_name   text NOT NULL,
    entity      text NOT NULL,
    toolset     text,
    currency    text,
    carried     numeric NOT NULL DEFAULT 0 CHECK (carried >= 0),
    CONSTRAINT budget_totals_key UNIQUE NULLS NOT DISTINCT (tenant, tool_name, entity, toolset, currency)
);

-- Add a change to one key's total. A key's row is made by its first amount; a change that takes
-- something away finds the row its amount was added to (the CHECK refuses anything else).
CREATE FUNCTION budget_totals_add(
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

-- The difference between what the old row drew and what the new one draws, written only when
-- there is one: a completion, a dispatch, a purge find none and return. Called for rows with an
-- amount only (the WHEN clauses: a call without a budget costs nothing here). The WHEN clauses stay
-- that simple because PostgreSQL prepares a trigger's WHEN for every statement, where PL/pgSQL
-- keeps its plans: the whole rule in the WHEN cost more per completion than this function does.
CREATE FUNCTION tool_executions_budget_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old numeric := 0;
    v_new numeric := 0;
    v_old_first boolean;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_old := onceflow_budget_carried(OLD);
    ELSIF TG_OP = 'DELETE' THEN
        -- A deleted call keeps its completed amount: only what was unresolved leaves the total.
        v_old := onceflow_budget_unresolved(OLD);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := onceflow_budget_carried(NEW);
    END IF;
    IF TG_OP = 'UPDATE' AND NOT (
           OLD.tenant = NEW.tenant AND OLD.tool_name = NEW.tool_name
           AND OLD.entity IS NOT DISTINCT FROM NEW.entity AND OLD.toolset IS NOT DISTINCT FROM NEW.toolset
           AND OLD.currency IS NOT DISTINCT FROM NEW.currency) THEN
        -- Moved to another budget key (a re-decided call declared with another entity, toolset or
        -- currency): both keys' rows, in one order, so two such moves cannot wait for each other.
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
        -- One key (the common case, spelled out rather than a call of budget_totals_add): its row
        -- exists when the old row drew something, and is made when only the new one does.
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

CREATE TRIGGER tool_executions_budget_totals_insert
    AFTER INSERT ON tool_executions
    FOR EACH ROW WHEN (NEW.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals();

CREATE TRIGGER tool_executions_budget_totals_update
    AFTER UPDATE ON tool_executions
    FOR EACH ROW WHEN (OLD.amount IS NOT NULL OR NEW.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals();

CREATE TRIGGER tool_executions_budget_totals_delete
    AFTER DELETE ON tool_executions
    FOR EACH ROW WHEN (OLD.amount IS NOT NULL)
    EXECUTE FUNCTION tool_executions_budget_totals();

-- The totals of the rows there are, and of those purges took (budget_purged_usage writes '' for
-- none; here a call without a toolset or currency is NULL, as on the row).
INSERT INTO budget_totals (tenant, tool_name, entity, toolset, currency, carried)
SELECT s.tenant, s.tool_name, s.entity, s.toolset, s.currency, sum(s.carried)
  FROM (SELECT t.tenant, t.tool_name, t.entity, t.toolset, t.currency, onceflow_budget_carried(t) AS carried
          FROM tool_executions t
         WHERE t.amount IS NOT NULL
        UNION ALL
        SELECT u.tenant, u.tool_name, u.entity, nullif(u.toolset, ''), nullif(u.currency, ''), u.completed
          FROM budget_purged_usage u) s
 GROUP BY s.tenant, s.tool_name, s.entity, s.toolset, s.currency
HAVING sum(s.carried) <> 0;

-- Same signature and answers as migrations 0010 and 0013: what the entity's budget carries apart from call
-- p_key. The totals of every key the call's budget meets (a row or caller without a toolset meets
-- every toolset's tool) less p_key's own amount, and the unresolved part from the unresolved calls
-- other than p_key; completed is the rest.
CREATE OR REPLACE FUNCTION onceflow_budget_used(
    p_tenant text, p_tool_name text, p_entity text, p_key text, p_toolset text, p_currency text,
    OUT completed numeric, OUT unresolved numeric
) LANGUAGE sql STABLE AS $$
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

-- 0013's part for completed calls alone: nothing uses it now.
DROP FUNCTION onceflow_budget_completed(tool_executions);
