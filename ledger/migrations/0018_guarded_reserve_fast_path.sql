-- A guarded reservation of a call with nothing in its way is one statement inside the function.
--
-- Most guarded reservations find no row for their key, no twin in their run, no busy entity and room
-- in their budget, and are sent. 0017's function still read the key and the twins, walked every rule
-- over what it read, wrote the row and returned it: four statements of its own, each an executor
-- start and end, plus the advisory locks taken through a query. Measured in instructions
-- (callgrind, one backend), the default intent guard cost 17% more than the unguarded reservation,
-- an entity guard with a budget 36% more (docs/benchmarks.md, "Issue 22, seventh pass").
--
-- Here the function takes its locks as plain expressions, and then, for a call that replaces no
-- other (lineage always needs the whole decision):
--   - with an exclusive entity, looks for another unresolved call of the entity (0017's query);
--   - with a budget, reads what the entity's budget keys carry (budget_totals, migration 0014):
--     0017's `completed + unresolved` for a call with no row of its own (the only kind inserted
--     here), without summing the unresolved part apart, which only its refusal's wording needs;
--   - and inserts the call with its event, in one statement that also returns it, only if no row
--     holds the key and (unless intent `allow`) no call of the run has the same payload.
-- If any of those finds something in its way, nothing has been written, and 0017's function,
-- renamed onceflow_guarded_decide, decides the call as before: it takes the same locks again (a
-- transaction may hold an advisory lock more than once) and reads everything anew. So every answer
-- is one 0017 would have given: a call inserted here is exactly the row and event its `proceed`
-- would have written for a call with no row and no twins (tests/test_guarded_fast_path.py compares
-- them), and every other call goes through it unchanged.
--
-- The checks run after the locks, each statement with a snapshot taken after them, so what they do
-- not see is not there: of two twins, or two calls of one exclusive entity or budget, the second
-- waits at the lock until the first has committed. A key recorded meanwhile by a reservation that
-- shares no lock with this one (intent `allow`, another payload) is caught by the primary key: the
-- unique violation rolls the statement back and ledger/guarded.py asks again, as with 0017's insert.

ALTER FUNCTION onceflow_guarded_reserve(text[], text, text, text, text, text, text, text, jsonb, text,
                                        text, boolean, interval, text, text, boolean, text, numeric,
                                        numeric, text, text[], text, text)
    RENAME TO onceflow_guarded_decide;

CREATE FUNCTION onceflow_guarded_reserve(
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
    v_lock    text;
    v_locked  text;     -- what pg_advisory_xact_lock returns (nothing), as text
    v_carried numeric;
BEGIN
    IF p_replaces IS NULL THEN
        -- One assignment per lock, in the order given: an expression, not a query.
        FOREACH v_lock IN ARRAY p_locks LOOP
            v_locked := pg_advisory_xact_lock(hashtextextended(v_lock, 0))::text;
        END LOOP;
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
        p_amount, p_limit, p_replaces, p_heard, p_toolset, p_currency);
END;
$$;
