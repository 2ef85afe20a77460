"""Console sessions (ledger/sessions.py): a browser's sign-in, by the SHA-256 of its random id."""

# A sign-in also sweeps sessions that ran out, so the table holds live sessions and a few stale ones.
INSERT_CONSOLE_SESSION = """
WITH swept AS (DELETE FROM console_sessions WHERE idle_expires_at <= clock_timestamp()),
     now AS (SELECT clock_timestamp() AS at)
INSERT INTO console_sessions (id_sha256, token_id, created_at, last_seen_at, idle_expires_at, expires_at)
SELECT $1, t.id, now.at, now.at, now.at + least($3::interval, $4::interval), now.at + $4::interval
  FROM operator_tokens AS t, now
 WHERE t.id = $2 AND t.revoked_at IS NULL
RETURNING *
"""

# One statement per console request: the session is live (not idle past its deadline, which never
# passes the absolute one), its token is not revoked; its idle deadline moves on.
TOUCH_CONSOLE_SESSION = """
UPDATE console_sessions AS s
   SET last_seen_at = statement_timestamp(),
       idle_expires_at = least(statement_timestamp() + $2::interval, s.expires_at)
  FROM operator_tokens AS t
 WHERE s.id_sha256 = $1
   AND t.id = s.token_id
   AND t.revoked_at IS NULL
   AND s.idle_expires_at > statement_timestamp()
RETURNING s.created_at AS session_created_at, s.last_seen_at, s.idle_expires_at, s.expires_at,
          t.id, t.tenant, t.operator, t.created_at, t.revoked_at
"""

DELETE_CONSOLE_SESSION = "DELETE FROM console_sessions WHERE id_sha256 = $1 RETURNING token_id"
