"""Fault injection for `POST /credits`: per request (header) or per account (set through the API).

Per-account faults live in memory only: a restarted service starts healthy, which is what a crash
drill wants after the crash.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from onceflow.examples.billing.models import AccountFault, FaultMode, FaultSpec

FAULT_HEADER = "X-Fault"
FAULT_DELAY_HEADER = "X-Fault-Delay"

DEFAULT_DELAYS = {
    FaultMode.APPLY_THEN_HANG: 30.0,
    FaultMode.SLOW: 2.0,
    # Only used when the server cannot really drop the connection (see serving.py).
    FaultMode.DROP: 300.0,
}
DEFAULT_REJECT_DETAIL = "account closed: the credit was refused"


@dataclass(frozen=True)
class Fault:
    """One request's fault, resolved: the mode plus the delay and detail it will use."""

    mode: FaultMode
    delay_seconds: float = 0.0
    detail: str = DEFAULT_REJECT_DETAIL

    @classmethod
    def of(cls, mode: FaultMode, delay_seconds: float | None = None, detail: str | None = None) -> Fault:
        """A fault with the mode's default delay and detail filled in where none was given."""
        delay = DEFAULT_DELAYS.get(mode, 0.0) if delay_seconds is None else delay_seconds
        return cls(mode, delay, detail or DEFAULT_REJECT_DETAIL)


class FaultBook:
    """Per-account faults, consumed one request at a time when they have a `times` budget."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: dict[str, AccountFault] = {}

    def set(self, account_id: str, spec: FaultSpec) -> AccountFault:
        """Replace the account's fault."""
        fault = AccountFault(
            account_id=account_id,
            mode=spec.mode,
            delay_seconds=spec.delay_seconds,
            times_remaining=spec.times,
            detail=spec.detail,
        )
        with self._lock:
            self._faults[account_id] = fault
        return fault

    def clear(self, account_id: str) -> bool:
        """Remove the account's fault; False if it had none."""
        with self._lock:
            return self._faults.pop(account_id, None) is not None

    def clear_all(self) -> None:
        """Remove every account's fault."""
        with self._lock:
            self._faults.clear()

    def all(self) -> list[AccountFault]:
        """Every account fault still in force."""
        with self._lock:
            return list(self._faults.values())

    def take(self, account_id: str) -> Fault | None:
        """The fault for this request on `account_id`, spending one of its `times` if it is limited."""
        with self._lock:
            fault = self._faults.get(account_id)
            if fault is None:
                return None
            if fault.times_remaining is not None:
                if fault.times_remaining <= 1:
                    del self._faults[account_id]
                else:
                    self._faults[account_id] = fault.model_copy(
                        update={"times_remaining": fault.times_remaining - 1}
                    )
            return Fault.of(fault.mode, fault.delay_seconds, fault.detail)
