"""Sign-in attempts, throttled per client and per token prefix: a few a second, then wait.

Each key (a client's address, or the first characters of the token tried) has a bucket of `burst`
attempts that refills at `per_second`. An attempt takes one before anything is looked up, so many
attempts sent at once are counted at once; a sign-in that works gives its attempts back, so an
operator who types the right token is never held up by having typed it before.

The buckets live in the API process: several API replicas each throttle on their own, which still
bounds the attempts per second to a few per replica. At most `max_keys` keys are kept; when full,
the ones that have refilled (which would let an attempt through anyway) are dropped first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    at: float


class SignInThrottle:
    def __init__(
        self,
        *,
        burst: int = 5,
        per_second: float = 1.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> float:
        """Take one attempt for `key`: 0 when it may go ahead, else the seconds until it may."""
        now = self._clock()
        bucket = self._refilled(key, now)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.per_second

    def give_back(self, key: str) -> None:
        """The attempt worked: it does not count."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(self.burst, bucket.tokens + 1)

    def _refilled(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(tokens=self.burst, at=now)
            return bucket
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.per_second)
        bucket.at = now
        return bucket

    def _forget_full(self, now: float) -> None:
        full = [
            key
            for key, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.at) * self.per_second >= self.burst
        ]
        for key in full or list(self._buckets)[: max(1, self.max_keys // 10)]:
            del self._buckets[key]


def retry_after(seconds: float) -> str:
    """The Retry-After header's value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
