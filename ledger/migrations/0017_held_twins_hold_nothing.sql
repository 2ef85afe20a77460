-- A held twin holds no call: a call is held only behind a twin that was sent or waits for a person.
--
-- onceflow_guarded_reserve again, whole; 0016's function but for the intent rule. Before, a held
-- twin recorded before the call held it, so that of two held twins the older went first. But two
-- held twins are never both waited for: twins are of one run, one run's calls go one at a time
-- (AgentRunWorkflow) or in parallel inside one execution (a framework's parallel tool calls), and
-- a held call from before a Temporal reset is waited for by nobody, its execution gone. A later
-- twin held behind that one was stuck for good: the call it waited for was never decided again,
-- not even once the call they were both held behind was settled (tests/test_held_after_resets.py).
-- Now every held twin is held behind the same call that was sent, all of them are woken when it is
-- settled, and the first to ask again decides: it is reused, refused, or sent, and then the others
-- are held behind it. A held call was never sent, so passing it over can cause no second effect;
-- the intent's advisory lock still lets one reservation at a time decide.

CREATE OR REPLACE FUNCTION onceflow_guarded_reserve(
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
    p_heard        text[],   -- tool call ids whose settled outcome the model had heard
    p_toolset      text,
    p_currency     text
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
    v_same      boolean;
    v_heard     text[] := '{}';
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

    -- The call's own row, if recorded, and its twins (the run's calls of the same canonical
    -- payload), in one read after the locks. The row is not locked: every write below is made only
    -- if the row is still the version read (its xmin), and otherwise raises OF005, which
    -- ledger/guarded.py retries; a key nobody had recorded is inserted, and a unique violation (the
    -- key recorded meanwhile) is retried too. Either way the call is decided again on what is there.
    -- Two index lookups, not one OR: a plan cached while the table was nearly empty would read an
    -- OR by scanning the whole table for good. Intent `allow` looks for no twins.
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
        IF NOT (v_existing.status = 'held'
                OR (v_existing.status = 'failed' AND v_existing.conflict_at IS NULL
                    AND coalesce(v_existing.failure_kind, '')
                        NOT IN ('policy_refused', 'guard_refused', 'released'))) THEN
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

    -- Intent: twins are the run's other calls of the same canonical payload, newest first. A twin
    -- is the same intent unless the model had heard its settled, standing outcome (or, for `reuse`,
    -- always). Same-intent twins that may take effect hold the call; a receiver's policy refusal of
    -- any twin stands; a completed same-intent twin is reused; a compensated one refuses.
    IF v_action = 'proceed' AND p_intent <> 'allow' THEN
        FOREACH v_twin IN ARRAY v_twins LOOP
            v_same := p_intent = 'reuse' OR NOT (
                v_twin.tool_call_id = ANY(p_heard)
                AND v_twin.status IN ('completed', 'failed', 'denied', 'compensated')
                AND NOT (v_twin.status = 'failed' AND v_twin.conflict_at IS NOT NULL
                         AND v_twin.conflict_cleared_at IS NULL));
            IF NOT v_same THEN
                v_heard := v_heard || v_twin.key;
            ELSIF v_action = 'proceed'
                  -- A twin that was sent, or waits for a person, holds this call whatever its age
                  -- (a retry of an older call must not go while a younger twin may be taking
                  -- effect). A held twin holds nothing: it was not sent (see the header).
                  AND (v_twin.status IN ('awaiting_approval', 'started', 'indeterminate')
                       OR (v_twin.status = 'failed' AND v_twin.conflict_at IS NOT NULL
                           AND v_twin.conflict_cleared_at IS NULL)) THEN
                v_action := 'hold';
                v_other := v_twin;
                v_reason := format('the same call (%s) is still %s; this one waits until that one is settled',
                                   v_twin.tool_call_id,
                                   CASE WHEN v_twin.status = 'failed' THEN 'failed with an open conflict'
                                        ELSE v_twin.status END);
                v_detail := jsonb_build_object('same_as', v_twin.key);
            END IF;
        END LOOP;
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
        IF v_action = 'proceed' THEN
            FOREACH v_twin IN ARRAY v_twins LOOP
                CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.status <> 'completed';
                v_action := 'reuse';
                v_other := v_twin;
                v_reason := CASE WHEN p_intent = 'hold' THEN format(
                    'the same call (%s) already took effect, before you had heard its outcome; this is '
                    'its result, and nothing was sent again. If another one is owed, make the call '
                    'again: now that you know of this one, it will be sent', v_twin.tool_call_id)
                    ELSE format('the same call (%s) already completed', v_twin.tool_call_id) END;
                EXIT;
            END LOOP;
        END IF;
        IF v_action = 'proceed' THEN
            FOREACH v_twin IN ARRAY v_twins LOOP
                CONTINUE WHEN v_twin.key = ANY(v_heard) OR v_twin.status <> 'compensated';
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
            v_detail := jsonb_build_object('heard_twins', to_jsonb(v_heard));
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
        v_reused := coalesce(v_other.reused_from, v_other.key);  -- the call that took effect
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
