-- The guarded reservation: onceflow_guarded_reserve and onceflow_guarded_decide, as they are now.
--
-- A definition, not history: ledger/migrate.py applies this file after the numbered migrations
-- whenever its text changes (recorded by checksum in onceflow_definitions), in one transaction. Its
-- history is this file's git log; migrations 0010 to 0018 hold the versions before it.
--
-- onceflow_guarded_reserve (the fast path, since 0018) takes the advisory locks and inserts a call
-- with nothing in its way: no row for its key, no twin, no busy entity, room in its budget, no call
-- it replaces. Every other call goes to onceflow_guarded_decide: one read of the call's row and its
-- twins, then lineage, intent, entity and budget, the write (only over the row version read) and its
-- event. ledger/guarded.py sends it; ledger/guards.py and docs/guards.md describe the rules.
--
-- SQLSTATEs raised (ledger/guarded.py): OF001 bad guard arguments, OF002 another tenant's key, OF004
-- held behind a call settled meanwhile (decide again), OF005 the row changed after it was read
-- (decide again), OF006 the attempt's deadline passed (never reserve).

-- The intent rule, in the order it is decided, for the call's twins (the run's other calls of the
-- same canonical payload). Heard twins are the ones whose outcome the model was told and which
-- still stand as told (onceflow_heard_stands); with intent `reuse`, none is.
--   a. hold behind a twin not heard that was sent or waits for a person, or failed with an open
--      conflict (a reused row was never sent, a held twin holds nothing);
--   b. refuse when any twin was refused on policy grounds;
--   c. reuse the oldest completed twin not heard that no other call reuses yet (a re-issue of two
--      earlier effects gets each one's result, not one of them twice);
--   d. refuse when a twin not heard was compensated (the intent took effect and was undone);
--   e. reuse the oldest completed twin not heard, though another call reuses it already (three
--      identical calls at once: one send, two given its result);
--   f. otherwise send.
-- A reused row (reused_from) is never itself a source in c, d or e: it points to the call that took
-- effect, which is a twin too and is judged as what it is now.

-- Does a twin's outcome stand as the model was told it? `p_told` is what the workflow passed for
-- the twin's tool call id: its status (NULL: an input recorded before outcomes were passed, judged
-- by the status as it stands) and the settlement it came from (settled_at; NULL: status alone).
-- An open conflict means the outcome is in question, so nothing was heard. A reused twin stands
-- only while the call it reused is still completed (p_source_status; NULL when that call is gone).
CREATE OR REPLACE FUNCTION onceflow_heard_stands(
    t tool_executions, p_told_status text, p_told_at timestamptz, p_source_status text
) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT t.status IN ('completed', 'failed', 'denied', 'compensated')
       AND NOT (t.conflict_at IS NOT NULL AND t.conflict_cleared_at IS NULL)
       AND (p_told_status IS NULL
            OR (t.status = p_told_status
                AND (p_told_at IS NULL OR t.settled_at IS NOT DISTINCT FROM p_told_at)))
       AND (t.reused_from IS NULL OR p_source_status IS NULL OR p_source_status = 'completed')
$$;

-- Versions before this file took the heard calls as bare ids and no deadline.
DROP FUNCTION IF EXISTS onceflow_guarded_decide(text[], text, text, text, text, text, text, text, jsonb,
                                               text, text, boolean, interval, text, text, boolean, text,
                                               numeric, numeric, text, text[], text, text);
-- And before it took the attempt's start.
DROP FUNCTION IF EXISTS onceflow_guarded_decide(text[], text, text, text, text, text, text, text, jsonb,
                                               text, text, boolean, interval, text, text, boolean, text,
                                               numeric, numeric, text, text[], text, text, text[],
                                               timestamptz[], timestamptz);

CREATE OR REPLACE FUNCTION onceflow_guarded_decide(
    p_locks        text[],   -- Guard.locks(): the advisory lock names, in the order to take them
    p_key          text,
    p_tenant       text,
    p_run_id       text,
    p_tool_call_id text,
    p_agent        text,
    p_tool_name    text,
    p_side_effect  text,
    p_payload      jsonb,
    p_sha256       text,
    p_owner        text,
    p_approval     boolean,
    p_lease        interval,
    p_intent       text,     -- hold, reuse or allow
    p_entity       text,
    p_exclusive    boolean,
    p_on_busy      text,     -- hold or refuse
    p_amount       numeric,
    p_limit        numeric,
    p_replaces     text,
    p_heard        text[],   -- tool call ids whose settled outcome the model had been told
    p_toolset      text,
    p_currency     text,
    p_heard_status text[],   -- per heard id: the status it was told (NULL: judged as it stands)
    p_heard_at     timestamptz[],  -- per heard id: the settlement it was told (settled_at)
    p_not_after    timestamptz,    -- the attempt's deadline: past it, nothing is reserved
    p_began        timestamptz     -- when the attempt began: it retries no failure settled since
) RETURNS TABLE (
    o_outcome             text,
    o_action              text,
    o_previous_status     text,
    o_previous_updated_at timestamptz,
    o_record              tool_executions
)
LANGUAGE plpgsql AS $$
DECLARE
    v_existing  tool_executions;
    v_found     boolean;
    v_row       tool_executions;
    v_twins     tool_executions[];
    v_twin      tool_executions;
    v_source    tool_executions;
    v_i         integer;
    v_heard     text[] := '{}';    -- keys of the twins heard as they stand (and of what they reused)
    v_reusing   text[] := '{}';    -- keys some twin already reuses
    v_action    text := 'proceed';
    v_reason    text := '';
    v_other     tool_executions;   -- the call held behind (hold) or reused (reuse)
    v_detail    jsonb := '{}';
    v_by        text;
    v_completed numeric;
    v_unres     numeric;
    v_unit      text;
    v_status    text;
    v_outcome   text;
    v_kind      text;
    v_settled   boolean;
    v_held_by   text;
    v_reused    text;
    v_actor     text;              -- the reservation's event: who wrote it, and its kind
    v_event     text;
    v_xmin      xid;               -- the recorded call's row version, read with it and written only if unchanged
BEGIN
    IF cardinality(p_locks) > 0 THEN  -- one statement for them all, in the order given
        PERFORM pg_advisory_xact_lock(hashtextextended(l.lock_name, 0)) FROM unnest(p_locks) AS l(lock_name);
    END IF;
    -- After the locks, which may have been waited for: an attempt whose workflow gave up on it
    -- (and may have run the call again, and told the model how that ended) reserves nothing.
    IF p_not_after IS NOT NULL AND clock_timestamp() > p_not_after THEN
        RAISE EXCEPTION USING ERRCODE = 'OF006',
            MESSAGE = format('%s: the attempt is past its deadline (%s); nothing was reserved', p_key, p_not_after);
    END IF;

    -- The call's own row, if recorded, and its twins, in one read after the locks. The row is not
    -- locked: every write below is made only if the row is still the version read (its xmin), and
    -- otherwise raises OF005, which ledger/guarded.py retries; a key nobody had recorded is
    -- inserted, and a unique violation (the key recorded meanwhile) is retried too. Either way the
    -- call is decided again on what is there. Two index lookups, not one OR: a plan cached while the
    -- table was nearly empty would read an OR by scanning the whole table for good. Intent `allow`
    -- looks for no twins. Twins come newest first.
    SELECT coalesce(array_agg(c.t ORDER BY c.own DESC, (c.t).created_at DESC, (c.t).key DESC), '{}'),
           (array_agg(c.version) FILTER (WHERE c.own))[1]
      INTO v_twins, v_xmin
      FROM (SELECT t, t.xmin AS version, true AS own FROM tool_executions t WHERE t.key = p_key
            UNION ALL
            SELECT t, t.xmin, false FROM tool_executions t
             WHERE p_intent <> 'allow'
               AND t.run_id = p_run_id AND t.payload_sha256 = p_sha256 AND t.key <> p_key) c;
    v_found := v_xmin IS NOT NULL;
    IF v_found THEN
        v_existing := v_twins[1];  -- first in the array; the rest are twins
        v_twins := v_twins[2:];
        IF v_existing.tenant <> p_tenant THEN
            RAISE EXCEPTION USING ERRCODE = 'OF002', MESSAGE = p_key;
        END IF;
        IF v_existing.payload_sha256 <> p_sha256 THEN
            INSERT INTO tool_execution_events (key, actor, kind, source, detail)
            VALUES (p_key, p_owner, 'payload_mismatch_refused', 'owner',
                    jsonb_build_object('offered_sha256', p_sha256, 'offered', p_payload));
            RETURN QUERY SELECT 'payload_mismatch', NULL::text, v_existing.status,
                                v_existing.updated_at, v_existing;
            RETURN;
        END IF;
        -- Decided again only when held, or failed without effect and open to a retry (not final,
        -- never in conflict): onceflow.ledger.guarded.decided_again. Any other row answers for itself.
        -- So does a failure settled after this attempt began: a retry the workflow decides on
        -- begins after it heard the failure, so this attempt is one the workflow gave up on (an
        -- execution a reset replaced), and the failure may be what the model was told since.
        IF NOT (v_existing.status = 'held'
                OR (v_existing.status = 'failed' AND v_existing.conflict_at IS NULL
                    AND coalesce(v_existing.failure_kind, '')
                        NOT IN ('policy_refused', 'guard_refused', 'released')
                    AND (p_began IS NULL OR v_existing.settled_at IS NULL
                         OR v_existing.settled_at < p_began))) THEN
            IF v_existing.status = 'awaiting_approval' AND v_existing.approved_at IS NOT NULL THEN
                UPDATE tool_executions t
                   SET status = 'started', owner = p_owner,
                       lease_expires_at = clock_timestamp() + p_lease, updated_at = clock_timestamp()
                 WHERE t.key = p_key AND t.xmin = v_xmin
                RETURNING t.* INTO v_row;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'OF005', MESSAGE = format('%s changed while it was reserved', p_key);
                END IF;
                INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, detail)
                VALUES (p_key, p_owner, 'dispatched', 'owner', 'awaiting_approval', 'started',
                        jsonb_build_object('approved_by', v_row.approved_by));
                RETURN QUERY SELECT 'new', NULL::text, v_existing.status, v_existing.updated_at, v_row;
                RETURN;
            END IF;
            v_outcome := CASE v_existing.status
                WHEN 'completed' THEN CASE WHEN v_existing.reused_from IS NULL THEN 'completed'
                                           ELSE 'reused' END
                WHEN 'started' THEN 'in_flight'
                WHEN 'indeterminate' THEN 'in_flight'
                WHEN 'awaiting_approval' THEN 'awaiting_approval'
                WHEN 'failed' THEN CASE WHEN v_existing.failure_kind = 'guard_refused' THEN 'refused'
                                        ELSE 'settled' END
                ELSE 'settled' END;
            RETURN QUERY SELECT v_outcome, NULL::text, v_existing.status, v_existing.updated_at, v_existing;
            RETURN;
        END IF;
    END IF;

    -- Lineage: the call it replaces is of this run and tool, settled, and replaced by no other.
    IF p_replaces IS NOT NULL THEN
        SELECT * INTO v_row FROM tool_executions t WHERE t.key = p_replaces;
        IF NOT FOUND OR v_row.tenant <> p_tenant OR v_row.run_id <> p_run_id THEN
            RAISE EXCEPTION USING ERRCODE = 'OF001',
                MESSAGE = format('it replaces %L, which is no call of this run', p_replaces);
        END IF;
        IF v_row.key = p_key THEN
            RAISE EXCEPTION USING ERRCODE = 'OF001', MESSAGE = 'a call cannot replace itself';
        END IF;
        IF v_row.tool_name <> p_tool_name THEN
            RAISE EXCEPTION USING ERRCODE = 'OF001', MESSAGE = format(
                'it replaces %s, a call of %s, not %s', v_row.tool_call_id, v_row.tool_name, p_tool_name);
        END IF;
        IF v_row.status IN ('awaiting_approval', 'held', 'started', 'indeterminate') THEN
            v_action := 'refuse';
            v_reason := format('the call it replaces (%s) is still %s; '
                               'a replacement waits until that one is settled',
                               v_row.tool_call_id, v_row.status);
            v_detail := jsonb_build_object('replaces', v_row.key, 'replaces_status', v_row.status);
        ELSE
            SELECT t.key INTO v_by FROM tool_executions t
             WHERE t.replaces = v_row.key AND t.key <> p_key AND t.status <> 'failed'
             ORDER BY t.created_at LIMIT 1;
            IF FOUND THEN
                v_action := 'refuse';
                v_reason := format('%s was already replaced by %s; replace that one instead',
                                   v_row.tool_call_id, v_by);
                v_detail := jsonb_build_object('replaces', v_row.key, 'replaced_by', v_by);
            END IF;
        END IF;
    END IF;

    -- Intent (the rule in the header, a to f).
    IF v_action = 'proceed' AND p_intent <> 'allow' THEN
        FOREACH v_twin IN ARRAY v_twins LOOP
            IF v_twin.reused_from IS NOT NULL THEN
                v_reusing := v_reusing || v_twin.reused_from;
            END IF;
            v_i := CASE WHEN p_intent = 'hold' THEN array_position(p_heard, v_twin.tool_call_id) END;
            CONTINUE WHEN v_i IS NULL;
            v_source := NULL;
            IF v_twin.reused_from IS NOT NULL THEN
                SELECT s.* INTO v_source FROM unnest(v_twins) s WHERE s.key = v_twin.reused_from;
            END IF;
            IF onceflow_heard_stands(v_twin, p_heard_status[v_i], p_heard_at[v_i], v_source.status) THEN
                v_heard := v_heard || v_twin.key;
                IF v_twin.reused_from IS NOT NULL THEN
                    -- Heard that it was given an earlier call's result: that effect is heard too.
                    v_heard := v_heard || v_twin.reused_from;
                END IF;
            END IF;
        END LOOP;
        -- a. hold
        FOREACH v_twin IN ARRAY v_twins LOOP
            CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.reused_from IS NOT NULL;
            IF v_twin.status IN ('awaiting_approval', 'started', 'indeterminate')
               OR (v_twin.status = 'failed' AND v_twin.conflict_at IS NOT NULL
                   AND v_twin.conflict_cleared_at IS NULL) THEN
                v_action := 'hold';
                v_other := v_twin;
                v_reason := format('the same call (%s) is still %s; this one waits until that one is settled',
                                   v_twin.tool_call_id,
                                   CASE WHEN v_twin.status = 'failed' THEN 'failed with an open conflict'
                                        ELSE v_twin.status END);
                v_detail := jsonb_build_object('same_as', v_twin.key);
                EXIT;
            END IF;
        END LOOP;
        -- b. a policy refusal of the same call stands, heard or not
        IF v_action = 'proceed' THEN
            FOREACH v_twin IN ARRAY v_twins LOOP
                IF v_twin.status = 'failed' AND v_twin.failure_kind = 'policy_refused' THEN
                    v_action := 'refuse';
                    v_reason := format('the same call (%s) was refused by the receiver on policy grounds: %s',
                                       v_twin.tool_call_id, coalesce(v_twin.error, 'None'));
                    v_detail := jsonb_build_object('same_as', v_twin.key);
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        -- c. reuse the oldest effect nobody reuses yet; e. else the oldest effect
        IF v_action = 'proceed' THEN
            FOR v_i IN REVERSE cardinality(v_twins)..1 LOOP
                v_twin := v_twins[v_i];
                CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.reused_from IS NOT NULL
                              OR v_twin.status <> 'completed';
                IF v_other.key IS NULL THEN
                    v_other := v_twin;  -- e, unless c finds one below
                END IF;
                IF NOT v_twin.key = ANY(v_reusing) THEN
                    v_other := v_twin;
                    EXIT;
                END IF;
            END LOOP;
            IF v_other.key IS NOT NULL AND v_other.key = ANY(v_reusing) THEN
                -- d comes before e: an undone effect refuses the repeat before a reused one answers it
                FOREACH v_twin IN ARRAY v_twins LOOP
                    CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.reused_from IS NOT NULL
                                  OR v_twin.status <> 'compensated';
                    v_other := NULL;
                    EXIT;
                END LOOP;
            END IF;
            IF v_other.key IS NOT NULL THEN
                v_action := 'reuse';
                v_reason := CASE WHEN p_intent = 'hold' THEN format(
                    'the same call (%s) already took effect, before you had heard its outcome; this is '
                    'its result, and nothing was sent again. If another one is owed, make the call '
                    'again: now that you know of this one, it will be sent', v_other.tool_call_id)
                    ELSE format('the same call (%s) already completed', v_other.tool_call_id) END;
            END IF;
        END IF;
        -- d. an effect undone by an operator is not made again behind the model's back
        IF v_action = 'proceed' THEN
            FOREACH v_twin IN ARRAY v_twins LOOP
                CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.reused_from IS NOT NULL
                              OR v_twin.status <> 'compensated';
                v_action := 'refuse';
                v_reason := format('the same call (%s) took effect and an operator undid it '
                                   '(compensated); %s', v_twin.tool_call_id,
                                   CASE WHEN p_intent = 'hold'
                                        THEN 'it is not made again without you having heard that'
                                        ELSE 'this tool counts every repeat as the same call, so it '
                                             'is not made again' END);
                v_detail := jsonb_build_object('same_as', v_twin.key);
                EXIT;
            END LOOP;
        END IF;
        IF v_action = 'proceed' AND cardinality(v_heard) > 0 THEN
            -- sent as a new effect because of them: the reservation's event names them
            SELECT jsonb_build_object('heard_twins', jsonb_agg(DISTINCT h.k)) INTO v_detail
              FROM unnest(v_heard) AS h(k);
        END IF;
    END IF;

    -- Entity: at most one unresolved call per tenant, toolset, tool and entity (held calls wait,
    -- so they do not count). A row or caller without a toolset matches every toolset's tool.
    IF v_action = 'proceed' AND p_exclusive THEN
        SELECT * INTO v_row FROM tool_executions t
         WHERE t.tenant = p_tenant AND t.tool_name = p_tool_name AND t.entity = p_entity
           AND t.key <> p_key
           AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
           AND t.status IN ('awaiting_approval', 'started', 'indeterminate')
         ORDER BY t.created_at LIMIT 1;
        IF FOUND THEN
            v_reason := format('another %s call for %s (%s) is still %s',
                               p_tool_name, p_entity, v_row.key, v_row.status);
            IF p_on_busy = 'refuse' THEN
                v_action := 'refuse';
                v_detail := jsonb_build_object('entity', p_entity, 'busy', v_row.key);
            ELSE
                v_action := 'hold';
                v_other := v_row;
                v_reason := v_reason || '; this one waits until that one is settled';
                v_detail := '{}';
            END IF;
        END IF;
    END IF;

    -- Budget: completed (purged ones too: budget_purged_usage) plus what nobody can yet rule out
    -- (unresolved, or failed with an open conflict), per toolset's tool and currency. Reused
    -- results and compensated calls draw nothing.
    IF v_action = 'proceed' AND p_amount IS NOT NULL AND p_limit IS NOT NULL THEN
        SELECT b.completed, b.unresolved INTO v_completed, v_unres
          FROM onceflow_budget_used(p_tenant, p_tool_name, p_entity, p_key, p_toolset, p_currency) b;
        IF v_completed + v_unres + p_amount > p_limit THEN
            v_unit := CASE WHEN p_currency IS NULL THEN '' ELSE ' ' || p_currency END;
            v_action := 'refuse';
            v_reason := format('%s%s would exceed the limit of %s%s for %s: '
                               '%s completed and %s unresolved, %s left',
                               p_amount, v_unit, p_limit, v_unit, p_entity, v_completed, v_unres,
                               greatest(p_limit - v_completed - v_unres, 0));
            IF v_unres <> 0 THEN
                v_reason := v_reason || ' (the unresolved part is released only when those calls '
                                        'are settled as not applied)';
            END IF;
            v_detail := jsonb_build_object('entity', p_entity, 'limit', p_limit::text,
                                           'requested', p_amount::text, 'completed', v_completed::text,
                                           'unresolved', v_unres::text);
            IF p_currency IS NOT NULL THEN
                v_detail := v_detail || jsonb_build_object('currency', p_currency);
            END IF;
        END IF;
    END IF;

    -- Still held behind the same call: nothing new to write.
    IF v_found AND v_existing.status = 'held' AND v_action = 'hold'
       AND v_existing.held_by = v_other.key THEN
        RETURN QUERY SELECT 'held', NULL::text, v_existing.status, v_existing.updated_at, v_existing;
        RETURN;
    END IF;

    -- Held: mark the call it waits for, under that call's row lock, as holding calls. Whoever
    -- settles that call updates the same row, so either the settle waits for this commit and its
    -- row says to wake the held calls, or this update waits for the settle's commit and finds the
    -- call settled: nothing is written and the statement is decided again (OF004, which
    -- ledger/guarded.py retries). A settle looks up the calls held behind it only when marked.
    IF v_action = 'hold' THEN
        UPDATE tool_executions t SET holds_calls = true
         WHERE t.key = v_other.key
           AND (t.status IN ('awaiting_approval', 'held', 'started', 'indeterminate')
                OR (t.status = 'failed' AND t.conflict_at IS NOT NULL AND t.conflict_cleared_at IS NULL));
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'OF004',
                MESSAGE = format('%s was settled while %s was being held behind it', v_other.key, p_key);
        END IF;
    END IF;

    v_kind := NULL;
    IF v_action = 'hold' THEN
        v_status := 'held'; v_outcome := 'held';
        v_held_by := v_other.key;
    ELSIF v_action = 'reuse' THEN
        v_status := 'completed'; v_outcome := 'reused';
        v_reused := v_other.key;  -- the call that took effect (never a reused row: see c and e)
    ELSIF v_action = 'refuse' THEN
        v_status := 'failed'; v_outcome := 'refused'; v_kind := 'guard_refused';
    ELSIF p_approval THEN
        v_status := 'awaiting_approval'; v_outcome := 'awaiting_approval';
    ELSE
        v_status := 'started';
        v_outcome := CASE WHEN v_found AND v_existing.status = 'failed' THEN 'retry' ELSE 'new' END;
    END IF;
    v_settled := v_status IN ('completed', 'failed');

    IF v_held_by IS NOT NULL THEN
        v_detail := v_detail || jsonb_build_object('held_by', v_held_by);
    END IF;
    IF v_reused IS NOT NULL THEN
        v_detail := v_detail || jsonb_build_object('reused_from', v_reused);
    END IF;
    IF v_action = 'proceed' AND p_replaces IS NOT NULL THEN
        v_detail := v_detail || jsonb_build_object('replaces', p_replaces);
    END IF;
    IF v_action = 'proceed' THEN
        v_actor := p_owner; v_event := 'reserved';
    ELSE
        v_actor := 'onceflow:guard';
        v_event := CASE v_action WHEN 'hold' THEN 'held' WHEN 'reuse' THEN 'reused' ELSE 'guard_refused' END;
    END IF;

    -- The write and its event, one statement: an insert for a key nobody had recorded (a unique
    -- violation if somebody did meanwhile), an update for a recorded one only if it is still the
    -- version read.
    IF NOT v_found THEN
        WITH written AS (
            INSERT INTO tool_executions AS t
                (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
                 payload, payload_sha256, owner, lease_expires_at,
                 entity, entity_exclusive, amount, budget_limit, replaces, held_by, hold_reason,
                 reused_from, result, result_reference, failure_kind, error,
                 settled_at, settled_by, reason, toolset, currency)
            VALUES (p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect, v_status,
                    p_payload, p_sha256, p_owner,
                    CASE WHEN v_status = 'started' THEN clock_timestamp() + p_lease END,
                    p_entity, p_exclusive, p_amount, p_limit, p_replaces, v_held_by,
                    CASE WHEN v_held_by IS NOT NULL THEN v_reason END,
                    v_reused, CASE WHEN v_reused IS NOT NULL THEN v_other.result END,
                    CASE WHEN v_reused IS NOT NULL THEN v_other.result_reference END,
                    v_kind, CASE WHEN v_kind IS NOT NULL THEN v_reason END,
                    CASE WHEN v_settled THEN clock_timestamp() END,
                    CASE WHEN v_settled THEN 'onceflow:guard' END,
                    CASE WHEN v_settled THEN v_reason END, p_toolset, p_currency)
            RETURNING t.*
        ), logged AS (
            INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, reason, detail)
            SELECT w.key, v_actor, v_event, CASE WHEN v_action = 'proceed' THEN 'owner' ELSE 'guard' END,
                   NULL, w.status, nullif(v_reason, ''), jsonb_build_object('attempt', w.attempt) || v_detail
              FROM written w
        )
        SELECT * INTO v_row FROM written;
    ELSE
        WITH written AS (
            UPDATE tool_executions t
               SET status = v_status,
                   attempt = t.attempt + CASE WHEN t.status = 'failed' THEN 1 ELSE 0 END,
                   owner = p_owner,
                   lease_expires_at = CASE WHEN v_status = 'started' THEN clock_timestamp() + p_lease END,
                   entity = p_entity, entity_exclusive = p_exclusive,
                   amount = p_amount, budget_limit = p_limit, replaces = p_replaces,
                   toolset = p_toolset, currency = p_currency,
                   held_by = v_held_by, hold_reason = CASE WHEN v_held_by IS NOT NULL THEN v_reason END,
                   reused_from = v_reused,
                   result = CASE WHEN v_reused IS NOT NULL THEN v_other.result END,
                   result_reference = CASE WHEN v_reused IS NOT NULL THEN v_other.result_reference END,
                   failure_kind = v_kind, error = CASE WHEN v_kind IS NOT NULL THEN v_reason END,
                   settled_at = CASE WHEN v_settled THEN clock_timestamp() END,
                   settled_by = CASE WHEN v_settled THEN 'onceflow:guard' END,
                   reason = CASE WHEN v_settled THEN v_reason END, evidence = NULL,
                   approved_by = NULL, approved_at = NULL, escalated_to = NULL, escalated_at = NULL,
                   conflict_at = NULL, conflict_detail = NULL,
                   conflict_cleared_at = NULL, conflict_cleared_by = NULL,
                   updated_at = clock_timestamp()
             WHERE t.key = p_key AND t.xmin = v_xmin
            RETURNING t.*
        ), logged AS (
            INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, reason, detail)
            SELECT w.key, v_actor, v_event, CASE WHEN v_action = 'proceed' THEN 'owner' ELSE 'guard' END,
                   v_existing.status, w.status, nullif(v_reason, ''),
                   jsonb_build_object('attempt', w.attempt) || v_detail
              FROM written w
        )
        SELECT * INTO v_row FROM written;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'OF005', MESSAGE = format('%s changed while it was reserved', p_key);
        END IF;
    END IF;
    RETURN QUERY SELECT v_outcome, v_action, v_existing.status, v_existing.updated_at, v_row;
END;
$$;

-- The fast path, and the door every guarded reservation comes through.
CREATE OR REPLACE FUNCTION onceflow_guarded_reserve(
    p_locks        text[],
    p_key          text,
    p_tenant       text,
    p_run_id       text,
    p_tool_call_id text,
    p_agent        text,
    p_tool_name    text,
    p_side_effect  text,
    p_payload      jsonb,
    p_sha256       text,
    p_owner        text,
    p_approval     boolean,
    p_lease        interval,
    p_intent       text,
    p_entity       text,
    p_exclusive    boolean,
    p_on_busy      text,
    p_amount       numeric,
    p_limit        numeric,
    p_replaces     text,
    p_heard        text[],
    p_toolset      text,
    p_currency     text,
    p_heard_status text[],
    p_heard_at     timestamptz[],
    p_not_after    timestamptz,
    p_began        timestamptz
) RETURNS TABLE (
    o_outcome             text,
    o_action              text,
    o_previous_status     text,
    o_previous_updated_at timestamptz,
    o_record              tool_executions
)
LANGUAGE plpgsql AS $$
DECLARE
    v_lock    text;
    v_locked  text;     -- what pg_advisory_xact_lock returns (nothing), as text
    v_carried numeric;
BEGIN
    IF p_replaces IS NULL THEN
        -- One assignment per lock, in the order given: an expression, not a query.
        FOREACH v_lock IN ARRAY p_locks LOOP
            v_locked := pg_advisory_xact_lock(hashtextextended(v_lock, 0))::text;
        END LOOP;
        IF p_not_after IS NOT NULL AND clock_timestamp() > p_not_after THEN
            RAISE EXCEPTION USING ERRCODE = 'OF006',
                MESSAGE = format('%s: the attempt is past its deadline (%s); nothing was reserved', p_key, p_not_after);
        END IF;
        <<nothing_in_the_way>>
        BEGIN
            IF p_exclusive THEN
                PERFORM FROM tool_executions t
                 WHERE t.tenant = p_tenant AND t.tool_name = p_tool_name AND t.entity = p_entity
                   AND t.key <> p_key
                   AND (t.toolset IS NULL OR p_toolset IS NULL OR t.toolset = p_toolset)
                   AND t.status IN ('awaiting_approval', 'started', 'indeterminate')
                 LIMIT 1;
                EXIT nothing_in_the_way WHEN FOUND;
            END IF;
            IF p_amount IS NOT NULL AND p_limit IS NOT NULL THEN
                SELECT coalesce(sum(b.carried), 0) INTO v_carried
                  FROM budget_totals b
                 WHERE b.tenant = p_tenant AND b.tool_name = p_tool_name AND b.entity = p_entity
                   AND (b.toolset IS NULL OR p_toolset IS NULL OR b.toolset = p_toolset)
                   AND b.currency IS NOT DISTINCT FROM p_currency;
                EXIT nothing_in_the_way WHEN v_carried + p_amount > p_limit;
            END IF;
            RETURN QUERY
            WITH written AS (
                INSERT INTO tool_executions AS t
                    (key, tenant, run_id, tool_call_id, agent, tool_name, side_effect, status,
                     payload, payload_sha256, owner, lease_expires_at,
                     entity, entity_exclusive, amount, budget_limit, toolset, currency)
                SELECT p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect,
                       CASE WHEN p_approval THEN 'awaiting_approval' ELSE 'started' END,
                       p_payload, p_sha256, p_owner,
                       CASE WHEN NOT p_approval THEN clock_timestamp() + p_lease END,
                       p_entity, p_exclusive, p_amount, p_limit, p_toolset, p_currency
                 WHERE NOT EXISTS (SELECT FROM tool_executions o WHERE o.key = p_key)
                   AND (p_intent = 'allow' OR NOT EXISTS (
                        SELECT FROM tool_executions o
                         WHERE o.run_id = p_run_id AND o.payload_sha256 = p_sha256))
                RETURNING t
            ), logged AS (
                INSERT INTO tool_execution_events (key, actor, kind, source, from_status, to_status, detail)
                SELECT (w.t).key, p_owner, 'reserved', 'owner', NULL, (w.t).status,
                       jsonb_build_object('attempt', (w.t).attempt)
                  FROM written w
            )
            SELECT CASE WHEN p_approval THEN 'awaiting_approval' ELSE 'new' END, 'proceed',
                   NULL::text, NULL::timestamptz, w.t
              FROM written w;
            IF FOUND THEN
                RETURN;
            END IF;
        END;
    END IF;
    RETURN QUERY SELECT * FROM onceflow_guarded_decide(
        p_locks, p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect,
        p_payload, p_sha256, p_owner, p_approval, p_lease, p_intent, p_entity, p_exclusive, p_on_busy,
        p_amount, p_limit, p_replaces, p_heard, p_toolset, p_currency, p_heard_status, p_heard_at,
        p_not_after, p_began);
END;
$$;

-- The signature workers of the previous release call (no attempt start), kept for a rolling
-- upgrade: their attempts retry a failed call as they did, until they are replaced.
CREATE OR REPLACE FUNCTION onceflow_guarded_reserve(
    p_locks text[], p_key text, p_tenant text, p_run_id text, p_tool_call_id text, p_agent text,
    p_tool_name text, p_side_effect text, p_payload jsonb, p_sha256 text, p_owner text,
    p_approval boolean, p_lease interval, p_intent text, p_entity text, p_exclusive boolean,
    p_on_busy text, p_amount numeric, p_limit numeric, p_replaces text, p_heard text[],
    p_toolset text, p_currency text, p_heard_status text[], p_heard_at timestamptz[],
    p_not_after timestamptz
) RETURNS TABLE (
    o_outcome             text,
    o_action              text,
    o_previous_status     text,
    o_previous_updated_at timestamptz,
    o_record              tool_executions
)
LANGUAGE sql AS $$
    SELECT * FROM onceflow_guarded_reserve(
        p_locks, p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect,
        p_payload, p_sha256, p_owner, p_approval, p_lease, p_intent, p_entity, p_exclusive, p_on_busy,
        p_amount, p_limit, p_replaces, p_heard, p_toolset, p_currency, p_heard_status, p_heard_at,
        p_not_after, NULL::timestamptz)
$$;

-- The signature workers before this file call (heard as bare ids, no deadline), kept for a rolling
-- upgrade: a worker still running the old code reserves through it, its heard calls judged as they
-- stand (the rule as it was), until it is replaced.
CREATE OR REPLACE FUNCTION onceflow_guarded_reserve(
    p_locks text[], p_key text, p_tenant text, p_run_id text, p_tool_call_id text, p_agent text,
    p_tool_name text, p_side_effect text, p_payload jsonb, p_sha256 text, p_owner text,
    p_approval boolean, p_lease interval, p_intent text, p_entity text, p_exclusive boolean,
    p_on_busy text, p_amount numeric, p_limit numeric, p_replaces text, p_heard text[],
    p_toolset text, p_currency text
) RETURNS TABLE (
    o_outcome             text,
    o_action              text,
    o_previous_status     text,
    o_previous_updated_at timestamptz,
    o_record              tool_executions
)
LANGUAGE sql AS $$
    SELECT * FROM onceflow_guarded_reserve(
        p_locks, p_key, p_tenant, p_run_id, p_tool_call_id, p_agent, p_tool_name, p_side_effect,
        p_payload, p_sha256, p_owner, p_approval, p_lease, p_intent, p_entity, p_exclusive, p_on_busy,
        p_amount, p_limit, p_replaces, p_heard, p_toolset, p_currency, NULL::text[],
        NULL::timestamptz[], NULL::timestamptz)
$$;
