-- Deleting a stored conversation (onceflow ledger purge, ledger/retention.py) checks, for every
-- message deleted, that no message names it as its parent (the chain's foreign key, migration
-- 0004). Without an index on `parent` each of those checks read the whole table: purging 2,000 runs
-- of 22 messages took 601 s (bench/purge.py); with it, 7 s.
--
-- Building it takes a lock that holds back new messages (model turns) while it runs. On a large
-- conversation table, build it beforehand without that lock, and this migration then finds it:
--     CREATE INDEX CONCURRENTLY conversation_messages_parent
--         ON conversation_messages (parent) WHERE parent IS NOT NULL;
CREATE INDEX IF NOT EXISTS conversation_messages_parent
    ON conversation_messages (parent) WHERE parent IS NOT NULL;
