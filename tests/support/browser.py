"""Browser helpers for the console's tests (tests/test_console.py, tests/test_console_actions.py): the
system chromium, launched once per module, screenshots, sign-in, labels."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, ViewportSize, async_playwright, expect

from tests.support.operator_api import OperatorApi

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "console"
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
LAPTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 375, "height": 812}


async def shoot(page: Page, name: str, *, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full_page)
    return path


async def signed_in(
    browser: Browser, api: OperatorApi, operator: str = "alice", viewport: ViewportSize = DESKTOP
) -> tuple[Page, str]:
    context = await browser.new_context(base_url=api.url, viewport=viewport)
    page = await context.new_page()
    token = await api.token(operator=operator)
    await page.goto("/console")
    await expect(page).to_have_url(re.compile(r"/console/sign-in$"))
    await page.get_by_label("Operator token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(r"/console$"))
    return page, token


async def every_control_is_labelled(page: Page) -> None:
    unlabelled = await page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
               .filter(el => el.labels.length === 0 && !el.getAttribute('aria-label'))
               .map(el => el.outerHTML)"""
    )
    assert unlabelled == []
    for role in ("banner", "main", "contentinfo"):
        await expect(page.get_by_role(role)).to_have_count(1)


def width_of(page: Page) -> int:
    return page.viewport_size["width"] if page.viewport_size else 0


async def key_is_the_visible_title(page: Page, key: str, viewport: ViewportSize) -> None:
    """The call's key is the page's title and its first heading, in view at the top, as large as
    any other heading, and not cut off."""
    await page.evaluate("window.scrollTo(0, 0)")
    assert (await page.title()).startswith(key)
    heading = page.get_by_role("heading", level=1)
    await expect(heading).to_have_text(key)
    box = await heading.bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"] / 2, box
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], box
    sizes = await page.evaluate(
        """() => [...document.querySelectorAll('h1, h2')].map(h => parseFloat(getComputedStyle(h).fontSize))"""
    )
    assert sizes[0] == max(sizes), sizes
    overflow = await heading.evaluate("h => h.scrollWidth - h.clientWidth")
    assert overflow <= 0, f"the key overflows its heading by {overflow} px"


async def decisions_are_on_the_first_screen(page: Page, viewport: ViewportSize, buttons: list[str]) -> None:
    """Every decide form of the call page, and its button, is in view without scrolling."""
    await page.evaluate("window.scrollTo(0, 0)")
    await shoot(page, f"decide-{viewport['width']}x{viewport['height']}", full_page=False)
    forms = page.locator("section.actions form")
    assert await forms.count() == len(buttons)
    for name in buttons:
        button = page.locator("section.actions").get_by_role("button", name=name)
        await expect(button).to_be_visible()
        box = await button.bounding_box()
        assert box is not None and box["y"] + box["height"] <= viewport["height"], (name, box)
    for index in range(await forms.count()):
        box = await forms.nth(index).bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], box


async def events_read_without_sideways_scrolling(page: Page) -> None:
    """The events table of a call page fits its width: no cell is wider than the screen."""
    region = page.get_by_role("region", name="Events", exact=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await region.screenshot(path=str(ARTIFACTS / f"events-{width_of(page)}.png"))
    assert await region.evaluate("r => r.scrollWidth - r.clientWidth") <= 0
    width = await page.evaluate("document.documentElement.clientWidth")
    boxes = await region.locator("td").evaluate_all(
        "cells => cells.map(c => c.getBoundingClientRect()).map(b => [b.left, b.right])"
    )
    assert boxes and all(left >= 0 and right <= width for left, right in boxes), boxes


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """pytest-playwright's launch options, pointed at the system chromium (never `playwright install`)."""
    return {
        **browser_type_launch_args,
        "executable_path": str(CHROMIUM),
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }


@pytest.fixture(scope="module")
async def chromium_browser(browser_type_launch_args: dict[str, Any]) -> AsyncIterator[Browser]:
    # The async API: the operator API serves from this test's event loop, which a sync browser
    # would block.
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(**browser_type_launch_args)
        yield launched
        await launched.close()
