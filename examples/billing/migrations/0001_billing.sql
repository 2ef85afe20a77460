-- The example billing service's own tables (the receiver kit keeps its keys in tables of its own,
-- onceflow/receiver/migrations). Nothing here dedups: the kit's key record, committed in the same
-- transaction as the credit, is the service's only guard against applying a key twice.
CREATE TABLE billing_credits (
    seq                  bigserial PRIMARY KEY,   -- the order credits were applied in
    credit_id            text NOT NULL UNIQUE,
    -- Not unique: with the kit honouring no key (--no-dedup) one key may carry many credits, and
    -- the drills count exactly that.
    idempotency_key      text NOT NULL,
    account_id           text NOT NULL,
    amount_cents         bigint NOT NULL CHECK (amount_cents > 0),
    currency             text NOT NULL,
    memo                 text,
    status               text NOT NULL CHECK (status IN ('applied', 'voided')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    voided_at            timestamptz,
    void_idempotency_key text
);
CREATE INDEX billing_credits_by_key ON billing_credits (idempotency_key);
CREATE INDEX billing_credits_by_account ON billing_credits (account_id);

-- Every request to a business route, written when it arrives: before the kit, the fence, faults
-- or validation can answer it, so a key sent twice shows twice here whatever became of it.
CREATE TABLE billing_received_requests (
    id              bigserial PRIMARY KEY,
    method          text NOT NULL,
    path            text NOT NULL,
    idempotency_key text,              -- the key the header carried (unquoted); NULL if none or unreadable
    received_at     timestamptz NOT NULL DEFAULT now(),
    applied         boolean NOT NULL DEFAULT false,  -- set in the transaction that applies the credit
    status_code     integer            -- the answer's status; NULL: none (dropped, or the service died)
);
CREATE INDEX billing_received_by_key ON billing_received_requests (idempotency_key);
