"""What the key store knows about a key, the answers it keeps, and how it refuses a request.

No web framework here: the HTTP forms (asgi.py, fastapi.py) and the MCP form (mcp.py) turn these
into their own answers; the reconcile protocol's JSON (`KeyRecord.protocol()`) is the same for all.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import format_datetime
from enum import StrEnum
from typing import Any

from onceflow.receiver.keys import KEY_HEADER, MAX_KEY_LENGTH, is_json_media_type

REPLAYED_HEADER = "Idempotent-Replayed"
EXPIRES_HEADER = "Idempotency-Key-Expires"
DEFAULT_LIFETIME = timedelta(hours=24)


class KeyState(StrEnum):
    """A key's state as the reconcile protocol reports it."""

    IN_PROGRESS = "in_progress"  # a request with it is being handled (or its handler died: unknown)
    COMPLETED = "completed"  # answered; the answer is kept
    FENCED = "fenced"  # never applied, and never will be
    ABSENT = "absent"  # no record at all (the protocol's "no record")


@dataclass(frozen=True)
class ExpiryPolicy:
    """How long a completed key's answer is honoured, counted from the key's first use.

    Published in the OpenAPI description of every keyed route and, per answer, in the
    `Idempotency-Key-Expires` response header; enforced by the store (an expired answer is no longer
    replayed: a request with the key is then a new request). A fence never expires, and a claim the
    middleware left in progress (its handler died) stays unknown until someone releases it.
    """

    lifetime: timedelta = DEFAULT_LIFETIME
    retry_after_seconds: int = 1  # told to a request that meets its key in progress (409)

    def __post_init__(self) -> None:
        if self.lifetime <= timedelta(0):
            raise ValueError("the lifetime of a key must be positive")
        if self.retry_after_seconds < 1:
            raise ValueError("Retry-After must be at least one second")

    def describe(self) -> str:
        """The policy in words, for an API's documentation."""
        return (
            f"Requires an `{KEY_HEADER}` header: a Structured Field string of 1 to {MAX_KEY_LENGTH} "
            f'printable ASCII characters ("<key>", draft-ietf-httpapi-idempotency-key-header-07). '
            "A key is bound to the request's fingerprint (SHA-256 of method, path and canonical body). "
            "A repeat with the same key and fingerprint gets the first answer again, marked "
            f"`{REPLAYED_HEADER}: true`; another fingerprint gets 422; a repeat while the first is in "
            "progress gets 409 with Retry-After. Keys expire "
            f"{_duration(self.lifetime)} after their first use (each answer says when, in "
            f"`{EXPIRES_HEADER}`); after that a request with the key is a new request. A key fenced by "
            "a reconciler is refused for good (409, key-fenced)."
        )

    def openapi(self) -> dict[str, Any]:
        """The same, machine-readable: the `x-idempotency-key` extension of a keyed operation."""
        return {
            "header": KEY_HEADER,
            "required": True,
            "format": "structured-field-string",
            "max_length": MAX_KEY_LENGTH,
            "expires_after_seconds": int(self.lifetime.total_seconds()),
            "fingerprint": "sha256(method, path, RFC 8785 canonical JSON body or raw body)",
            "replay_header": REPLAYED_HEADER,
            "expiry_header": EXPIRES_HEADER,
        }


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    # Days only from two on: "24 hours" reads better than "1 day" for the usual policy.
    for unit, size, least in (("days", 86400, 2), ("hours", 3600, 1), ("minutes", 60, 1)):
        if seconds % size == 0 and seconds >= size * least:
            count = seconds // size
            return f"{count} {unit if count > 1 else unit[:-1]}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def http_date(moment: datetime) -> str:
    """An HTTP-date (IMF-fixdate), as `Expires` and `Retry-After` write one."""
    return format_datetime(moment, usegmt=True)


@dataclass(frozen=True)
class StoredResponse:
    """An answer as the key store keeps it: status, the headers chosen to keep, and the body."""

    status: int
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((value for key, value in self.headers if key.lower() == lowered), None)

    def body_value(self) -> tuple[str, Any]:
        """("json", value) for a JSON body, ("text", str) for UTF-8 text, else ("base64", str)."""
        if is_json_media_type(self.header("content-type")):
            try:
                return "json", json.loads(self.body)
            except ValueError:
                pass
        try:
            return "text", self.body.decode()
        except UnicodeDecodeError:
            return "base64", base64.b64encode(self.body).decode()

    def protocol(self) -> dict[str, Any]:
        kind, value = self.body_value()
        body_key = {"json": "body", "text": "body_text", "base64": "body_base64"}[kind]
        return {"status": self.status, "headers": [list(pair) for pair in self.headers], body_key: value}


@dataclass(frozen=True)
class KeyRecord:
    """One key within one scope, as the store holds it (state ABSENT: no row)."""

    scope: str
    key: str
    state: KeyState
    fingerprint: str | None = None
    method: str | None = None
    path: str | None = None
    response: StoredResponse | None = None
    created_at: datetime | None = None
    completed_at: datetime | None = None
    expires_at: datetime | None = None
    expired: bool = False

    @classmethod
    def absent(cls, scope: str, key: str) -> KeyRecord:
        return cls(scope, key, KeyState.ABSENT)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> KeyRecord:
        """From a row of onceflow_receiver_keys (an asyncpg Record)."""
        response = None
        if row["response_status"] is not None:
            headers = row["response_headers"]
            if isinstance(headers, str):
                headers = json.loads(headers)
            response = StoredResponse(
                row["response_status"],
                tuple((str(k), str(v)) for k, v in headers),
                row["response_body"] or b"",
            )
        return cls(
            scope=row["scope"],
            key=row["key"],
            state=KeyState(row["state"]),
            fingerprint=row["fingerprint"],
            method=row["method"],
            path=row["path"],
            response=response,
            created_at=row["created_at"],
            completed_at=row["completed_at"],
            expires_at=row["expires_at"],
            expired=bool(row["expired"]),
        )

    def protocol(self, **extra: Any) -> dict[str, Any]:
        """The reconcile protocol's answer about this key (lookup and fence answer the same shape)."""
        answer: dict[str, Any] = {"key": self.key, "state": self.state.value}
        if self.response is not None:
            answer["response"] = self.response.protocol()
        for name in ("created_at", "completed_at", "expires_at"):
            moment = getattr(self, name)
            if moment is not None:
                answer[name] = moment.isoformat()
        if self.expired:
            answer["expired"] = True  # completed, but no longer replayed
        return {**answer, **extra}


@dataclass(eq=False)
class Refusal(Exception):
    """A request the kit answers itself, with a problem document: it was not applied."""

    status: int
    slug: str
    title: str
    detail: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.detail)

    def problem(self, type_base: str) -> dict[str, Any]:
        return {
            "type": type_base + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }


def missing_key() -> Refusal:
    return Refusal(
        400,
        "missing-key",
        "Idempotency-Key is missing",
        f'this operation requires an {KEY_HEADER} header, e.g. {KEY_HEADER}: "<a unique key>"; '
        "nothing was applied",
    )


def bad_key(reason: str) -> Refusal:
    return Refusal(400, "bad-key", "Idempotency-Key is not valid", f"{reason}; nothing was applied")


def key_reused(key: str) -> Refusal:
    return Refusal(
        422,
        "key-reused",
        "Idempotency-Key is already used",
        f"key {key!r} was first used for a different request (method, path or body); nothing was applied",
    )


def key_in_progress(key: str, retry_after: int) -> Refusal:
    return Refusal(
        409,
        "key-in-progress",
        "A request is outstanding for this Idempotency-Key",
        f"a request with key {key!r} is being handled; try again later",
        headers={"Retry-After": str(retry_after)},
    )


def key_fenced(key: str) -> Refusal:
    return Refusal(
        409,
        "key-fenced",
        "Idempotency-Key fenced",
        f"key {key!r} was fenced by a reconciler that found no record of it; it will never be applied",
    )
