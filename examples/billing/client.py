"""An async client for the example billing service, with one exception per kind of answer.

What an exception means for the effect:
    BillingBadRequest (400), BillingConflict (409), BillingRejected (422), BillingLocked (423):
        a definite no; nothing was applied for this request.
    BillingPolicyRefused (a problem type under `…/problems/policy/`, e.g. 403 credit-limit): a
        refusal on policy grounds; nothing was applied, and asking again will not change it.
    BillingNotFound (404): the thing asked for does not exist.
    BillingKeyInProgress (from `fence_key`): a request with the key is being handled right now; ask
        again later.
    BillingUnavailable (5xx): this service's own 503 applies nothing, but in general a 5xx from a
        gateway can hide an applied effect; the caller decides.
    httpx.TimeoutException, httpx.TransportError (e.g. RemoteProtocolError on a dropped connection):
        propagate untouched, because nobody knows whether the effect happened.
"""

from __future__ import annotations

import functools
import ssl
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from onceflow.examples.billing.models import (
    Credit,
    Effect,
    Effects,
    FaultMode,
    Order,
    ReceivedByKey,
    ReceivedCounts,
)
from onceflow.examples.billing.policy import POLICY_PROBLEM_PREFIX
from onceflow.receiver import key_header_value


class BillingError(Exception):
    """An error answer from the billing service; `problem` is its problem document."""

    status_code: int = 0

    def __init__(self, detail: str, *, status_code: int | None = None, problem: dict[str, Any] | None = None):
        super().__init__(detail)
        self.detail = detail
        if status_code is not None:
            self.status_code = status_code
        self.problem: dict[str, Any] = problem or {}


class BillingBadRequest(BillingError):
    """400: the request was malformed (e.g. no Idempotency-Key); nothing was applied."""

    status_code = 400


class BillingNotFound(BillingError):
    """404: no such order or credit."""

    status_code = 404


class BillingConflict(BillingError):
    """409: the idempotency key was already used with a different body; nothing was applied."""

    status_code = 409


class BillingRejected(BillingError):
    """422: the service said no (e.g. account closed); nothing was applied."""

    status_code = 422


class BillingLocked(BillingError):
    """423: the account is locked; nothing was applied."""

    status_code = 423


class BillingPolicyRefused(BillingError):
    """The service will not do this on policy grounds (e.g. above the authorization limit); final."""

    status_code = 403


class BillingKeyInProgress(BillingError):
    """The fence found a request with the key in progress: nothing was decided, ask again."""

    status_code = 409


class BillingUnavailable(BillingError):
    """5xx: the service failed to answer properly."""

    status_code = 503


_ERRORS: dict[int, type[BillingError]] = {
    400: BillingBadRequest,
    404: BillingNotFound,
    409: BillingConflict,
    422: BillingRejected,
    423: BillingLocked,
}


def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    detail = str(problem.get("detail") or response.reason_phrase or response.status_code)
    status = response.status_code
    error = BillingUnavailable if status >= 500 else _ERRORS.get(status, BillingError)
    if str(problem.get("type", "")).startswith(POLICY_PROBLEM_PREFIX):
        error = BillingPolicyRefused
    raise error(detail, status_code=status, problem=problem)


def _segment(value: str) -> str:
    # Keys look like "<run_id>:<tool_call_id>" and may hold anything; quote every reserved character.
    return quote(value, safe="")


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # httpx builds a fresh context (loading the CA bundle, ~20 ms) for every client unless given one.
    return httpx.create_ssl_context()


class BillingClient:
    """The billing service over HTTP. One instance holds a connection pool: close it with aclose()."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, verify=_ssl_context())

    async def __aenter__(self) -> BillingClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def health(self) -> bool:
        """True when the service answers its health check."""
        response = await self._http.get("/health")
        _raise_for_status(response)
        return bool(response.json().get("ok"))

    async def dedups(self) -> bool:
        """Whether the service honours idempotency keys (False when started with `--no-dedup`)."""
        response = await self._http.get("/health")
        _raise_for_status(response)
        return bool(response.json().get("dedup", True))

    async def get_order(self, order_id: str) -> Order:
        """The order; BillingNotFound for an id not of the form `ord_<suffix>`."""
        response = await self._http.get(f"/orders/{_segment(order_id)}")
        _raise_for_status(response)
        return Order.model_validate(response.json())

    async def credit(
        self,
        account_id: str,
        amount_cents: int,
        *,
        idempotency_key: str,
        currency: str = "USD",
        memo: str | None = None,
        fault: FaultMode | str | None = None,
        fault_delay: float | None = None,
    ) -> Credit:
        """Apply a credit once for `idempotency_key`; a repeat returns the first answer's credit.

        `fault` (and `fault_delay`, seconds) ask this one request to misbehave (X-Fault headers).
        """
        # The draft's header is a Structured Field string: the key travels in double quotes.
        headers = {"Idempotency-Key": key_header_value(idempotency_key)}
        if fault is not None:
            headers["X-Fault"] = str(fault)
        if fault_delay is not None:
            headers["X-Fault-Delay"] = str(fault_delay)
        body: dict[str, Any] = {"account_id": account_id, "amount_cents": amount_cents, "currency": currency}
        if memo is not None:
            body["memo"] = memo
        response = await self._http.post("/credits", json=body, headers=headers)
        _raise_for_status(response)
        return Credit.model_validate(response.json())

    async def find_credit(self, idempotency_key: str) -> dict[str, Any] | None:
        """The credit applied for a key as a JSON dict (see `Credit`), or None: the reconcile question."""
        response = await self._http.get(f"/credits/by-key/{_segment(idempotency_key)}")
        if response.status_code == 404:
            return None
        _raise_for_status(response)
        return Credit.model_validate(response.json()).model_dump(mode="json")

    async def lookup_key(self, idempotency_key: str) -> dict[str, Any]:
        """The receiver kit's lookup: `{"key", "state": completed|in_progress|fenced|absent,
        "response"?: {"status", "headers", "body"}}`. Read-only."""
        response = await self._http.get(f"/idempotency-keys/{_segment(idempotency_key)}")
        _raise_for_status(response)
        answer: dict[str, Any] = response.json()
        return answer

    async def fence_key(self, idempotency_key: str) -> dict[str, Any] | None:
        """The credit for `key` if it landed; otherwise fence the key so it never can, and return
        None. Raises BillingKeyInProgress while a request with the key is being handled."""
        response = await self._http.post(f"/idempotency-keys/{_segment(idempotency_key)}/fence")
        _raise_for_status(response)
        answer = response.json()
        if answer["state"] == "in_progress":
            raise BillingKeyInProgress(
                f"a request with key {idempotency_key!r} is in progress", problem=answer
            )
        if answer["state"] == "fenced":
            return None
        return Credit.model_validate(answer["response"]["body"]).model_dump(mode="json")

    async def void_credit(self, credit_id: str, *, idempotency_key: str) -> Credit:
        """Void a credit (compensation); voiding again returns the same voided credit."""
        response = await self._http.post(
            f"/credits/{_segment(credit_id)}/void",
            headers={"Idempotency-Key": key_header_value(idempotency_key)},
        )
        _raise_for_status(response)
        return Credit.model_validate(response.json())

    async def credits(self, account_id: str | None = None) -> list[Credit]:
        """Every credit billing applied (voided ones too), oldest first; one account's if given."""
        params = {"account_id": account_id} if account_id else None
        response = await self._http.get("/credits", params=params)
        _raise_for_status(response)
        return [Credit.model_validate(item) for item in response.json()]

    async def effects(self) -> Effects:
        """Applications per idempotency key, for tests: `(await c.effects()).count(key)`."""
        response = await self._http.get("/effects")
        _raise_for_status(response)
        return Effects.model_validate(response.json())

    async def effect(self, idempotency_key: str) -> Effect:
        """Applications of one key and whether its credit was voided."""
        response = await self._http.get(f"/effects/{_segment(idempotency_key)}")
        _raise_for_status(response)
        return Effect.model_validate(response.json())

    async def received(self, idempotency_key: str) -> ReceivedByKey:
        """Every request that arrived with this key, whatever the service made of it, oldest first."""
        response = await self._http.get(f"/requests/by-key/{_segment(idempotency_key)}")
        _raise_for_status(response)
        return ReceivedByKey.model_validate(response.json())

    async def received_counts(
        self, method: str | None = "POST", path: str | None = "/credits", *, prefix: str | None = None
    ) -> ReceivedCounts:
        """Requests received per key; by default credit requests (`POST /credits`):
        `(await c.received_counts()).count(key)`. Pass `method=None, path=None` for every request."""
        params = {
            name: value for name, value in (("method", method), ("path", path), ("prefix", prefix)) if value
        }
        response = await self._http.get("/requests", params=params)
        _raise_for_status(response)
        return ReceivedCounts.model_validate(response.json())

    async def set_account_fault(
        self,
        account_id: str,
        mode: FaultMode | str,
        delay_seconds: float | None = None,
        times: int | None = None,
        *,
        detail: str | None = None,
    ) -> None:
        """Make `POST /credits` for this account misbehave, for `times` requests (None: until cleared)."""
        body = {"mode": str(mode), "delay_seconds": delay_seconds, "times": times, "detail": detail}
        response = await self._http.put(f"/faults/accounts/{_segment(account_id)}", json=body)
        _raise_for_status(response)

    async def clear_account_fault(self, account_id: str) -> None:
        """Heal one account."""
        response = await self._http.delete(f"/faults/accounts/{_segment(account_id)}")
        _raise_for_status(response)

    async def clear_faults(self) -> None:
        """Heal every account."""
        response = await self._http.delete("/faults")
        _raise_for_status(response)
