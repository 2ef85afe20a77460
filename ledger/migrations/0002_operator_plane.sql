-- The operator plane: how long a started call's owner is trusted, approvals, escalation, and the
-- bearer tokens operators use.

ALTER TABLE tool_executions
    -- A `started` call whose lease has run out has lost its owner (worker dead, activity timed out).
    ADD COLUMN lease_expires_at timestamptz,
    -- An approval is recorded on the `awaiting_approval` row; the approved call is dispatched later,
    -- exactly once, by the reservation that turns the row `started`.
    ADD COLUMN approved_by      text,
    ADD COLUMN approved_at      timestamptz,
    -- Escalation names who must look at an unknown call; it never changes the outcome.
    ADD COLUMN escalated_to     text,
    ADD COLUMN escalated_at     timestamptz;

CREATE TABLE operator_tokens (
    id            text PRIMARY KEY,
    token_sha256  text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    tenant        text NOT NULL CHECK (tenant <> ''),
    operator      text NOT NULL CHECK (operator <> ''),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at    timestamptz
);
