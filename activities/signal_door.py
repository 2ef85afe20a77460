"""The signal door: who may settle a call with a `resolve` signal or update sent from outside the API.

Anyone who can reach Temporal can signal a run. The operator API never needs to settle that way (it
settles in the ledger itself and then only nudges the run, with a resolve that carries no status),
so a resolve that carries a status is someone at the side door. The deployment says what it lets in
(ONCEFLOW_SIGNALS):

- `open`: any resolve, as before; the name it carries is recorded as `signal:<name>`, unchecked.
  `onceflow dev` runs open.
- `verified` (the default of `onceflow worker`, and of docker-compose.yml): only a resolve with an
  operator assertion the API signed, for this tenant and this key, not yet expired. It is then
  recorded as `signal:<the operator the API named>`. Anything else changes nothing: the run logs
  the refusal and shows it as `last_resolve_error` in its `status` query; an update is answered
  with the refusal.

An assertion is `ofa1.<payload>.<signature>`: the payload is the JSON of tenant, key, operator and
expiry (a Unix time), base64url; the signature is HMAC-SHA256 over the version and the payload,
keyed by ONCEFLOW_SIGNAL_KEY, which the API and the workers share and nobody else holds. It names no
token and grants nothing but this one settlement, until it expires. `POST
/v1/tool-executions/{key}/assertion` (or `onceflow executions assertion KEY`) makes one for the
signed-in operator. Temporal's own authorization (namespaces, a claim mapper and authorizer on the
frontend) is what decides who can reach Temporal at all; this door only decides what a signal that
got through may change.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

VERSION = "ofa1"
SHORTEST_KEY = 32  # characters of ONCEFLOW_SIGNAL_KEY
LONGEST_VALIDITY = timedelta(hours=1)


class SignalsMode(StrEnum):
    OPEN = "open"
    VERIFIED = "verified"


class SignalRefused(Exception):
    """A resolve the door does not let through; the message says why, and changes nothing."""


@dataclass(frozen=True)
class Assertion:
    """What the API vouches for: this operator of this tenant may settle this key, until `expires_at`."""

    tenant: str
    key: str
    operator: str
    expires_at: datetime


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    # validate: a character outside the alphabet is an error, not skipped
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def check_key(secret: str) -> bytes:
    """The signing key from ONCEFLOW_SIGNAL_KEY; too short a secret is refused."""
    if len(secret) < SHORTEST_KEY:
        raise ValueError(
            f"ONCEFLOW_SIGNAL_KEY must be at least {SHORTEST_KEY} characters "
            "(for example `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return secret.encode()


def _signature(key: bytes, payload: str) -> bytes:
    return hmac.new(key, f"{VERSION}.{payload}".encode(), hashlib.sha256).digest()


def sign(secret: str, assertion: Assertion) -> str:
    """The assertion as text a resolve carries in its `assertion` field."""
    claims = {
        "tenant": assertion.tenant,
        "key": assertion.key,
        "operator": assertion.operator,
        "exp": int(assertion.expires_at.timestamp()),
    }
    payload = _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
    return f"{VERSION}.{payload}.{_b64(_signature(check_key(secret), payload))}"


def read(secret: str, text: str) -> Assertion:
    """The assertion `text` carries, if its signature is this key's; it is not checked against any
    call or clock here (`SignalDoor.admit` does)."""
    version, _, rest = text.strip().partition(".")
    payload, _, signature = rest.partition(".")
    if version != VERSION or not payload or not signature:
        raise SignalRefused("the operator assertion is malformed")
    try:
        given = _unb64(signature)
    except (binascii.Error, ValueError):
        raise SignalRefused("the operator assertion is malformed") from None
    if not hmac.compare_digest(given, _signature(check_key(secret), payload)):
        raise SignalRefused(
            "the operator assertion's signature does not match: forged, or signed with another key"
        )
    try:
        claims = json.loads(_unb64(payload))
        return Assertion(
            tenant=str(claims["tenant"]),
            key=str(claims["key"]),
            operator=str(claims["operator"]),
            expires_at=datetime.fromtimestamp(int(claims["exp"]), UTC),
        )
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise SignalRefused("the operator assertion is malformed") from None


@dataclass(frozen=True)
class SignalDoor:
    """What a worker lets through: `mode`, and the key it checks assertions with ("" for none)."""

    mode: SignalsMode = SignalsMode.OPEN
    key: str = ""

    @classmethod
    def from_settings(cls, mode: str, key: str) -> SignalDoor:
        """From ONCEFLOW_SIGNALS and ONCEFLOW_SIGNAL_KEY; a wrong value is a ValueError that names it."""
        try:
            chosen = SignalsMode(mode.strip().lower())
        except ValueError:
            raise ValueError(f"ONCEFLOW_SIGNALS must be `open` or `verified`, not {mode!r}") from None
        if key:
            check_key(key)
        return cls(chosen, key)

    def admit(self, *, tenant: str, key: str, assertion: str | None, now: datetime) -> str | None:
        """May a resolve that settles `key` of `tenant` go through? The operator an assertion names
        (None: no assertion, on an open door); SignalRefused otherwise."""
        if not assertion:
            if self.mode is SignalsMode.OPEN:
                return None
            raise SignalRefused(
                "this deployment settles a call from a signal only with an operator assertion "
                "(ONCEFLOW_SIGNALS=verified): settle it through the operator API or the console, or "
                "send the assertion `onceflow executions assertion KEY` prints"
            )
        if not self.key:
            raise SignalRefused(
                "this worker has no ONCEFLOW_SIGNAL_KEY, so it cannot check an operator assertion"
            )
        vouched = read(self.key, assertion)
        if (vouched.tenant, vouched.key) != (tenant, key):
            raise SignalRefused("the operator assertion is for another call (its tenant or key differ)")
        if vouched.expires_at <= now:
            raise SignalRefused(f"the operator assertion expired at {vouched.expires_at.isoformat()}")
        return vouched.operator
