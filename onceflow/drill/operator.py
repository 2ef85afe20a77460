"""The drill as an operator: it walks the conflict runs (RunPath.CONFLICT) through the operator API.

Every decision goes through the real API process the drill starts (`onceflow api`, processes.py),
with a token of the drill's tenant, because only the API may record an `operator:` decision and
because the API is what wakes a held call once a conflict is acknowledged. The owner's late report
is made the way the worker makes it (`Ledger.complete` with the attempt's owner token, carrying the
credit billing applied); a killed or timed-out attempt could send it late in the same way.

The path, for the run's first credit c1 (billing applies it and then holds the answer, so the tool
times out and c1 is unknown; its reconcile hook leaves it to the operator, gates.py):
1. wait until c1 is `indeterminate`;
2. settle c1 `failed` through the API (a wrong decision when billing did apply it: the API tells
   the run, and the run tells the model "failed");
3. wait until the model call of the retry turn has been given that conversation (the turn gate);
4. if billing shows a credit under c1's key, the owner's late "completed" with that credit: the
   ledger opens a conflict, and the run is told as the worker tells it (signal `conflict`);
5. open the gate: the model asks for the credit again (c2, having heard "failed");
6. wait until c2 has a ledger record past `started` (held behind c1's open conflict, as the rule
   says; anything else is the judge's to find);
7. acknowledge c1's conflict as `completed`, with billing's credit as evidence, through the API,
   which wakes c2: it must be handed c1's result, nothing sent.
Without a credit under c1 (a random kill before it was sent), step 2 was right, there is no late
report, and c2 goes ahead after step 5. A step that fails opens the gate anyway, so the run is not
left waiting for a drill that gave up; the walk's error is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from temporalio.client import Client

from onceflow.drill.gates import open_turn, turn_reached
from onceflow.drill.scenario import FIRST_CREDIT, RETRY_CREDIT, RETRY_TURN, PlannedRun
from onceflow.drill.walks import Walk, until
from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, OutcomeIgnoredError, Status, ToolExecutionRecord
from onceflow.sdk.payloads import ConflictSignal

OPERATOR_NAME = "drill"


class DrillOperator:
    """An HTTP client of the operator API that sends the drill operator's token."""

    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _post(self, key: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.http.post(f"/v1/tool-executions/{quote(key, safe=':')}/{action}", json=body)
        if not response.is_success:
            raise RuntimeError(f"POST {action} {key}: {response.status_code} {response.text[:500]}")
        answer: dict[str, Any] = response.json()
        return answer

    async def resolve(self, key: str, status: str, reason: str) -> dict[str, Any]:
        return await self._post(key, "resolve", {"status": status, "reason": reason})

    async def acknowledge(
        self, key: str, status: str, reason: str, evidence: dict[str, Any]
    ) -> dict[str, Any]:
        return await self._post(
            key, "acknowledge-conflict", {"status": status, "reason": reason, "evidence": evidence}
        )


async def walk_conflict(
    plan: PlannedRun,
    walk: Walk,
    *,
    ledger: Ledger,
    billing: BillingClient,
    operator: DrillOperator,
    client: Client,
    markers: Path,
) -> None:
    """Walk one conflict run down its path (the module docstring); never raises."""
    first, retry = plan.key(FIRST_CREDIT), plan.key(RETRY_CREDIT)
    try:
        unknown = await until(
            lambda: ledger.find(first), lambda r: _has_status(r, Status.INDETERMINATE), f"{first} unknown"
        )
        walk.step(f"{FIRST_CREDIT} indeterminate")
        await operator.resolve(
            first, "failed", "drill operator: billing never answered; taken as not applied"
        )
        walk.step(f"{FIRST_CREDIT} settled failed through the API")

        async def reached() -> bool:
            return turn_reached(markers, plan.run_id, RETRY_TURN)

        await until(reached, bool, f"the model call of turn {RETRY_TURN}")
        walk.step(f"the model was given turn {RETRY_TURN}'s conversation")
        applied = [c for c in await billing.credits(plan.account_id) if c.idempotency_key == first]
        if applied:
            assert unknown is not None  # until() returned it indeterminate
            await _late_owner_report(unknown, applied[0].model_dump(mode="json"), ledger, client)
            walk.late_report = applied[0].credit_id
            walk.step(f"the owner's late report: completed, {applied[0].credit_id}")
        open_turn(markers, plan.run_id, RETRY_TURN)
        walk.step("gate opened")
        if not applied:
            walk.step(f"billing has no credit under {FIRST_CREDIT}: no late report, nothing to acknowledge")
            return
        found = await until(
            lambda: ledger.find(retry),
            lambda r: r is not None and r.status is not Status.STARTED,
            f"{retry} reserved",
        )
        walk.retry_status_at_acknowledgement = found.status.value if found else None
        walk.step(f"{RETRY_CREDIT} {walk.retry_status_at_acknowledgement}")
        await operator.acknowledge(
            first,
            "completed",
            "drill operator: billing shows the credit",
            {"billing_credit_id": applied[0].credit_id},
        )
        walk.acknowledged = True
        walk.step("conflict acknowledged completed through the API")
    except Exception as exc:  # the walk's failure is reported; the run must not wait for it
        walk.error = f"{type(exc).__name__}: {exc}"
        open_turn(markers, plan.run_id, RETRY_TURN)
    finally:
        walk.done = True


def _has_status(record: ToolExecutionRecord | None, status: Status) -> bool:
    return record is not None and record.status is status


async def _late_owner_report(
    unknown: ToolExecutionRecord, result: dict[str, Any], ledger: Ledger, client: Client
) -> None:
    """The attempt that sent the credit reports it completed, after the operator said failed: the
    ledger ignores it for the decision and flags a conflict; the run is told, as sending.py does."""
    if not unknown.owner:
        raise RuntimeError(f"{unknown.key} has no owner to report as")
    try:
        await ledger.complete(unknown.key, owner=unknown.owner, result=result)
    except OutcomeIgnoredError:
        pass  # the expected answer: the decision stands, the report is kept as a conflict
    record = await ledger.find(unknown.key)
    if record is None or not record.has_conflict:
        raise RuntimeError(
            f"the late report left {unknown.key} without a conflict ({record and record.status})"
        )
    await client.get_workflow_handle(record.run_id).signal(
        "conflict", ConflictSignal(key=record.key, detail=f"{unknown.owner} reports completed")
    )
