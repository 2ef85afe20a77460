-- Conflicts, event sources and retention.

-- A conflict: a definite outcome that arrived after the call was settled and contradicts the
-- decision (an operator said failed, the owner says it completed). The decision stands; the row is
-- flagged until an operator acknowledges it. "Open" is derived: flagged and not acknowledged.
ALTER TABLE tool_executions
    ADD COLUMN conflict_at          timestamptz,
    ADD COLUMN conflict_detail      jsonb,
    ADD COLUMN conflict_cleared_at  timestamptz,
    ADD COLUMN conflict_cleared_by  text,
    ADD CONSTRAINT conflict_has_detail CHECK ((conflict_at IS NULL) = (conflict_detail IS NULL)),
    ADD CONSTRAINT conflict_cleared_after_flagged
        CHECK (conflict_cleared_at IS NULL OR conflict_at IS NOT NULL),
    ADD CONSTRAINT conflict_cleared_by_someone
        CHECK ((conflict_cleared_at IS NULL) = (conflict_cleared_by IS NULL));

-- The operator's queue lists open conflicts beside unresolved calls, longest waiting first.
CREATE INDEX tool_executions_open_conflicts
    ON tool_executions (tenant, created_at, key)
    WHERE conflict_at IS NOT NULL AND conflict_cleared_at IS NULL;

-- Where each event came from. Events written before this migration say 'unrecorded' (a fast
-- default: no row is rewritten, so the append-only trigger is not involved); new ones must say.
ALTER TABLE tool_execution_events
    ADD COLUMN source text NOT NULL DEFAULT 'unrecorded'
        CHECK (source IN ('owner', 'inspector', 'signal', 'update', 'api', 'reconciler',
                          'deadline', 'compensation', 'unrecorded'));
ALTER TABLE tool_execution_events ALTER COLUMN source DROP DEFAULT;

-- Retention. A purge runs in a transaction that set `onceflow.purge_before` (SET LOCAL); only rows
-- that are settled, untouched since that cutoff, and carry no open conflict may then be deleted,
-- with their events. The cutoff itself may not be younger than one day (Temporal's own minimum
-- namespace retention), so no session can use the purge door on fresh evidence.
CREATE FUNCTION onceflow_purge_cutoff() RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    cutoff timestamptz := nullif(current_setting('onceflow.purge_before', true), '')::timestamptz;
BEGIN
    IF cutoff IS NOT NULL AND cutoff > clock_timestamp() - interval '1 day' THEN
        RAISE EXCEPTION 'onceflow.purge_before (%) must be at least one day in the past', cutoff;
    END IF;
    RETURN cutoff;
END;
$$;

CREATE FUNCTION onceflow_purgeable(t tool_executions, cutoff timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT cutoff IS NOT NULL
       AND t.status IN ('completed', 'failed', 'denied', 'compensated')
       AND t.settled_at < cutoff
       AND t.updated_at < cutoff
       AND (t.conflict_at IS NULL OR t.conflict_cleared_at IS NOT NULL)
$$;

CREATE OR REPLACE FUNCTION tool_execution_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamptz;
BEGIN
    IF TG_OP = 'DELETE' THEN
        cutoff := onceflow_purge_cutoff();
        IF OLD.at < cutoff AND EXISTS (
            SELECT 1 FROM tool_executions t WHERE t.key = OLD.key AND onceflow_purgeable(t, cutoff)
        ) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'tool_execution_events is append-only (% refused)', TG_OP;
END;
$$;

-- Rows were mutable but never deleted by the code; now a delete is a purge, or it is refused.
CREATE FUNCTION tool_executions_delete_only_purged() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND onceflow_purgeable(OLD, onceflow_purge_cutoff()) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'tool_executions rows are deleted only by a purge of settled calls (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER tool_executions_delete_only_purged
    BEFORE DELETE ON tool_executions
    FOR EACH ROW EXECUTE FUNCTION tool_executions_delete_only_purged();

CREATE TRIGGER tool_executions_no_truncate
    BEFORE TRUNCATE ON tool_executions
    FOR EACH STATEMENT EXECUTE FUNCTION tool_executions_delete_only_purged();

-- Where `onceflow ledger purge --archive` moves what it purges. Stored as JSON documents so that
-- later columns of the live tables need no change here.
CREATE TABLE tool_executions_archive (
    key          text PRIMARY KEY,
    tenant       text NOT NULL,
    run_id       text NOT NULL,
    settled_at   timestamptz NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    record       jsonb NOT NULL
);

CREATE TABLE tool_execution_events_archive (
    id           bigint PRIMARY KEY,
    key          text NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    event        jsonb NOT NULL
);

CREATE INDEX tool_execution_events_archive_key ON tool_execution_events_archive (key, id);
