"""Compensation requests (ledger/compensations.py) and their claims, as events."""

# The latest event of one kind under a key (compensation requests and their claims).
LATEST_EVENT_OF_KIND = """
SELECT * FROM tool_execution_events WHERE key = $1 AND kind = $2 ORDER BY id DESC LIMIT 1
"""

# The claim made on one compensation request, if any.
CLAIM_OF_REQUEST = """
SELECT * FROM tool_execution_events
 WHERE key = $1 AND kind = 'compensation_claimed' AND (detail->>'request_event')::bigint = $2
 ORDER BY id LIMIT 1
"""

EVENT_OF_KEY = """
SELECT * FROM tool_execution_events WHERE key = $1 AND id = $2
"""
