"""What a failed model call means for the run: try again later, or stop now and say why.

Temporal's retry policy is the only retry loop (the SDKs get `max_retries=0`), so every provider
error becomes an `ApplicationError` here. Retryable: rate limits (with the provider's Retry-After as
the next delay), 408/409, 5xx and Anthropic's 529 "overloaded", timeouts and connection errors; they
are tried again with backoff until the agent's `retry_budget` is spent. Not retryable: bad request,
authentication, permission, not found, unprocessable, and a conversation too long for the model's
context; the run fails at once with a message naming the provider, the model and the cause.

The message never carries a key: the provider's own text is scrubbed of every secret the client
was built with, and of anything shaped like a key, before it goes anywhere.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import timedelta
from email.utils import parsedate_to_datetime

from temporalio.exceptions import ApplicationError

# ApplicationError types, so that callers (and tests) can tell the causes apart.
ERR_MODEL_UNAVAILABLE = "ModelUnavailable"  # retryable: 5xx, overloaded, timeout, connection
ERR_MODEL_RATE_LIMITED = "ModelRateLimited"  # retryable, after the provider's Retry-After
ERR_MODEL_REJECTED = "ModelRequestRejected"  # not retryable: 4xx
ERR_MODEL_CONTEXT_TOO_LONG = "ModelContextTooLong"  # not retryable
ERR_MODEL_ANSWER_UNREADABLE = "ModelAnswerUnreadable"  # retryable: the answer had no usable shape

# A Retry-After longer than this is taken as this: the budget, not the provider, bounds the wait.
MAX_RETRY_AFTER = timedelta(minutes=5)
_KEY_SHAPED = re.compile(r"\b(?:sk|pk|key|ak)[-_][A-Za-z0-9_\-*.]{6,}|Bearer\s+\S+", re.IGNORECASE)
_CONTEXT_TOO_LONG = re.compile(
    r"context_length_exceeded|prompt is too long|maximum context length|context window|too many tokens",
    re.IGNORECASE,
)
_CAUSES = {
    400: "bad request",
    401: "authentication failed",
    403: "permission denied",
    404: "not found (check the model name and base_url)",
    413: "request too large",
    422: "unprocessable request",
}
_DETAIL_LIMIT = 500


def scrub(text: str, secrets: list[str]) -> str:
    """`text` without any of `secrets` and without anything shaped like an API key."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    return _KEY_SHAPED.sub("[redacted]", text)


def retry_after(headers: Mapping[str, str]) -> timedelta | None:
    """The provider's requested pause: `retry-after-ms`, else `retry-after` in seconds or as a date."""
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            delay = timedelta(milliseconds=float(lowered["retry-after-ms"]))
        elif "retry-after" in lowered:
            value = lowered["retry-after"].strip()
            try:
                delay = timedelta(seconds=float(value))
            except ValueError:
                delay = timedelta(seconds=parsedate_to_datetime(value).timestamp() - time.time())
        else:
            return None
    except (ValueError, TypeError, OverflowError):
        return None
    if delay <= timedelta(0):
        return None
    return min(delay, MAX_RETRY_AFTER)


def status_error(
    provider: str,
    model: str,
    status: int,
    detail: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    secrets: list[str],
) -> ApplicationError:
    """The provider answered with an HTTP error status."""
    detail = scrub(detail, secrets)[:_DETAIL_LIMIT]
    where = f"{provider} model {model}"
    if status == 429:
        delay = retry_after(headers or {})
        return ApplicationError(
            f"{where}: rate limited (429): {detail}",
            type=ERR_MODEL_RATE_LIMITED,
            next_retry_delay=delay,
        )
    if status in (408, 409) or status >= 500:
        cause = "overloaded" if status == 529 else "unavailable"
        delay = retry_after(headers or {})
        return ApplicationError(
            f"{where}: {cause} ({status}): {detail}", type=ERR_MODEL_UNAVAILABLE, next_retry_delay=delay
        )
    if status in (400, 413, 422) and _CONTEXT_TOO_LONG.search(f"{code or ''} {detail}"):
        return ApplicationError(
            f"{where}: the conversation is too long for the model's context ({status}): {detail}",
            type=ERR_MODEL_CONTEXT_TOO_LONG,
            non_retryable=True,
        )
    cause = _CAUSES.get(status, "refused the request")
    return ApplicationError(
        f"{where}: {cause} ({status}): {detail}", type=ERR_MODEL_REJECTED, non_retryable=True
    )


def transport_error(
    provider: str, model: str, *, timed_out: bool, detail: str, secrets: list[str]
) -> ApplicationError:
    """No HTTP answer: the request timed out or never connected. Either way, try again."""
    cause = "timed out" if timed_out else "could not be reached"
    return ApplicationError(
        f"{provider} model {model}: {cause}: {scrub(detail, secrets)[:_DETAIL_LIMIT]}",
        type=ERR_MODEL_UNAVAILABLE,
    )


def unreadable_answer(provider: str, model: str, detail: str, *, secrets: list[str]) -> ApplicationError:
    return ApplicationError(
        f"{provider} model {model}: the answer could not be read: {scrub(detail, secrets)[:_DETAIL_LIMIT]}",
        type=ERR_MODEL_ANSWER_UNREADABLE,
    )
