-- The PostgreSQL timelines the ledger has run on, each with when a onceflow process first saw it.
--
-- A standby that is promoted starts a new timeline. Under asynchronous replication, writes the old
-- primary acknowledged may be missing from it: a reservation among them would read as "no row, so
-- nothing was sent", and the call could be sent again. Every ledger connection reads the server's
-- timeline when it opens (ledger/timelines.py) and records a timeline it has not seen; a call whose
-- earlier attempt began before a timeline switch was first seen is then treated as possibly sent
-- (docs/operations.md, "When the ledger fails over"). Rows are only ever added.
CREATE TABLE onceflow_timelines (
    timeline       integer PRIMARY KEY CHECK (timeline >= 1),
    first_seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    first_seen_by  text NOT NULL
);
