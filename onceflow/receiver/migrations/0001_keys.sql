-- The receiver kit's key store (onceflow.receiver): one row per idempotency key a service has seen,
-- within a scope (a tenant or a client, as the service's own authentication names it).
--
--   in_progress  the ASGI middleware claimed the key and runs the handler; its answer is not recorded
--                yet. Committed before the handler runs, so a crash leaves it here: unknown, never
--                absent. (The transactional form never commits this state: its claim is the row lock
--                of a transaction that records the key and the service's writes together.)
--   completed    the request was answered; the answer (status, chosen headers, body) is replayed to
--                every later request with the key and the same fingerprint, until `expires_at`.
--   fenced       a reconciler asked for the key and found no record: from then on any request with
--                it is refused and never applied. A fence does not expire.
CREATE TABLE onceflow_receiver_keys (
    scope            text NOT NULL CHECK (length(scope) BETWEEN 1 AND 255),
    key              text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    state            text NOT NULL CHECK (state IN ('in_progress', 'completed', 'fenced')),
    -- SHA-256 (hex) of the request's method, path and canonical body; a fence has none.
    fingerprint      text CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    method           text,
    path             text,
    response_status  integer CHECK (response_status BETWEEN 100 AND 599),
    -- [[name, value], ...]: only the headers the service chose to keep with the answer.
    response_headers jsonb NOT NULL DEFAULT '[]'::jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    -- When a completed key stops being honoured (the published policy). NULL: never (fences).
    expires_at       timestamptz,
    PRIMARY KEY (scope, key),
    CHECK ((state = 'completed') = (response_status IS NOT NULL AND completed_at IS NOT NULL)),
    CHECK ((state = 'fenced') = (fingerprint IS NULL)),
    CHECK (state <> 'fenced' OR expires_at IS NULL)
);

-- The housekeeping that deletes expired answers reads only these.
CREATE INDEX onceflow_receiver_keys_expiry ON onceflow_receiver_keys (expires_at)
    WHERE state = 'completed';
