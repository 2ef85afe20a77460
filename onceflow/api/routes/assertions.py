"""Operator assertions: what a signed-in operator sends with a `resolve` signal when a deployment
lets signals settle calls only with one (ONCEFLOW_SIGNALS=verified; activities/signal_door.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter

from onceflow.activities.signal_door import Assertion, sign
from onceflow.api import errors
from onceflow.api.auth import Operator
from onceflow.api.models import AssertionRequest, AssertionResponse
from onceflow.api.problems import Problem
from onceflow.api.routes.params import JSON, Key, check_key
from onceflow.ledger import Ledger, RecordNotFoundError


def router(*, ledger: Ledger, signal_key: str) -> APIRouter:
    routes = APIRouter()

    @routes.post("/v1/tool-executions/{key}/assertion", response_model=AssertionResponse, dependencies=JSON)
    async def assertion(key: Key, body: AssertionRequest, operator: Operator) -> AssertionResponse:
        """Sign an operator assertion for one of your tenant's calls, for a `resolve` signal or
        update sent to its run from outside this API (the `temporal` CLI, a script). It lets that
        resolve settle this key as you, recorded `signal:<you>`, until it expires; the ledger's
        compare-and-set still decides, so it settles at most once. 409 `assertions-unavailable`
        when this API has no ONCEFLOW_SIGNAL_KEY."""
        if not signal_key:
            raise Problem(
                409,
                "assertions-unavailable",
                "Assertions unavailable",
                "this operator API has no ONCEFLOW_SIGNAL_KEY, so it signs no assertions; settle the "
                "call through this API instead (POST .../resolve)",
            )
        try:
            record = await ledger.get(check_key(key), with_events=False, tenant=operator.tenant)
        except RecordNotFoundError:
            raise errors.not_found(key) from None
        expires_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=body.expires_in)
        vouched = Assertion(
            tenant=operator.tenant, key=record.key, operator=operator.operator, expires_at=expires_at
        )
        return AssertionResponse(
            key=record.key,
            tenant=operator.tenant,
            operator=operator.operator,
            expires_at=expires_at,
            assertion=sign(signal_key, vouched),
        )

    return routes
