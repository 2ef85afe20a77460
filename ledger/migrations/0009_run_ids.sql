-- Run ids. Every key of a run is built from its run id (`<run_id>:<tool_call_id>`), so a run id
-- names one run forever: the first write of a run claims it here, with the Temporal execution
-- that made the claim (its first execution's run id, the same across resets and continue-as-new),
-- and any other execution using it is refused before it reserves or sends anything. Temporal's
-- REJECT_DUPLICATE forgets a workflow id once the run is past its retention; this table does not,
-- and the retention purge never touches it.
CREATE TABLE run_ids (
    run_id      text PRIMARY KEY CHECK (run_id <> '' AND strpos(run_id, ':') = 0),
    execution   text NOT NULL CHECK (execution <> ''),
    tenant      text NOT NULL,
    agent       text,
    claimed_at  timestamptz NOT NULL DEFAULT now()
);

