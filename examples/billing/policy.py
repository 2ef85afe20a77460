"""The billing example's one policy rule: a credit above the authorization limit is refused.

A refusal on policy grounds is not a fault and not a rejection of this request's shape: it says the
service will not do this, whoever asks and however often. Its problem type lives under `policy/`,
so a client can tell it from every other "no" without reading the text. The HTTP service and the
MCP server apply the same rule.
"""

from __future__ import annotations

# $500.00. Seeded orders are 1000..9999 cents, so only a credit asked for on purpose meets it.
DEFAULT_CREDIT_LIMIT_CENTS = 50_000

# Problem types of policy refusals start with this (see examples/billing/problems.py for the base).
POLICY_PROBLEM_PREFIX = "https://billing.example/problems/policy/"
CREDIT_LIMIT_SLUG = "policy/credit-limit"


def over_credit_limit(amount_cents: int, limit_cents: int) -> str | None:
    """Why this credit is refused, or None when it is within the limit."""
    if amount_cents <= limit_cents:
        return None
    return (
        f"a credit of {amount_cents} cents is above the authorization limit of {limit_cents} cents "
        "per credit; it was not applied, and will not be"
    )
