-- Budgets read from running totals, not summed over the entity's whole history.
--
-- `onceflow_budget_used` (migration 0010) summed every row of the entity's budget key on every
-- guarded reservation with a budget, so its cost grew with the entity's history. Here a row per
-- budget key (tenant, tool, entity, toolset, currency) carries that sum, kept by triggers on
-- tool_executions in the transaction of each change, and the function reads it: a handful of rows
-- (one per toolset and currency of the entity's tool), less call p_key's own part.
--
-- What counts is unchanged (onceflow_budget_completed and onceflow_budget_unresolved below say it
-- once, for the triggers, the back-fill and the function): a row with an amount, not a reused
-- result, counts its amount as completed when completed, and as unresolved when awaiting approval,
-- started, indeterminate, or failed with an open conflict. Held, denied, compensated and other
-- failed calls draw nothing. A deleted (purged) row keeps its completed amount in the totals, as
-- budget_purged_usage kept it: a purge never refills a budget. budget_purged_usage and its fold
-- (migration 0008) stay as the record of what purges took; nothing reads it for a budget any more.
--
-- Locking: the trigger updates the key's totals row, so that row is locked until the writer
-- commits; writes that change what a budget key carries are serialised per key. The guarded
-- reservation already serialised reservations per entity (its advisory lock is held to commit);
-- what is new is that settling a call (complete, fail, conflicts, operators) waits for the other
-- in-flight writers of the same budget key. No deadlock against the advisory locks: every
-- transaction that writes a totals row writes it last, after its advisory locks and its call's row
-- lock, and waits for nothing afterwards (it inserts its event and commits); no transaction takes
-- an advisory lock after writing a call. A purge deletes only settled calls without an open
-- conflict, which carry nothing unresolved, so it writes no totals row at all. A row moved from one
-- budget key to another writes both keys' rows in one fixed order. (The ledger itself moves only
-- re-decided calls, held or failed without effect, whose old row carries nothing: one row written.)

-- Taken first so that no write lands between the back-fill's snapshot and the triggers.
LOCK TABLE tool_executions IN SHARE ROW EXCLUSIVE MODE;

-- A call's part of its budget key, completed and unresolved. Inlined where used.
CREATE FUNCTION onceflow_budget_completed(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t.amount IS NOT NULL AND t.reused_from IS NULL AND t.status = 'completed'
                THEN t.amount ELSE 0 END
$$;

CREATE FUNCTION onceflow_budget_unresolved(t tool_executions) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN t.amount IS NOT NULL AND t.reused_from IS NULL
                 AND (t.status IN ('awaiting_approval', 'started', 'indeterminate')
                      OR (t.status = 'failed' AND t.conflict_at IS NOT NULL
                          AND t.conflict_cleared_at IS NULL))
                THEN t.amount ELSE 0 END
$$;

-- What each budget key carries: its calls' parts, purged completed calls included. NULL toolset
-- and currency are values of the key (a call without them), so the key is unique with NULLs equal
-- (NULLS NOT DISTINCT: PostgreSQL 15 or later; docker-compose runs 16, the embedded server 18).
CREATE TABLE budget_totals (
    tenant      text NOT NULL,
    tool_name   text NOT NULL,
    entity      text NOT NULL,
    toolset     text,
    currency    text,
    completed   numeric NOT NULL DEFAULT 0 CHECK (completed >= 0),
    unresolved  numeric NOT NULL DEFAULT 0 CHECK (unresolved >= 0),
    CONSTRAINT budget_totals_key UNIQUE NULLS NOT DISTINCT (tenant, tool_name, entity, toolset, currency)
);

-- Add a change to one key's totals. A key's row is made by its first amount; a change that takes
-- something away finds the row its amount was added to (the CHECKs refuse anything else).
CREATE FUNCTION budget_totals_add(
    p_tenant text, p_tool_name text, p_entity text, p_toolset text, p_currency text,
    p_completed numeric, p_unresolved numeric
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE budget_totals b
       SET completed = b.completed + p_completed, unresolved = b.unresolved + p_unresolved
     WHERE b.tenant = p_tenant AND b.tool_name = p_tool_name AND b.entity = p_entity
       AND b.toolset IS NOT DISTINCT FROM p_toolset AND b.currency IS NOT DISTINCT FROM p_currency;
    IF NOT FOUND THEN
        INSERT INTO budget_totals AS b (tenant, tool_name, entity, toolset, currency, completed, unresolved)
        VALUES (p_tenant, p_tool_name, p_entity, p_toolset, p_currency, p_completed, p_unresolved)
        ON CONFLICT ON CONSTRAINT budget_totals_key DO UPDATE
            SET completed = b.completed + EXCLUDED.completed,
                unresolved = b.unresolved + EXCLUDED.unresolved;
    END IF;
END;
$$;

-- The difference between the old row's part and the new row's. Fired only for rows with an
-- amount (the triggers' WHEN clauses), so calls without a budget cost nothing here.
CREATE FUNCTION tool_executions_budget_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_old_c numeric := 0;
    v_old_u numeric := 0;
    v_new_c numeric := 0;
    v_new_u numeric := 0;
    v_row   tool_executions;   -- whose budget key changes, when only one does
    v_old_first boolean;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        -- A deleted call keeps its completed amount: only what was unresolved leaves the budget.
        v_old_c := CASE WHEN TG_OP = 'DELETE' THEN 0 ELSE onceflow_budget_completed(OLD) END;
        v_old_u := onceflow_budget_unresolved(OLD);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new_c := onceflow_budget_completed(NEW);
        v_new_u := onceflow_budget_unresolved(NEW);
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
        IF v_old_first AND (v_old_c <> 0 OR v_old_u <> 0) THEN
            PERFORM budget_totals_add(OLD.tenant, OLD.tool_name, OLD.entity, OLD.toolset, OLD.currency,
                                      -v_old_c, -v_old_u);
        END IF;
        IF v_new_c <> 0 OR v_new_u <> 0 THEN
            PERFORM budget_totals_add(NEW.tenant, NEW.tool_name, NEW.entity, NEW.toolset, NEW.currency,
                                      v_new_c, v_new_u);
        END IF;
        IF NOT v_old_first AND (v_old_c <> 0 OR v_old_u <> 0) THEN
            PERFORM budget_totals_add(OLD.tenant, OLD.tool_name, OLD.entity, OLD.toolset, OLD.currency,
                                      -v_old_c, -v_old_u);
        END IF;
        RETURN NULL;
    END IF;
    IF v_old_c = v_new_c AND v_old_u = v_new_u THEN
        RETURN NULL;  -- the row changed, not what it draws (a time, the owner, a purged settled call)
    END IF;

    -- One key (the common case, spelled out rather than a call of budget_totals_add): its row
    -- exists when the old row counted, and is made when only the new one does.
    v_row := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    UPDATE budget_totals b
       SET completed = b.completed + (v_new_c - v_old_c), unresolved = b.unresolved + (v_new_u - v_old_u)
     WHERE b.tenant = v_row.tenant AND b.tool_name = v_row.tool_name AND b.entity = v_row.entity
       AND b.toolset IS NOT DISTINCT FROM v_row.toolset AND b.currency IS NOT DISTINCT FROM v_row.currency;
    IF NOT FOUND THEN
        PERFORM budget_totals_add(v_row.tenant, v_row.tool_name, v_row.entity, v_row.toolset,
                                  v_row.currency, v_new_c - v_old_c, v_new_u - v_old_u);
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
INSERT INTO budget_totals (tenant, tool_name, entity, toolset, currency, completed, unresolved)
SELECT s.tenant, s.tool_name, s.entity, s.toolset, s.currency, sum(s.completed), sum(s.unresolved)
  FROM (SELECT t.tenant, t.tool_name, t.entity, t.toolset, t.currency,
               onceflow_budget_completed(t) AS completed, onceflow_budget_unresolved(t) AS unresolved
          FROM tool_executions t
         WHERE t.amount IS NOT NULL
        UNION ALL
        SELECT u.tenant, u.tool_name, u.entity, nullif(u.toolset, ''), nullif(u.currency, ''),
               u.completed, 0
          FROM budget_purged_usage u) s
 GROUP BY s.tenant, s.tool_name, s.entity, s.toolset, s.currency
HAVING sum(s.completed) <> 0 OR sum(s.unresolved) <> 0;

-- Same signature and answers as migration 0010's: what the entity's budget carries apart from call
-- p_key. The totals of every key the call's budget meets (a row or caller without a toolset meets
-- every toolset's tool), less p_key's own part when it is one of them.
CREATE OR REPLACE FUNCTION onceflow_budget_used(
    p_tenant text, p_tool_name text, p_entity text, p_key text, p_toolset text, p_currency text,
    OUT completed numeric, OUT unresolved numeric
) LANGUAGE sql STABLE AS $$
    WITH own AS (
        SELECT onceflow_budget_completed(t) AS completed, onceflow_budget_unresolved(t) AS unresolved
          FROM tool_executions t
         WHERE t.key = p_key AND t.tenant = p_tenant AND t.tool_name = p_tool_name
           AND t.entity = p_entity
           AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
           AND t.currency IS NOT DISTINCT FROM p_currency
    )
    SELECT coalesce(sum(b.completed), 0) - coalesce((SELECT o.completed FROM own o), 0),
           coalesce(sum(b.unresolved), 0) - coalesce((SELECT o.unresolved FROM own o), 0)
      FROM budget_totals b
     WHERE b.tenant = p_tenant AND b.tool_name = p_tool_name AND b.entity = p_entity
       AND (b.toolset IS NULL OR p_toolset IS NULL OR b.toolset = p_toolset)
       AND b.currency IS NOT DISTINCT FROM p_currency
$$;
