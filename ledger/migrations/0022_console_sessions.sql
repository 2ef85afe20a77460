-- Console sessions: what a signed-in browser holds is a random session id, never a bearer token.
--
-- The cookie carries the id; only its SHA-256 is stored here, like a token's, so reading this table
-- gives nobody a session. A session belongs to one operator token: revoking the token ends it (the
-- API's lookup joins a live token, and the revocation deletes its sessions), and signing out deletes
-- the row, so a cookie copied before either opens nothing afterwards. A session ends when it has
-- been idle past `idle_expires_at`, and in any case at `expires_at`; the idle deadline is moved on
-- at each request, never past the absolute one.

CREATE TABLE console_sessions (
    id_sha256        onceflow_sha256 PRIMARY KEY,
    token_id         text NOT NULL REFERENCES operator_tokens (id) ON DELETE CASCADE,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    idle_expires_at  timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    CHECK (idle_expires_at <= expires_at)
);

-- Revoking a token deletes its sessions; a sign-in sweeps the sessions that ran out.
CREATE INDEX console_sessions_token ON console_sessions (token_id);
CREATE INDEX console_sessions_idle_expiry ON console_sessions (idle_expires_at);
