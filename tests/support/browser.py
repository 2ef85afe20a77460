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
