-- The tool-execution ledger: one row per side-effecting tool call, keyed by <run_id>:<tool_call_id>,
-- and an append-only log of everything that happened to it.

CREATE TABLE tool_executions (
    key               text PRIMARY KEY,
    tenant            text NOT NULL,
    run_id            text NOT NULL,
    tool_call_id      text NOT NULL,
    agent             text NOT NULL DEFAULT '',
    tool_name         text NOT NULL,
    side_effect       text NOT NULL
        CHECK (side_effect IN ('read', 'write', 'external', 'destructive')),
    status            text NOT NULL
        CHECK (status IN ('awaiting_approval', 'started', 'completed', 'failed',
                          'indeterminate', 'denied', 'compensated')),
    payload           jsonb NOT NULL,
    payload_sha256    text NOT NULL CHECK (payload_sha256 ~ '^[0-9a-f]{64}$'),
    attempt           integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner             text,
    result            jsonb,
    result_reference  text,
    failure_kind      text
        CHECK (failure_kind IN ('not_attempted', 'rejected', 'not_applied', 'denied')),
    error             text,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at        timestamptz,
    settled_by        text,
    reason            text,
    evidence          jsonb,
    CONSTRAINT key_is_run_and_call CHECK (key = run_id || ':' || tool_call_id)
);

-- "Unresolved calls of a tenant, longest waiting first": the operator's work queue.
CREATE INDEX tool_executions_unresolved
    ON tool_executions (tenant, created_at, key)
    WHERE status IN ('started', 'indeterminate', 'awaiting_approval');

CREATE TABLE tool_execution_events (
    id           bigserial PRIMARY KEY,
    key          text NOT NULL REFERENCES tool_executions (key),
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor        text NOT NULL,
    kind         text NOT NULL,
    from_status  text,
    to_status    text,
    reason       text,
    evidence     jsonb,
    detail       jsonb
);

CREATE INDEX tool_execution_events_key ON tool_execution_events (key, id);

-- Events are evidence: once written they are never changed.
CREATE FUNCTION tool_execution_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tool_execution_events is append-only (% refused)', TG_OP;
END;
$$;

CREATE TRIGGER tool_execution_events_append_only
    BEFORE UPDATE OR DELETE ON tool_execution_events
    FOR EACH ROW EXECUTE FUNCTION tool_execution_events_append_only();
