"""Operator tokens (ledger/tokens.py)."""

INSERT_TOKEN = """
INSERT INTO operator_tokens (id, token_sha256, tenant, operator) VALUES ($1, $2, $3, $4)
RETURNING *
"""

SELECT_ACTIVE_TOKEN = "SELECT * FROM operator_tokens WHERE token_sha256 = $1 AND revoked_at IS NULL"

# Revoking a token ends its console sessions too (the session lookup also joins a live token).
REVOKE_TOKEN = """
WITH ended AS (DELETE FROM console_sessions WHERE token_id = $1)
UPDATE operator_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp()) WHERE id = $1
RETURNING *
"""

LIST_TOKENS = """
SELECT * FROM operator_tokens WHERE ($1::text IS NULL OR tenant = $1) ORDER BY created_at, id
"""
