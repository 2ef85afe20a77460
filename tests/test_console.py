"""The operator console in a real browser: Debian's chromium driven by Playwright, against the real
operator API (real runs on Temporal, a real ledger): signing in, the queue, and resolving unknown
calls, one, two sessions at once or in bulk. Screenshots go to tests/artifacts/console/. The other
actions (approve, compensate, deny, acknowledge, nudge, release) are in tests/test_console_actions.py.

Chromium is a system package (`apt-get install -y chromium`); .ci/run installs it, so CI always runs
these. Without it they skip, and pytest's summary says why.
"""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from playwright.async_api import Browser, expect

from onceflow.ledger import Status
from onceflow.sdk.payloads import Phase
from tests.support.browser import (
    CHROMIUM,
    DESKTOP,
    LAPTOP,
    PHONE,
    browser_type_launch_args,
    chromium_browser,
    decisions_are_on_the_first_screen,
    events_read_without_sideways_scrolling,
    every_control_is_labelled,
    key_is_the_visible_title,
    shoot,
    signed_in,
)
from tests.support.downstream import DOWNSTREAM
from tests.support.guarded import unknown_refund_and_a_held_repeat
from tests.support.operator_api import OperatorApi, order, unknown_call
from tests.test_agent_run import wait_for_phase
from tests.test_executions_cli import put_call
from tests.test_operator_api_conflicts import conflicted_call

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's chromium at /usr/bin/chromium: apt-get install -y chromium",
)

__all__ = ["browser_type_launch_args", "chromium_browser"]  # the fixtures, used by name


# -- sign-in --------------------------------------------------------------------------------------


async def test_sign_in_keeps_a_session_id_in_an_http_only_cookie_and_the_token_nowhere(
    operator_api: OperatorApi, chromium_browser: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = await unknown_call(operator_api.ledger)
    context = await chromium_browser.new_context(base_url=operator_api.url, viewport=DESKTOP)
    page = await context.new_page()
    await page.goto("/console/sign-in")
    await page.get_by_label("Operator token").fill("oft_not-a-real-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("not an operator token")
    await page.get_by_label("Operator token").fill("oft_" + "x" * 43)  # the shape of one, unknown
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("unknown or revoked")
    assert "onceflow_console" not in {c["name"] for c in await context.cookies()}

    # By keyboard alone: the token field has the focus, Enter submits; then the skip link comes
    # first, with a visible focus ring.
    token = await operator_api.token(operator="alice")
    await page.goto("/console/sign-in")
    await expect(page.get_by_label("Operator token")).to_be_focused()
    await page.keyboard.type(token)
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"/console$"))
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Skip to content"
    outline = await page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
    await expect(page.get_by_role("banner")).to_contain_text("alice in acme")
    await expect(page.get_by_role("link", name=key)).to_be_visible()

    session = next(c for c in await context.cookies() if c["name"] == "onceflow_console")
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/console"
    assert session["expires"] == -1  # a session cookie: gone when the browser closes
    assert session["value"].startswith("ocs_") and token not in session["value"]
    await page.get_by_role("link", name=key).click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(key)
    assert token not in page.url and token not in await page.content()
    assert not any(token in r.getMessage() for r in caplog.records)

    # A POST without the session's CSRF token changes nothing, and a GET never changes anything.
    refused = await page.request.post(
        f"/console/calls/{key}/actions/resolve",
        form={"status": "failed", "reason": "forged", "confirmed": "yes"},
    )
    assert refused.status == 403
    assert "Nothing was changed" in await refused.text()
    answered = await page.request.get(f"/console/calls/{key}/actions/resolve")
    assert answered.status == 405
    assert (await operator_api.ledger.get(key)).status is Status.INDETERMINATE
    await context.close()

    schema = (await operator_api.http.get("/openapi.json")).json()
    assert not [path for path in schema["paths"] if path.startswith("/console")]


async def test_after_sign_out_a_replayed_cookie_or_form_is_sent_to_sign_in_and_changes_nothing(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    waiting = await put_call(operator_api.ledger, approval=True)
    page, _ = await signed_in(chromium_browser, operator_api, operator="alice")
    # Everything a thief would copy: the cookie, and a Deny form ready to confirm.
    await page.goto(f"/console/calls/{waiting}")
    await page.locator("#deny-reason").fill("looks like fraud")
    await page.get_by_role("button", name="Deny…").click()
    await expect(page.get_by_role("button", name="Yes, deny")).to_be_visible()
    [stolen] = [c for c in await page.context.cookies() if c["name"] == "onceflow_console"]
    form = await page.locator("form.buttons").evaluate("f => Object.fromEntries(new FormData(f).entries())")
    assert stolen["value"].startswith("ocs_") and form["confirmed"] == "yes" and form["csrf"]

    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/console/signed-out$"))
    await expect(page.get_by_role("heading", level=1)).to_have_text("You are signed out")
    await expect(page.get_by_role("status")).to_contain_text("opens nothing now")
    await expect(page.get_by_role("link", name="Sign in again")).to_be_visible()
    await shoot(page, "signed-out")
    await page.goto("/console")
    await expect(page).to_have_url(re.compile(r"/console/sign-in$"))

    # A fresh browser with the copied cookie: the queue sends it to sign in, the replayed Deny too.
    thief = await chromium_browser.new_context(base_url=operator_api.url, viewport=DESKTOP)
    await thief.add_cookies(
        [
            {
                "name": stolen["name"],
                "value": stolen["value"],
                "domain": stolen["domain"],
                "path": stolen["path"],
            }
        ]
    )
    replay = await thief.new_page()
    await replay.goto("/console")
    await expect(replay).to_have_url(re.compile(r"/console/sign-in$"))
    posted = await replay.request.post(f"/console/calls/{waiting}/actions/deny", form=form, max_redirects=0)
    assert (posted.status, posted.headers["location"]) == (303, "/console/sign-in")
    await thief.close()
    record = await operator_api.ledger.get(waiting)
    assert (record.status, record.settled_by) == (Status.AWAITING_APPROVAL, None)
    assert [e.kind for e in record.events] == ["reserved"]


# -- the queue ------------------------------------------------------------------------------------


async def test_the_queue_counts_filters_and_pages_longest_waiting_first(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    ledger = operator_api.ledger
    credits = [await unknown_call(ledger) for _ in range(26)]
    blocker, held = await unknown_refund_and_a_held_repeat(ledger, order_id="ord_queue")
    conflicted = await conflicted_call(operator_api)
    await ledger.escalate(credits[0], owner="billing-oncall", actor="reconciler", reason="deadline")
    await unknown_call(ledger, tenant="globex")  # another tenant's: never counted, never shown

    page, _ = await signed_in(chromium_browser, operator_api)
    counts = page.get_by_role("navigation", name="Counts per status")
    await expect(counts.get_by_role("link", name="29 Everything unresolved")).to_be_visible()
    await expect(counts.get_by_role("link", name="27 Unknown")).to_be_visible()
    await expect(counts.get_by_role("link", name="1 Held")).to_be_visible()
    await expect(counts.get_by_role("link", name="1 Conflicts")).to_be_visible()
    await expect(counts.get_by_role("link", name="1 Escalated")).to_be_visible()
    await every_control_is_labelled(page)

    await page.get_by_label("Per page").select_option("25")
    await page.get_by_role("button", name="Apply filters").click()
    rows = page.get_by_role("table").get_by_role("row")
    await expect(rows).to_have_count(26)  # the header and 25 calls
    shown = await page.locator("table.queue a.key").all_inner_texts()
    assert shown[:25] == credits[:25]
    await page.get_by_role("link", name="Next page").click()
    rest = await page.locator("table.queue td a.key").all_inner_texts()
    assert rest == [credits[25], blocker, held, conflicted]
    await shoot(page, "queue-1280")  # the second page: every kind of call, for README
    await page.get_by_role("link", name="First page").click()
    await expect(page.locator("table.queue a.key").first).to_have_text(credits[0])

    await page.get_by_label("Show").select_option("held")
    await page.get_by_role("button", name="Apply filters").click()
    assert await page.locator("table.queue td a.key").all_inner_texts() == [held]
    await page.get_by_role("link", name="1 Conflicts").click()
    assert await page.locator("table.queue td a.key").all_inner_texts() == [conflicted]
    await page.get_by_role("link", name="1 Escalated").click()
    assert await page.locator("table.queue td a.key").all_inner_texts() == [credits[0]]

    # On a phone the filters fold behind one control, so the first call is on the first screen.
    await page.set_viewport_size(PHONE)
    await page.goto("/console")
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the queue scrolls sideways at 375 px ({width} px wide)"
    await expect(page.get_by_label("Per page")).to_be_hidden()
    fold = page.locator("summary", has_text="Filters")
    await expect(fold).to_be_visible()
    first = await page.locator("table.queue a.key").first.bounding_box()
    assert first is not None and 0 <= first["y"] and first["y"] + first["height"] <= PHONE["height"], first
    await shoot(page, "queue-375", full_page=False)
    await fold.click()
    await expect(page.get_by_label("Per page")).to_be_visible()
    # On a wide screen the filters are there without unfolding anything.
    await page.set_viewport_size(DESKTOP)
    await page.goto("/console")
    await expect(page.get_by_label("Per page")).to_be_visible()


# -- resolving unknown calls ----------------------------------------------------------------------


async def test_resolve_from_the_call_page_settles_the_paused_run(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    payload, account = order()
    DOWNSTREAM.modes[account] = "hang_after_apply"
    handle = await operator_api.runs.start("credit-pause", payload)
    key = f"{handle.id}:call_1_0"
    await wait_for_phase(handle, Phase.AWAITING_RECONCILIATION)

    page, _ = await signed_in(chromium_browser, operator_api, viewport=LAPTOP)
    await page.get_by_role("link", name=key).click()
    await expect(page.get_by_role("heading", level=1)).to_have_text(key)
    link = page.get_by_role("link", name="Open the run in the Temporal UI")
    assert (
        await link.get_attribute("href") == f"http://127.0.0.1:8233/namespaces/default/workflows/{handle.id}"
    )
    events = page.get_by_role("region", name="Events")
    await expect(events.get_by_role("row")).to_have_count(3)  # header, reserved, indeterminate
    first_event = events.get_by_role("row").nth(1)
    await expect(first_event).to_contain_text("reserved as started")
    await expect(first_event).not_to_contain_text("·")
    await expect(page.locator("pre.payload")).to_contain_text('"account_id"')
    await every_control_is_labelled(page)
    await key_is_the_visible_title(page, key, LAPTOP)
    await decisions_are_on_the_first_screen(page, LAPTOP, ["Resolve…", "Nudge the run…"])
    await shoot(page, "call-1280", full_page=False)
    await shoot(page, "call-1280-full")  # the whole page, for README
    await page.set_viewport_size(PHONE)
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the call page scrolls sideways at 375 px ({width} px wide)"
    await key_is_the_visible_title(page, key, PHONE)
    await events_read_without_sideways_scrolling(page)
    await shoot(page, "call-375", full_page=False)
    await page.set_viewport_size(DESKTOP)

    await page.get_by_label("it took effect (completed)").check()
    await page.locator("#resolve-reason").fill("found in the billing console")
    await page.locator("#resolve-evidence").fill('{"ticket": "OPS-12"}')
    await page.locator("#resolve-result").fill('{"credit_id": "cr_found"}')
    await page.get_by_role("button", name="Resolve…").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Resolve")
    await expect(page.locator(".consequence")).to_contain_text("as completed")
    assert (await operator_api.ledger.get(key)).status is Status.INDETERMINATE  # not yet
    await shoot(page, "resolve-confirm")
    await page.get_by_role("button", name="Yes, resolve").click()
    await expect(page.get_by_role("status")).to_contain_text("settled by operator:alice")
    await expect(page.get_by_role("status")).to_contain_text("The run waiting on it was told")

    result = await asyncio.wait_for(handle.result(), 20)
    assert "cr_found" in result.final
    record = await operator_api.ledger.get(key)
    assert (record.status, record.settled_by, record.evidence) == (
        Status.COMPLETED,
        "operator:alice",
        {"ticket": "OPS-12"},
    )
    assert [e.source for e in record.events if e.kind == "settled"] == ["api"]
    assert DOWNSTREAM.received[key] == DOWNSTREAM.effects[key] == 1


async def test_two_browser_sessions_resolve_one_call_and_the_second_is_told_who_was_first(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    key = await unknown_call(operator_api.ledger)
    alice, _ = await signed_in(chromium_browser, operator_api, operator="alice")
    bob, _ = await signed_in(chromium_browser, operator_api, operator="bob")
    for page, status, reason in ((alice, "completed", "credit is in billing"), (bob, "failed", "not there")):
        await page.goto(f"/console/calls/{key}")
        await page.locator(f"input[name=status][value={status}]").check()
        await page.locator("#resolve-reason").fill(reason)
        await page.get_by_role("button", name="Resolve…").click()
        await expect(page.get_by_role("button", name="Yes, resolve")).to_be_visible()

    await alice.get_by_role("button", name="Yes, resolve").click()
    await expect(alice.get_by_role("status")).to_contain_text("settled by operator:alice")
    await bob.get_by_role("button", name="Yes, resolve").click()
    await expect(bob.get_by_role("heading", level=1)).to_have_text("Someone decided first")
    alert = bob.get_by_role("alert")
    await expect(alert).to_contain_text("operator:alice decided first")
    await expect(alert).to_contain_text("saying: “credit is in billing”")
    await expect(alert.locator("time")).to_have_text(
        re.compile(r"^(just now|\d+ seconds? ago, at \d\d:\d\d UTC)$")
    )
    assert not re.search(r"\d{4}-\d\d-\d\dT", await alert.inner_text()), "an ISO timestamp, not words"
    await shoot(bob, "conflict-409")

    record = await operator_api.ledger.get(key)
    assert (record.status, record.settled_by) == (Status.COMPLETED, "operator:alice")
    assert [e.actor for e in record.events if e.kind == "settled"] == ["operator:alice"]


async def test_bulk_resolve_settles_each_call_on_its_own_and_says_which_won(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    ledger = operator_api.ledger
    keys = [await unknown_call(ledger, tool="issue_refund") for _ in range(4)]
    other = await unknown_call(ledger)  # issue_credit: not in the filtered list

    page, _ = await signed_in(chromium_browser, operator_api)
    await page.get_by_label("Tool").fill("issue_refund")
    await page.get_by_role("button", name="Apply filters").click()
    for key in keys:
        await page.get_by_label(f"Select {key}").check()
    await page.get_by_label("took effect (completed)").check()
    await page.locator("#bulk-reason").fill("found in the refund processor's export")
    await page.get_by_role("button", name="Review bulk resolve").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Resolve 4 calls of issue_refund")

    # Meanwhile bob settles one of them through the JSON API: his decision must stand.
    async with await operator_api.as_operator(operator="bob") as bob:
        first = await bob.post(
            f"/v1/tool-executions/{keys[2]}/resolve", json={"status": "failed", "reason": "refused"}
        )
        assert first.status_code == 200
    await page.get_by_role("button", name="Yes, resolve 4 calls").click()
    await expect(page.get_by_role("status")).to_have_text(
        "3 won, 0 already yours (you had decided them before, just so), 1 lost (decided first by "
        "someone else), 0 refused."
    )
    lost = page.locator("tr.lost")
    await expect(lost).to_have_count(1)
    await expect(lost).to_contain_text(keys[2])
    await expect(lost).to_contain_text("operator:bob decided first")
    await shoot(page, "bulk-outcome")

    for key in keys:
        record = await ledger.get(key)
        expected = ("operator:bob", Status.FAILED) if key == keys[2] else ("operator:alice", Status.COMPLETED)
        assert (record.settled_by, record.status) == expected
    assert (await ledger.get(other)).status is Status.INDETERMINATE


async def test_bulk_resolve_sent_again_from_a_second_tab_says_already_yours_not_won(
    operator_api: OperatorApi, chromium_browser: Browser
) -> None:
    keys = [await unknown_call(operator_api.ledger, tool="issue_refund") for _ in range(3)]
    first, _ = await signed_in(chromium_browser, operator_api)
    second = await first.context.new_page()  # a second tab of the same session
    for tab in (first, second):
        await tab.goto("/console?tool=issue_refund")
        for key in keys:
            await tab.get_by_label(f"Select {key}").check()
        await tab.locator("#bulk-reason").fill("all three in the refund export")
        await tab.get_by_role("button", name="Review bulk resolve").click()
        await expect(tab.get_by_role("button", name="Yes, resolve 3 calls")).to_be_visible()

    await first.get_by_role("button", name="Yes, resolve 3 calls").click()
    await expect(first.get_by_role("status")).to_contain_text("3 won, 0 already yours")
    await second.get_by_role("button", name="Yes, resolve 3 calls").click()
    await expect(second.get_by_role("heading", level=1)).to_contain_text("Resolved 0 of 3 calls")
    await expect(second.get_by_role("status")).to_contain_text("0 won, 3 already yours")
    await expect(second.locator("tr.already-yours")).to_have_count(3)
    await expect(second.locator("tr.already-yours").first).to_contain_text("nothing new was recorded")
    await shoot(second, "bulk-already-yours")
    for key in keys:
        record = await operator_api.ledger.get(key)
        assert [e.actor for e in record.events if e.kind == "settled"] == ["operator:alice"]
