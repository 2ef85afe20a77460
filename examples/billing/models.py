"""Wire models of the example billing service, shared by the service and its client."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Orders are not stored: any id of this shape exists and its fields are derived from it, so demos and
# tests can name orders freely and always see the same ones.
ORDER_ID = re.compile(r"^ord_(?P<suffix>[A-Za-z0-9_-]{1,64})$")


class Order(BaseModel):
    """An order as `GET /orders/{order_id}` answers it."""

    order_id: str
    account_id: str
    amount_cents: int
    currency: str
    status: Literal["paid"]


def seeded_order(order_id: str) -> Order | None:
    """The deterministic order for `order_id`, or None when the id is not of the form `ord_<suffix>`."""
    match = ORDER_ID.match(order_id)
    if match is None:
        return None
    # sha256, not hash(): Python's string hash changes per process and orders must not.
    digest = int.from_bytes(hashlib.sha256(order_id.encode()).digest()[:8], "big")
    return Order(
        order_id=order_id,
        account_id=f"acct_{match['suffix']}",
        amount_cents=1000 + digest % 9000,
        currency="USD",
        status="paid",
    )


class CreditRequest(BaseModel):
    """The body of `POST /credits`. Its canonical JSON is what an idempotency key is bound to."""

    model_config = ConfigDict(extra="forbid")

    account_id: str = Field(min_length=1, max_length=128)
    amount_cents: int = Field(gt=0, strict=True)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    memo: str | None = Field(default=None, max_length=500)


class Credit(BaseModel):
    """A credit as the service reports it. `status` becomes "voided" after `POST /credits/{id}/void`."""

    credit_id: str
    account_id: str
    amount_cents: int
    currency: str
    status: Literal["applied", "voided"]
    idempotency_key: str
    created_at: datetime
    memo: str | None = None
    voided_at: datetime | None = None


class FaultMode(StrEnum):
    """How `POST /credits` misbehaves on cue. See the package README for the exact behaviour of each."""

    APPLY_THEN_HANG = "apply_then_hang"
    REJECT = "reject"
    FAIL_BEFORE_APPLY = "fail_before_apply"
    SLOW = "slow"
    LOCKED = "locked"
    DROP = "drop"


class FaultSpec(BaseModel):
    """The body of `PUT /faults/accounts/{account_id}`."""

    model_config = ConfigDict(extra="forbid")

    mode: FaultMode
    delay_seconds: float | None = Field(default=None, ge=0)
    times: int | None = Field(default=None, ge=1, description="How many requests it applies to; None: all.")
    detail: str | None = Field(default=None, description="The problem detail for `reject`.")


class AccountFault(BaseModel):
    """A per-account fault as stored: `times_remaining` None means it never runs out."""

    account_id: str
    mode: FaultMode
    delay_seconds: float | None = None
    times_remaining: int | None = None
    detail: str | None = None


class Effects(BaseModel):
    """`GET /effects`: how many times each key's credit was really applied, and the sum of those."""

    effects: dict[str, int]
    total: int

    def count(self, idempotency_key: str) -> int:
        """Applications recorded for one key (0 when the key never took effect)."""
        return self.effects.get(idempotency_key, 0)


class Effect(BaseModel):
    """`GET /effects/{key}`: applications of one key's credit and whether it was voided since."""

    key: str
    applied: int
    voided: bool


class ReceivedRequest(BaseModel):
    """One request as the service received it, before deciding anything about it.

    `outcome` is derived: `applied` (a credit was applied for it), `answered` (a success that applied
    nothing, e.g. a replay or a read), `refused` (an error answer), `unanswered` (no answer left: the
    connection was dropped, or the service died first).
    """

    method: str
    path: str
    idempotency_key: str | None
    received_at: datetime
    applied: bool
    status_code: int | None

    @property
    def outcome(self) -> str:
        if self.applied:
            return "applied"
        if self.status_code is None:
            return "unanswered"
        return "answered" if self.status_code < 400 else "refused"


class ReceivedByKey(BaseModel):
    """`GET /requests/by-key/{key}`: every request that carried the key, oldest first."""

    key: str
    received: int
    requests: list[ReceivedRequest]


class ReceivedCounts(BaseModel):
    """`GET /requests`: requests received per Idempotency-Key, those without one, and the sum."""

    counts: dict[str, int]
    keyless: int
    total: int

    def count(self, idempotency_key: str) -> int:
        """Requests received with this key (0 when none arrived)."""
        return self.counts.get(idempotency_key, 0)
