-- A run's first write claims its run id in the same statement as its reservation (one commit, where
-- the claim used to commit on its own first). ledger/queries/guards.py's GUARDED_RESERVE_CLAIMING
-- calls this before onceflow_guarded_reserve, which takes its run id from this function's answer,
-- so the claim is always decided first. Another execution's claim raises SQLSTATE OF003 with the
-- claim's time as DETAIL: the statement is rolled back, nothing is reserved.
CREATE FUNCTION onceflow_claim_run_id(p_run_id text, p_execution text, p_tenant text, p_agent text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_execution text;
    v_claimed_at timestamptz;
BEGIN
    INSERT INTO run_ids (run_id, execution, tenant, agent)
    VALUES (p_run_id, p_execution, p_tenant, p_agent)
    ON CONFLICT (run_id) DO NOTHING;
    -- A new snapshot: a claim that committed while the insert waited for it is seen here.
    SELECT execution, claimed_at INTO v_execution, v_claimed_at FROM run_ids WHERE run_id = p_run_id;
    IF v_execution IS DISTINCT FROM p_execution THEN
        RAISE EXCEPTION 'run id % was claimed by another execution', p_run_id
            USING ERRCODE = 'OF003', DETAIL = to_json(v_claimed_at) #>> '{}';
    END IF;
    RETURN p_run_id;
END
$$;
