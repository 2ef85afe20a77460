"""How a failed model call is classified: what retries, what stops the run, and that no key leaks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from onceflow.models.errors import (
    ERR_MODEL_CONTEXT_TOO_LONG,
    ERR_MODEL_RATE_LIMITED,
    ERR_MODEL_REJECTED,
    ERR_MODEL_UNAVAILABLE,
    MAX_RETRY_AFTER,
    retry_after,
    scrub,
    status_error,
    transport_error,
)

SECRET = "sk-proj-abcdefghijklmnop1234"


@pytest.mark.parametrize(
    ("status", "kind", "retryable", "cause"),
    [
        (429, ERR_MODEL_RATE_LIMITED, True, "rate limited (429)"),
        (500, ERR_MODEL_UNAVAILABLE, True, "unavailable (500)"),
        (503, ERR_MODEL_UNAVAILABLE, True, "unavailable (503)"),
        (529, ERR_MODEL_UNAVAILABLE, True, "overloaded (529)"),
        (408, ERR_MODEL_UNAVAILABLE, True, "unavailable (408)"),
        (400, ERR_MODEL_REJECTED, False, "bad request (400)"),
        (401, ERR_MODEL_REJECTED, False, "authentication failed (401)"),
        (403, ERR_MODEL_REJECTED, False, "permission denied (403)"),
        (404, ERR_MODEL_REJECTED, False, "not found (check the model name and base_url) (404)"),
        (422, ERR_MODEL_REJECTED, False, "unprocessable request (422)"),
    ],
)
def test_status_codes_are_classified(status: int, kind: str, retryable: bool, cause: str) -> None:
    error = status_error("openai", "gpt-4o-mini", status, "what the provider said", secrets=[])
    assert error.type == kind
    assert error.non_retryable is not retryable
    assert error.message == f"openai model gpt-4o-mini: {cause}: what the provider said"


@pytest.mark.parametrize(
    ("detail", "code"),
    [
        ("This model's maximum context length is 128000 tokens.", "context_length_exceeded"),
        ("prompt is too long: 250000 tokens > 200000 maximum", None),
    ],
)
def test_a_context_too_long_is_not_retried_and_says_so(detail: str, code: str | None) -> None:
    error = status_error("anthropic", "claude", 400, detail, code=code, secrets=[])
    assert error.type == ERR_MODEL_CONTEXT_TOO_LONG
    assert error.non_retryable
    assert "the conversation is too long for the model's context (400)" in str(error)


def test_retry_after_in_milliseconds_seconds_or_a_date_becomes_the_next_delay() -> None:
    assert retry_after({"retry-after-ms": "1500"}) == timedelta(milliseconds=1500)
    assert retry_after({"Retry-After": "3"}) == timedelta(seconds=3)
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    found = retry_after({"retry-after": later})
    assert found is not None and timedelta(seconds=25) < found <= timedelta(seconds=30)
    assert retry_after({"retry-after": "3600"}) == MAX_RETRY_AFTER
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None
    limited = status_error("openai", "m", 429, "slow down", headers={"retry-after": "7"}, secrets=[])
    assert limited.next_retry_delay == timedelta(seconds=7)


def test_timeouts_and_connection_errors_are_retried() -> None:
    timed_out = transport_error("openai", "m", timed_out=True, detail="Request timed out.", secrets=[])
    refused = transport_error("anthropic", "m", timed_out=False, detail="Connection error.", secrets=[])
    assert not timed_out.non_retryable and not refused.non_retryable
    assert timed_out.message == "openai model m: timed out: Request timed out."
    assert refused.message == "anthropic model m: could not be reached: Connection error."


def test_messages_never_carry_a_key() -> None:
    error = status_error(
        "openai",
        "m",
        401,
        f"Incorrect API key provided: {SECRET}. Also sk-ant-api03-XYZ123456789",
        secrets=[SECRET],
    )
    assert SECRET not in str(error)
    assert "sk-ant-api03" not in str(error)
    assert "Incorrect API key provided: [redacted]" in str(error)
    assert scrub("Authorization: Bearer abc.def.ghi", []) == "Authorization: [redacted]"
    assert scrub(f"masked {SECRET[:8]}****{SECRET[-4:]}", [SECRET]) == "masked [redacted]"
