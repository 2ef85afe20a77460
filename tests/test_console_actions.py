"""The operator console's other actions in a real browser: approve, compensate (and a compensation
not recorded yet), deny, acknowledge a conflict, nudge a run and release an approved call. Chromium
driven by Playwright against the real operator API (real runs on Temporal, a real ledger);
screenshots go to tests/artifacts/console/. Signing in, the queue and resolving are in
tests/test_console.py.

Chromium is a system package (`apt-get install -y chromium`); .ci/run installs it, so CI always runs
these. Without it they skip, and pytest's summary says why.
"""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import Browser, expect

from onceflow.ledger import FailureKind, Status
from onceflow.sdk.payloads import Phase
from tests.support.browser import (
    CHROMIUM,
    LAPTOP,
    browser_type_launch_args,
    chromium_browser,
    decisions_are_on_the_first_screen,
    key_is_the_visible_title,
    shoot,
    signed_in,
)
from tests.support.downstream import DOWNSTREAM
from tests.support.operator_api import OperatorApi, order, unknown_call
from tests.test_agent_run import wait_for_phase
from tests.test_executions_cli import put_call
from tests.test_operator_api_conflicts import conflicted_call

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's chromium at /usr/bin/chromium: apt-get install -y chromium",
)

__all__ = ["browser_type_launch_args", "chromium_browser"]  # the fixtures, used by name


async def test_approve_sends_the_call_once(operator_api: OperatorApi, chromium_browser: Browser) -> None:
    payload, _ = order()
    handle = await operator_api.runs.start("credit-approval", payload)
    await wait_for_phase(handle, Phase.AWAITING_APPROVAL)
    key = f"{handle.id}:call_1_0"

    page, _ = await signed_in(chromium_browser, operator_api, operator="bob", viewport=LAPTOP)
    await page.get_by_role("link", name="1 Awaiting approval").click()
    await page.get_by_role("link", name=key).click()
    await key_is_the_visible_title(page, key, LAPTOP)
    await decisions_are_on_the_first_screen(page, LAPTOP, ["Approve…", "Deny…", "Nudge the run…"])
    await page.locator("#approve-reason").fill("customer called")
    await page.get_by_role("button", name="Approve…").click()
    await expect(page.locator(".consequence")).to_contain_text("sent to the receiver, once")
    assert DOWNSTREAM.send_attempts == 0
    await page.get_by_role("button", name="Yes, approve").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Approved")

    await asyncio.wait_for(handle.result(), 20)
    assert DOWNSTREAM.received == DOWNSTREAM.effects == {key: 1}
    record = await operator_api.ledger.get(key)
    assert (record.status, record.approved_by) == (Status.COMPLETED, "operator:bob")


async def completed_undoable_call(operator_api: OperatorApi) -> str:
    """The key of a completed credit whose tool declares a compensation."""
    payload, _ = order()
    handle = await operator_api.runs.start("credit-undoable", payload)
    await asyncio.wait_for(handle.result(), 20)
    return f"{handle.id}:call_1_0"


async def test_a_compensation_asked_for_and_not_yet_recorded_is_looked_for_again(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    key = await completed_undoable_call(operator_api)
    page, _ = await signed_in(chromium_browser, operator_api)
    # Not asked for: there is nothing to wait for.
    await page.goto(f"/console/calls/{key}:compensation")
    await expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
    # Asked for (the request alone, as in the moment before its workflow records the call).
    await operator_api.ledger.request_compensation(key, actor="operator:alice", reason="duplicate order")
    await page.goto(f"/console/calls/{key}:compensation")
    await expect(page.get_by_role("heading", level=1)).to_have_text("Not recorded yet")
    assert await page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "2"
    await expect(page.get_by_role("link", name="Back to the call")).to_have_attribute(
        "href", f"/console/calls/{key}"
    )


async def test_compensate_undoes_a_completed_call(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    key = await completed_undoable_call(operator_api)

    page, _ = await signed_in(chromium_browser, operator_api)
    await page.goto(f"/console/calls/{key}")
    await page.locator("#compensate-reason").fill("duplicate order")
    await page.get_by_role("button", name="Compensate…").click()
    await expect(page.locator(".consequence")).to_contain_text("undo the effect")
    await page.get_by_role("button", name="Yes, compensate").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Compensation started")
    await page.get_by_role("link", name=f"{key}:compensation").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(f"{key}:compensation")

    outcome = await asyncio.wait_for(
        operator_api.runs.client.get_workflow_handle(f"compensation:{key}").result(), 20
    )
    assert outcome["original_status"] == "compensated"
    assert DOWNSTREAM.voids == {f"{key}:compensation": 1}
    original = await operator_api.ledger.get(key)
    assert original.status is Status.COMPENSATED
    assert (original.events[-1].actor, original.events[-1].reason) == ("operator:alice", "duplicate order")


async def test_deny_acknowledge_a_conflict_and_nudge(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    payload, _ = order()
    handle = await operator_api.runs.start("credit-approval", payload)
    await wait_for_phase(handle, Phase.AWAITING_APPROVAL)
    denied = f"{handle.id}:call_1_0"
    conflicted = await conflicted_call(operator_api)
    unknown = await unknown_call(operator_api.ledger)

    page, _ = await signed_in(chromium_browser, operator_api)
    await page.goto(f"/console/calls/{denied}")
    await page.locator("#deny-reason").fill("amount looks wrong")
    await page.get_by_role("button", name="Deny…").click()
    await expect(page.locator(".consequence")).to_contain_text("never sent")
    await page.get_by_role("button", name="Yes, deny").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Denied")
    await asyncio.wait_for(handle.result(), 20)
    assert (await operator_api.ledger.get(denied)).status is Status.DENIED
    assert DOWNSTREAM.send_attempts == 0

    await page.goto(f"/console/calls/{conflicted}")
    await expect(page.get_by_role("heading", name="Conflict")).to_be_visible()
    await expect(page.get_by_role("heading", name="Reconcile history")).to_be_visible()
    await expect(
        page.locator("section", has=page.get_by_role("heading", name="Reconcile history"))
    ).to_contain_text("outcome_conflict: reconciler reports completed")
    await shoot(page, "call-conflict")
    await page.get_by_label("it took effect and was undone (compensated)").check()
    await page.locator("#acknowledge-conflict-reason").fill("refunded by hand")
    await page.locator("#acknowledge-conflict-evidence").fill('{"refund": "re_1"}')
    await page.get_by_role("button", name="Acknowledge conflict…").click()
    await page.get_by_role("button", name="Yes, acknowledge conflict").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Conflict acknowledged")
    record = await operator_api.ledger.get(conflicted)
    assert (record.has_conflict, record.conflict_cleared_by) == (False, "operator:alice")
    assert record.status is Status.COMPENSATED

    await page.goto(f"/console/calls/{unknown}")
    await page.get_by_role("button", name="Nudge the run…").click()
    await expect(page.locator(".consequence")).to_contain_text("decides nothing")
    await page.get_by_role("button", name="Yes, nudge the run").click()
    await expect(page.get_by_role("status")).to_contain_text("No run was waiting on it")
    assert (await operator_api.ledger.get(unknown)).status is Status.INDETERMINATE

    # Bad input is refused before anything is sent, and says why.
    await page.goto(f"/console/calls/{unknown}")
    await page.locator("#resolve-reason").fill("seen")
    await page.locator("#resolve-evidence").fill("{not json")
    await page.get_by_role("button", name="Resolve…").click()
    await expect(page.get_by_role("alert")).to_contain_text("Nothing was changed: evidence is not JSON")
    assert (await operator_api.ledger.get(unknown)).status is Status.INDETERMINATE


async def test_release_an_approved_call_whose_run_is_gone(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    key = await put_call(operator_api.ledger, approval=True)
    await operator_api.ledger.approve(key, actor="operator:carol")

    page, _ = await signed_in(chromium_browser, operator_api)
    await page.goto(f"/console/calls/{key}")
    await page.locator("#release-reason").fill("its run was terminated")
    await page.get_by_role("button", name="Release…").click()
    await expect(page.locator(".consequence")).to_contain_text("never will be")
    assert (
        await operator_api.ledger.get(key)
    ).status is Status.AWAITING_APPROVAL  # confirming changes nothing
    await page.get_by_role("button", name="Yes, release").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Released")
    record = await operator_api.ledger.get(key)
    assert (record.status, record.failure_kind, record.settled_by) == (
        Status.FAILED,
        FailureKind.RELEASED,
        "operator:alice",
    )
    assert DOWNSTREAM.send_attempts == 0
