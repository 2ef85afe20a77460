-- Agent conversations, stored beside the ledger so model activities take them by reference and a
-- run's Temporal history grows by what each turn adds, not by the whole conversation every turn.
-- Messages form a hash chain: each row's sha256 covers its parent's and its own content (the first
-- message's covers the run id), so a stored prefix is immutable and writing it again is a no-op.

CREATE TABLE conversation_messages (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    parent      text REFERENCES conversation_messages (sha256),
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    position    integer NOT NULL CHECK (position >= 0),
    message     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((parent IS NULL) = (position = 0))
);

CREATE INDEX conversation_messages_run ON conversation_messages (run_id);
