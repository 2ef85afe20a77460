-- Retention of stored conversations (conversation_messages, migration 0004): a run's messages are
-- deleted only by a purge, and only when nothing can read them again.
--
-- A definition, not history: ledger/migrate.py applies this file after the numbered migrations
-- whenever its text changes. What "nothing can read them again" means needs Temporal's answer (is the
-- run closed, since when, does the namespace still keep the history a reset would replay), which the
-- database cannot see: ledger/retention.py (purge_conversations) asks it. This trigger holds what the
-- database can check itself, so a bug in the command or a hand-typed DELETE cannot get around it:
-- the transaction set `onceflow.purge_before` (SET LOCAL; at least a day old, onceflow_purge_cutoff,
-- migration 0005), the message is older than that cutoff, and its run has no unresolved call (a run
-- that waits on a call is open, and will read its conversation when the call settles).

CREATE OR REPLACE FUNCTION conversation_messages_delete_only_purged() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamptz;
BEGIN
    IF TG_OP = 'DELETE' THEN
        cutoff := onceflow_purge_cutoff();
        IF cutoff IS NOT NULL AND OLD.created_at < cutoff AND NOT EXISTS (
            SELECT 1 FROM tool_executions t
             WHERE t.run_id = OLD.run_id
               AND t.status IN ('held', 'awaiting_approval', 'started', 'indeterminate')
        ) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'conversation_messages rows are deleted only by a purge of closed runs (% refused)', TG_OP;
END;
$$;

CREATE OR REPLACE TRIGGER conversation_messages_delete_only_purged
    BEFORE DELETE ON conversation_messages
    FOR EACH ROW EXECUTE FUNCTION conversation_messages_delete_only_purged();

CREATE OR REPLACE TRIGGER conversation_messages_no_truncate
    BEFORE TRUNCATE ON conversation_messages
    FOR EACH STATEMENT EXECUTE FUNCTION conversation_messages_delete_only_purged();
