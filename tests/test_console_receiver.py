"""The console's "Ask the receiver", in a real browser: for a call whose tool declares a receiver on
onceflow's receiver kit (tests/support/receiver_app.py, served for real), the call page offers the
receiver's own record of the key; the answer is a read-only lookup (an absent key stays absent, never
fenced), shown with a resolve form that carries it as evidence. A tool whose receiver is not on the
kit gets no such offer.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from playwright.async_api import Browser, expect
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.serving import BackgroundServer
from onceflow.ledger import Ledger, Status
from onceflow.local.postgres import create_database, drop_database
from onceflow.receiver import key_header_value
from onceflow.runtime.agents import build_registry
from tests.support.browser import CHROMIUM, browser_type_launch_args, chromium_browser, signed_in
from tests.support.operator_api import OperatorApi, serving_api, unknown_call
from tests.support.receiver_app import AUTH, URL_ENV, create_app
from tests.test_executions_cli import put_call

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="browser tests need Debian's chromium at /usr/bin/chromium: apt-get install -y chromium",
)

__all__ = ["browser_type_launch_args", "chromium_browser"]  # the fixtures, used by name


@pytest.fixture
async def service_database(postgres_dsn: str) -> AsyncIterator[str]:
    name = f"receiver_console_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name)
    await drop_database(postgres_dsn, name)


@pytest.fixture
def service(service_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(service_database), shutdown_grace=1.0) as running:
        monkeypatch.setenv(URL_ENV, running.base_url)
        yield running


@pytest.fixture
async def kit_api(
    temporal_env: WorkflowEnvironment, ledger: Ledger, service: BackgroundServer
) -> AsyncIterator[OperatorApi]:
    registry = build_registry(
        {
            "toolsets": {"kit-transfers": "tests.support.receiver_app:kit_tools"},
            "agents": {
                "kit-pause": {
                    "model": {"provider": "scripted", "script": [{"final": "nothing"}]},
                    "instructions": "You move money.",
                    "toolsets": ["kit-transfers"],
                    "tool_policy": {"on_indeterminate": "pause"},
                }
            },
        },
        "test_console_receiver",
    )
    async with serving_api(temporal_env.client, ledger, registry) as api:
        yield api


async def lookup(service: BackgroundServer, key: str) -> str:
    async with httpx.AsyncClient(base_url=service.base_url, headers=AUTH) as http:
        state: str = (await http.get(f"/idempotency-keys/{key}")).json()["state"]
    return state


async def test_ask_the_receiver_shows_its_record_and_resolves_with_it_as_evidence(
    kit_api: OperatorApi, chromium_browser: Browser, service: BackgroundServer
) -> None:
    key = await put_call(kit_api.ledger, tool="transfer", agent="kit-pause")
    # The transfer did arrive and apply; only its answer was lost (the ledger says unknown).
    async with httpx.AsyncClient(base_url=service.base_url, headers=AUTH) as http:
        sent = await http.post(
            "/transfers",
            json={"account": "acct_1", "cents": 500},
            headers={"Idempotency-Key": key_header_value(key)},
        )
    assert sent.status_code == 201

    page, _ = await signed_in(chromium_browser, kit_api)
    await page.goto(f"/console/calls/{key}")
    await page.get_by_role("link", name="Ask the receiver").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("The receiver's record")
    await expect(page.locator(".badge.receiver-completed")).to_have_text("completed")
    await expect(page.locator("pre.payload")).to_contain_text(str(sent.json()["transfer_id"]))
    await expect(page.get_by_label("it took effect (completed)")).to_be_checked()
    await page.locator("#receiver-reason").fill("the receiver recorded the transfer under this key")
    await page.get_by_role("button", name="Resolve…").click()
    await page.get_by_role("button", name="Yes, resolve").click()
    await expect(page.get_by_role("status")).to_contain_text("settled by operator:alice")

    record = await kit_api.ledger.get(key)
    assert (record.status, record.settled_by) == (Status.COMPLETED, "operator:alice")
    assert record.evidence is not None and record.evidence["lookup"]["state"] == "completed"
    assert record.evidence["lookup"]["response"]["body"] == sent.json()
    assert record.result == sent.json()


async def test_asking_never_fences_and_a_tool_off_the_kit_is_not_offered(
    kit_api: OperatorApi, chromium_browser: Browser, service: BackgroundServer
) -> None:
    absent = await put_call(kit_api.ledger, tool="transfer", agent="kit-pause")
    page, _ = await signed_in(chromium_browser, kit_api)
    await page.goto(f"/console/calls/{absent}/receiver")
    await expect(page.locator(".badge.receiver-absent")).to_have_text("absent")
    await expect(page.get_by_label("it took effect (completed)")).not_to_be_checked()
    await expect(page.get_by_label("it never took effect (failed)")).not_to_be_checked()
    assert await lookup(service, absent) == "absent"  # asked twice now: still no fence
    assert (await kit_api.ledger.get(absent)).status is Status.INDETERMINATE

    other = await unknown_call(kit_api.ledger)  # issue_credit, of no agent this API knows
    await page.goto(f"/console/calls/{other}")
    await expect(page.get_by_role("link", name="Ask the receiver")).to_have_count(0)
    await page.goto(f"/console/calls/{other}/receiver")
    await expect(page.get_by_role("heading", level=1)).to_have_text("No receiver to ask")
