"""Console sessions: a signed-in browser holds a random session id; the ledger holds its SHA-256.

A session belongs to one operator token and acts as that token's operator. It ends when the
operator signs out (the row is deleted), when the token is revoked (the revocation deletes its
sessions, and the lookup joins a live token anyway), after `idle` without a request, and in any case
`lifetime` after sign-in. Nothing about a session is kept in the browser but its id, so a copied
cookie is worth nothing once the session has ended, and never worked as an API credential.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from onceflow.ledger import queries
from onceflow.ledger.base import LedgerBase
from onceflow.ledger.tokens import OperatorToken

SESSION_PREFIX = "ocs_"
# What `start` draws: the prefix and 32 random bytes, URL-safe base64 without padding.
_SESSION_SHAPE = re.compile(r"ocs_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class ConsoleSession:
    """A live session: whose it is, and until when."""

    operator: OperatorToken
    csrf: str  # every form's hidden field; derived from the session id, never stored
    created_at: datetime
    idle_expires_at: datetime
    expires_at: datetime


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _csrf_of(secret: str) -> str:
    # Keyed by the session id: a page showing it reveals nothing about the id, and each session
    # (each sign-in) has its own.
    return hmac.new(secret.encode(), b"onceflow-console-csrf", hashlib.sha256).hexdigest()


class ConsoleSessions:
    def __init__(self, ledger: LedgerBase, *, idle: timedelta, lifetime: timedelta) -> None:
        if idle <= timedelta() or lifetime <= timedelta():
            raise ValueError("a console session's idle timeout and lifetime must be above zero")
        self._ledger = ledger
        self.idle = idle
        self.lifetime = lifetime

    async def start(self, operator: OperatorToken) -> tuple[ConsoleSession, str] | None:
        """A new session for this token's operator, and its id (for the cookie, once). None: the
        token was revoked meanwhile."""
        secret = SESSION_PREFIX + secrets.token_urlsafe(32)
        async with self._ledger.connection("start_console_session", tenant=operator.tenant) as conn:
            row = await conn.fetchrow(
                queries.INSERT_CONSOLE_SESSION, _sha256(secret), operator.id, self.idle, self.lifetime
            )
        if row is None:
            return None
        session = ConsoleSession(
            operator=operator,
            csrf=_csrf_of(secret),
            created_at=row["created_at"],
            idle_expires_at=row["idle_expires_at"],
            expires_at=row["expires_at"],
        )
        return session, secret

    async def resume(self, secret: str) -> ConsoleSession | None:
        """The live session this id names (its idle deadline moved on), or None. An id of the wrong
        shape is not looked up."""
        if not _SESSION_SHAPE.fullmatch(secret):
            return None
        async with self._ledger.connection("resume_console_session") as conn:
            row = await conn.fetchrow(queries.TOUCH_CONSOLE_SESSION, _sha256(secret), self.idle)
        if row is None:
            return None
        operator = OperatorToken(
            id=row["id"],
            tenant=row["tenant"],
            operator=row["operator"],
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )
        return ConsoleSession(
            operator=operator,
            csrf=_csrf_of(secret),
            created_at=row["session_created_at"],
            idle_expires_at=row["idle_expires_at"],
            expires_at=row["expires_at"],
        )

    async def end(self, secret: str) -> bool:
        """Sign out: delete the session. False when there was none (already ended)."""
        if not _SESSION_SHAPE.fullmatch(secret):
            return False
        async with self._ledger.connection("end_console_session") as conn:
            row = await conn.fetchrow(queries.DELETE_CONSOLE_SESSION, _sha256(secret))
        return row is not None
