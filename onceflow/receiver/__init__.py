"""The receiver kit: the other half of the key, for services that receive writes.

onceflow makes the caller keep its promise (one send per key, a record before the send, an honest
"unknown"). Whether the effect happens once when a request does arrive twice, and whether an unknown
call can be settled without a person, is up to the receiver. This kit makes a receiver that:

- honours the Idempotency-Key header as draft-ietf-httpapi-idempotency-key-header-07 says (400
  missing or bad key, 422 the key reused for another request, 409 while the first is in progress,
  the stored answer replayed after it, a published and enforced expiry), with its keys in
  PostgreSQL, in the service's own database if it likes (`KeyStore`, `migrate_receiver`);
- commits the service's own writes and the key's record in one transaction (`KeyStore.transaction`,
  and the FastAPI dependency in onceflow.receiver.fastapi), or records answers around any ASGI app
  (onceflow.receiver.asgi.IdempotencyMiddleware);
- serves the reconcile protocol (lookup, and fence: absent becomes "never"), so that onceflow
  settles a tool's unknown calls by itself (`external(receiver=kit_receiver(...))`);
- does the same for MCP servers, with the key in `_meta` (onceflow.receiver.mcp).

Install with `pip install 'onceflow[receiver]'` (FastAPI/Starlette; asyncpg comes with onceflow).
This module imports neither: plain asyncpg code can use the store alone. See docs/receivers.md.
"""

from onceflow.receiver.keys import (
    KEY_HEADER,
    MAX_KEY_LENGTH,
    BadKeyError,
    RequestShape,
    check_key,
    key_header_value,
    parse_key_header,
)
from onceflow.receiver.records import (
    EXPIRES_HEADER,
    REPLAYED_HEADER,
    ExpiryPolicy,
    KeyRecord,
    KeyState,
    Refusal,
    StoredResponse,
)
from onceflow.receiver.store import (
    FenceResult,
    KeyedTransaction,
    KeyNotRecordedError,
    KeyStore,
    migrate_receiver,
)

__all__ = [
    "EXPIRES_HEADER",
    "KEY_HEADER",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "BadKeyError",
    "ExpiryPolicy",
    "FenceResult",
    "KeyNotRecordedError",
    "KeyRecord",
    "KeyState",
    "KeyStore",
    "KeyedTransaction",
    "Refusal",
    "RequestShape",
    "StoredResponse",
    "check_key",
    "key_header_value",
    "migrate_receiver",
    "parse_key_header",
]
