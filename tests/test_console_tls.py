"""The console over real TLS: its session cookie is `__Host-` prefixed, and a cookie planted by a
plain-HTTP page on another port of the same host signs nobody in.

The API serves HTTPS itself (uvicorn, a self-signed certificate made here). Chromium reaches it as
https://console.onceflow.test:<port> (its host resolver maps the name to 127.0.0.1): a real host
name, because Chromium lets http://127.0.0.1 and http://localhost set Secure cookies, which no
other plain-HTTP origin may. The "sibling" is a plain-HTTP page on another port of the same name,
which sets a session cookie for it, under both names, as an attacker's page would.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.async_api import Browser, async_playwright, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from temporalio.testing import WorkflowEnvironment

from onceflow.ledger import Ledger, Status
from tests.support.agents import support_registry
from tests.support.browser import CHROMIUM, DESKTOP, browser_type_launch_args, shoot
from tests.support.operator_api import OperatorApi, serving_api, unknown_call
from tests.support.processes import free_port
from tests.support.tls import self_signed

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's chromium at /usr/bin/chromium: apt-get install -y chromium",
)

__all__ = ["browser_type_launch_args"]  # the fixture, used by name

HOST = "console.onceflow.test"


@pytest.fixture(scope="module")
async def named_host_browser(browser_type_launch_args: dict[str, Any]) -> AsyncIterator[Browser]:
    args = [*browser_type_launch_args["args"], f"--host-resolver-rules=MAP {HOST} 127.0.0.1"]
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(**{**browser_type_launch_args, "args": args})
        yield launched
        await launched.close()


@pytest.fixture
async def https_api(
    temporal_env: WorkflowEnvironment, ledger: Ledger, tmp_path: Path
) -> AsyncIterator[OperatorApi]:
    tls = self_signed(tmp_path / "tls", HOST)
    async with serving_api(temporal_env.client, ledger, support_registry(), tls=tls) as api:
        yield api


async def _session_of(api: OperatorApi, tenant: str, operator: str) -> str:
    """A real session id, signed in over TLS outside any browser: what an attacker holds."""
    token = await api.token(tenant=tenant, operator=operator)
    async with httpx.AsyncClient(base_url=api.url, verify=False, timeout=30) as http:
        form = await http.get("/console/sign-in")
        nonce = form.cookies["__Host-onceflow_console_sign_in"]
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
        assert csrf is not None
        signed = await http.post("/console/sign-in", data={"csrf": csrf.group(1), "token": token})
        assert signed.status_code == 303, signed.text
        session = signed.cookies["__Host-onceflow_console"]
        assert nonce and session.startswith("ocs_") and token not in session
        # The positive control: this id, sent as the console reads it over HTTPS, is a session.
        queue = await http.get("/console")
        assert queue.status_code == 200 and f"{operator}" in queue.text
    return session


@asynccontextmanager
async def _planting_page(session: str) -> AsyncIterator[str]:
    """A plain-HTTP page on another port of HOST that plants `session` under both cookie names."""

    async def page(request: Request) -> HTMLResponse:
        response = HTMLResponse("<!doctype html><title>cat pictures</title><p>nothing to see</p>")
        response.headers.append("Set-Cookie", f"onceflow_console={session}; Path=/")
        response.headers.append("Set-Cookie", f"__Host-onceflow_console={session}; Path=/; Secure")
        return response

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(Starlette(routes=[Route("/", page)]), host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve(), name=f"planting-page-{uuid.uuid4().hex[:6]}")
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://{HOST}:{port}/"
    finally:
        server.should_exit = True
        await task


async def test_over_https_the_session_cookie_is_host_prefixed_and_a_planted_one_signs_nobody_in(
    https_api: OperatorApi, named_host_browser: Browser
) -> None:
    key = await unknown_call(https_api.ledger)
    console = https_api.url.replace("127.0.0.1", HOST)
    mallory = await _session_of(https_api, tenant="globex", operator="mallory")

    # A fresh browser visits the sibling page first; then it opens the console.
    context = await named_host_browser.new_context(viewport=DESKTOP, ignore_https_errors=True)
    page = await context.new_page()
    async with _planting_page(mallory) as sibling:
        await page.goto(sibling)
        await expect(page.locator("p")).to_have_text("nothing to see")
    planted = {c["name"]: c for c in await context.cookies()}
    # The plain name was taken (a plain-HTTP page may set it), the `__Host-` one refused.
    assert set(planted) == {"onceflow_console"}
    await page.goto(f"{console}/console")
    await expect(page).to_have_url(re.compile(r"/console/sign-in$"))
    await expect(page.get_by_role("banner")).not_to_contain_text("mallory")

    # Signing in over HTTPS: the cookie is `__Host-`, Secure, Path=/, HttpOnly, SameSite=Strict,
    # and holds a session id, not the token.
    token = await https_api.token(operator="alice")
    await page.get_by_label("Operator token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(r"/console$"))
    await expect(page.get_by_role("banner")).to_contain_text("alice in acme")
    await expect(page.get_by_role("link", name=key)).to_be_visible()
    cookie = next(c for c in await context.cookies() if c["name"] == "__Host-onceflow_console")
    assert (cookie["secure"], cookie["path"], cookie["httpOnly"], cookie["sameSite"]) == (
        True,
        "/",
        True,
        "Strict",
    )
    assert cookie["value"].startswith("ocs_") and token not in cookie["value"]
    assert cookie["domain"] == HOST and cookie["expires"] == -1  # no Domain attribute; a session cookie
    await shoot(page, "queue-https")

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("You are signed out")
    assert "__Host-onceflow_console" not in {c["name"] for c in await context.cookies()}
    await context.close()
    assert (await https_api.ledger.get(key)).status is Status.INDETERMINATE
