"""Conversations by reference (ledger/conversations.py): a hash chain of messages."""

INSERT_CONVERSATION_MESSAGE = """
INSERT INTO conversation_messages (sha256, parent, tenant, run_id, position, message)
VALUES ($1, $2, $3, $4, $5, $6::jsonb)
ON CONFLICT (sha256) DO NOTHING
"""

# From the head back to the first message, then in order.
SELECT_CONVERSATION = """
WITH RECURSIVE chain AS (
    SELECT sha256, parent, position, message FROM conversation_messages WHERE sha256 = $1
    UNION ALL
    SELECT m.sha256, m.parent, m.position, m.message
      FROM conversation_messages m JOIN chain c ON m.sha256 = c.parent
)
SELECT position, message FROM chain ORDER BY position
"""
