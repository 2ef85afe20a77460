"""Operator tokens: a bearer secret maps to one tenant and one operator. Only its SHA-256 is stored.

The secret is printed once, when it is created; losing it means creating another and revoking the
old one. Tokens are 32 random bytes, so a plain SHA-256 is enough to make the stored form useless
to someone who reads the table (no password-style stretching is needed for random secrets).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase, require_text
from onceflow.ledger.errors import LedgerError

TOKEN_PREFIX = "oft_"
# What `create` draws: the prefix and 32 random bytes, URL-safe base64 without padding (43 characters).
TOKEN_SHAPE = re.compile(r"oft_[A-Za-z0-9_-]{43}")
TOKEN_LENGTH = 47


class TokenNotFoundError(LedgerError):
    def __init__(self, token_id: str) -> None:
        super().__init__(f"no operator token with id {token_id!r}")
        self.token_id = token_id


class OperatorToken(BaseModel):
    """What is stored about a token. The secret itself is not."""

    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    operator: str
    created_at: datetime
    revoked_at: datetime | None = None


def _token(row: Any) -> OperatorToken:
    return OperatorToken(**{k: v for k, v in dict(row).items() if k != "token_sha256"})


def token_sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def looks_like_token(secret: str) -> bool:
    """Could this be a token `create` made? Anything else is refused without asking the database."""
    return TOKEN_SHAPE.fullmatch(secret) is not None


class OperatorTokens:
    def __init__(self, ledger: LedgerBase) -> None:
        self._ledger = ledger

    async def create(self, *, tenant: str, operator: str) -> tuple[OperatorToken, str]:
        """A new token for `operator` in `tenant`; returns what is stored and the secret, once."""
        tenant = require_text(tenant, "creating a token (tenant)")
        operator = require_text(operator, "creating a token (operator)")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = "tok_" + secrets.token_hex(6)
        async with self._ledger.connection("create_token", tenant=tenant) as conn:
            row = await conn.fetchrow(queries.INSERT_TOKEN, token_id, token_sha256(secret), tenant, operator)
        return _token(row), secret

    async def authenticate(self, secret: str) -> OperatorToken | None:
        """The token's owner, or None for an unknown or revoked token. A secret of another shape is
        refused without a query."""
        if not looks_like_token(secret):
            return None
        async with self._ledger.connection("authenticate") as conn:
            row = await conn.fetchrow(queries.SELECT_ACTIVE_TOKEN, token_sha256(secret))
        return None if row is None else _token(row)

    async def revoke(self, token_id: str) -> OperatorToken:
        """Revoke a token by its id. Revoking twice keeps the first revocation time."""
        async with self._ledger.connection("revoke_token") as conn:
            row = await conn.fetchrow(queries.REVOKE_TOKEN, token_id)
        if row is None:
            raise TokenNotFoundError(token_id)
        return _token(row)

    async def list_tokens(self, tenant: str | None = None) -> list[OperatorToken]:
        async with self._ledger.connection("list_tokens", tenant=tenant) as conn:
            rows = await conn.fetch(queries.LIST_TOKENS, tenant)
        return [_token(r) for r in rows]
