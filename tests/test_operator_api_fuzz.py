"""Schema-driven fuzzing of the operator API as published at /openapi.json (schemathesis).

Requests are generated from the running server's own schema, valid ones and invalid ones, and sent
over HTTP. Whatever they are, the API must never answer 5xx, must answer as its schema says, and
must never change a record its caller had no right to: another tenant's rows and events stay
byte-for-byte the same, and without a valid token nothing changes at all.

Schemathesis is synchronous; the API runs in this test's event loop, so the fuzzing runs in a worker
thread against the real URL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode, Response
from schemathesis.core.result import Ok
from schemathesis.errors import FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData

from onceflow.ledger import CallIdentity, Ledger, SideEffect
from tests.support.guarded import unknown_refund_and_a_held_repeat
from tests.support.operator_api import OperatorApi

# Per operation and generation mode. Six operations, both modes, and a no-token pass fit well
# under a minute on two cores.
EXAMPLES = 30
UNAUTHENTICATED_EXAMPLES = 12
PER_KEY_EXAMPLES = 3
ARGUMENTS = {"account_id": "acct_fuzz", "amount_cents": 900}

Snapshot = tuple[list[dict[str, Any]], list[dict[str, Any]]]


async def seed(ledger: Ledger, tenant: str) -> list[str]:
    """One call in each state an operator can act on (or must be refused), through the ledger's own
    API."""
    keys = []
    for agent, tool, approval, outcome in (
        ("credit-pause", "issue_credit_unreconciled", False, "indeterminate"),
        ("credit-pause", "issue_credit_unreconciled", False, "owner_gone"),
        ("credit-approval", "issue_credit_approved", True, "awaiting_approval"),
        ("credit-undoable", "issue_credit_undoable", False, "completed"),
    ):
        call = CallIdentity(
            tenant=tenant, run_id=f"run-{uuid.uuid4().hex[:10]}", tool_call_id="call_1_0", agent=agent
        )
        lease = timedelta(milliseconds=1) if outcome == "owner_gone" else timedelta(minutes=5)
        await ledger.reserve(
            call,
            tool_name=tool,
            side_effect=SideEffect.EXTERNAL,
            arguments=ARGUMENTS,
            owner="worker-seed",
            approval=approval,
            lease=lease,
        )
        if outcome == "indeterminate":
            await ledger.mark_indeterminate(call.key, actor="inspector", reason="timed out")
        elif outcome == "completed":
            await ledger.complete(call.key, owner="worker-seed", result={"credit_id": "cr_seed"})
        keys.append(call.key)
    # A budgeted credit whose answer was lost, and its repeat held behind it (a tool with a
    # compensation, so that the fuzzer may also undo it once it settled it completed).
    keys.extend(
        await unknown_refund_and_a_held_repeat(
            ledger,
            tenant=tenant,
            agent="credit-undoable",
            tool="issue_credit_undoable",
            arguments=ARGUMENTS,
        )
    )
    return keys


async def snapshot(ledger: Ledger, tenant: str | None = None) -> Snapshot:
    """Every row of a tenant (or of everyone) and every event on those rows, in a stable order."""
    async with ledger.connection("fuzz_snapshot") as conn:
        rows = await conn.fetch(
            "SELECT * FROM tool_executions WHERE $1::text IS NULL OR tenant = $1 ORDER BY key", tenant
        )
        events = await conn.fetch(
            """
            SELECT e.* FROM tool_execution_events e JOIN tool_executions t USING (key)
            WHERE $1::text IS NULL OR t.tenant = $1 ORDER BY e.id
            """,
            tenant,
        )
    return [dict(r) for r in rows], [dict(e) for e in events]


async def first_cursor(ledger: Ledger, tenant: str) -> str:
    page = await ledger.list_unresolved(tenant, limit=1)
    assert page.next_cursor is not None
    return page.next_cursor


@dataclass
class FuzzReport:
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def fail(self, case: Case, why: str) -> None:
        self.failures.append(f"{case.method} {case.operation.path}: {why}\n  {case.as_curl_command()}")


def fuzz(
    url: str,
    token: str | None,
    *,
    examples: int,
    per_key: int,
    keys: list[str],
    cursors: list[str],
    judge: Callable[[Case, Response, FuzzReport], None],
) -> FuzzReport:
    """Send generated requests for every operation and mode; `judge` records what is wrong.

    Valid requests are also aimed at each key that exists (ours and the other tenant's), a few
    times per key, so decisions reach real records; and they page with real cursors (a made-up
    cursor is rightly refused, so it would not be valid input).
    """
    # Given as schemathesis' own auth config, not as a header added to every request, so that the
    # cases it generates *without* credentials (negative testing of the security scheme) stay so.
    auth = {"auth": {"openapi": {"HTTPBearer": {"bearer": token}}}} if token else {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=schemathesis.Config.from_dict(auth))
    report = FuzzReport()
    base = settings(
        derandomize=True,
        database=None,
        deadline=None,
        phases=[HypothesisPhase.explicit, HypothesisPhase.generate],
        suppress_health_check=list(HealthCheck),
    )

    def aimed_at(target: str | None) -> Callable[[Case, str | None], None]:
        def send(case: Case, cursor: str | None) -> None:
            if target is not None:
                case.path_parameters = {**(case.path_parameters or {}), "key": target}
            if cursor is not None and case.query and "cursor" in case.query:
                case.query = {**case.query, "cursor": cursor}
            response = case.call(base_url=url, session=session, timeout=30)
            report.statuses[response.status_code] += 1
            judge(case, response, report)

        return send

    with requests.Session() as session:
        for found in schema.get_all_operations():
            if not isinstance(found, Ok):
                raise found.err()  # the published schema itself is broken
            operation = found.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                positive = mode is GenerationMode.POSITIVE
                targets: list[str | None] = [None]
                if positive and "{key}" in operation.path:
                    targets += keys
                for target in targets:
                    run = settings(base, max_examples=examples if target is None else per_key)
                    cases = operation.as_strategy(generation_mode=mode)
                    pages = st.sampled_from(cursors) if positive else st.none()
                    run(given(case=cases, cursor=pages)(aimed_at(target)))()
    return report


def conforms(case: Case, response: Response, report: FuzzReport) -> None:
    if response.status_code >= 500:
        report.fail(case, f"server error {response.status_code}: {response.text[:300]}")
        return
    try:
        case.validate_response(response)
    except FailureGroup as group:
        for failure in group.exceptions:
            if isinstance(failure, RejectedPositiveData) and (
                refused_nul(response) or needs_evidence(response)
            ):
                continue
            report.fail(
                case,
                f"{failure.title}: {failure.message[:300]} [{response.status_code}] {response.text[:300]}",
            )


def refused_nul(response: Response) -> bool:
    """PostgreSQL cannot store U+0000, so the API refuses it anywhere in evidence or result. The
    schema says so in words only (JSON Schema cannot say it of every string at any depth), so
    generated "valid" JSON may contain it and be rightly refused."""
    return response.status_code == 400 and "NUL (\\u0000)" in response.json().get("detail", "")


def needs_evidence(response: Response) -> bool:
    """Settling a budgeted call as failed needs evidence: a rule of the record the request names
    (does it carry an amount?), which no request schema can express."""
    if response.status_code != 422:
        return False
    return bool(response.json().get("type") == "urn:onceflow:problem:evidence-required")


def unauthorized(case: Case, response: Response, report: FuzzReport) -> None:
    if response.status_code != 401:
        report.fail(case, f"answered {response.status_code} without a valid token: {response.text[:300]}")


async def test_fuzzing_with_a_token_never_fails_and_never_touches_another_tenant(
    operator_api: OperatorApi,
) -> None:
    ledger = operator_api.ledger
    ours = await seed(ledger, "acme")
    theirs = await seed(ledger, "globex")
    globex_before = await snapshot(ledger, "globex")
    acme_rows_before, acme_events_before = await snapshot(ledger, "acme")
    token = await operator_api.token("acme", "fuzzer")
    cursors = [await first_cursor(ledger, tenant) for tenant in ("acme", "globex")]

    report = await asyncio.to_thread(
        fuzz,
        operator_api.url,
        token,
        examples=EXAMPLES,
        per_key=PER_KEY_EXAMPLES,
        keys=ours + theirs,
        cursors=cursors,
        judge=conforms,
    )

    assert report.failures == [], "\n\n".join(report.failures)
    assert await snapshot(ledger, "globex") == globex_before

    # The fuzzer did reach our records (so the check above means something)...
    assert {200, 202, 400, 401, 404, 409} <= set(report.statuses), report.statuses
    acme_rows, acme_events = await snapshot(ledger, "acme")
    assert acme_rows != acme_rows_before
    # ...and every change to them is this operator's decision, or the compensation it asked for.
    seen = {e["id"] for e in acme_events_before}
    added = [e for e in acme_events if e["id"] not in seen]
    assert {e["actor"] for e in added if e["key"] in ours} == {"operator:fuzzer"}
    created = {r["key"] for r in acme_rows} - {r["key"] for r in acme_rows_before}
    assert created <= {f"{key}:compensation" for key in ours}, created


async def test_fuzzing_without_a_valid_token_is_always_401_and_changes_nothing(
    operator_api: OperatorApi,
) -> None:
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme") + await seed(ledger, "globex")
    before = await snapshot(ledger)
    cursors = [await first_cursor(ledger, "acme")]

    for token in (None, "oft_not-a-real-token"):
        report = await asyncio.to_thread(
            fuzz,
            operator_api.url,
            token,
            examples=UNAUTHENTICATED_EXAMPLES,
            per_key=1,
            keys=keys,
            cursors=cursors,
            judge=unauthorized,
        )
        assert report.failures == [], "\n\n".join(report.failures)
        assert set(report.statuses) == {401}

    assert await snapshot(ledger) == before


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/resolve", {"status": "failed", "reason": "a\x00b"}),
        ("/resolve", {"status": "completed", "reason": "ok", "evidence": {"note": "\x00"}}),
        ("/resolve", {"status": "completed", "reason": "ok", "evidence": {"a\x00": 1}}),
        ("/resolve", {"status": "completed", "reason": "ok", "result": [{"x": ["\x00"]}]}),
        ("/deny", {"reason": "\x00"}),
        ("/approve", {"reason": "x\x00"}),
        ("/compensate", {"reason": "x\x00"}),
        ("%00", None),
        ("?tool=%00", None),
        ("?agent=x%00", None),
    ],
)
async def test_text_the_ledger_cannot_store_is_refused_as_bad_input(
    operator_api: OperatorApi, path: str, body: dict[str, Any] | None
) -> None:
    """Found by the fuzzer: NUL reached PostgreSQL and came back as a 500."""
    ledger = operator_api.ledger
    keys = await seed(ledger, "acme")
    before = await snapshot(ledger)
    target = "/v1/tool-executions" + ("" if path.startswith("?") else f"/{keys[0]}") + path
    async with await operator_api.as_operator() as acme:
        response = await (acme.get(target) if body is None else acme.post(target, json=body))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert await snapshot(ledger) == before
