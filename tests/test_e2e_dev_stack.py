"""End to end: `onceflow dev` as a user runs it, and the README's walk-through against it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from onceflow.cli.dev import _wait_for_http
from tests.test_e2e_demo import free_port

BIN = Path(sys.executable).parent
README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture
def dev_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    ports = {
        "temporal": free_port(),
        "ui": free_port(),
        "billing": free_port(),
        "api": free_port(),
        "metrics": free_port(),
    }
    data_dir = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "ONCEFLOW_DATABASE_URL")}
    command = [
        str(BIN / "onceflow"),
        "dev",
        "--data-dir",
        str(data_dir),
        "--temporal-port",
        str(ports["temporal"]),
        "--ui-port",
        str(ports["ui"]),
        "--billing-port",
        str(ports["billing"]),
        "--api-port",
        str(ports["api"]),
        "--api-metrics-port",
        str(ports["metrics"]),
    ]
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    stack_file = data_dir / "stack.json"
    deadline = time.monotonic() + 90
    while not stack_file.exists():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "onceflow dev did not come up"
        time.sleep(0.2)
    info = json.loads(stack_file.read_text())
    yield {
        **env,
        "TEMPORAL_ADDRESS": info["temporal_address"],
        "ONCEFLOW_DATABASE_URL": info["database_url"],
        "ONCEFLOW_BILLING_URL": info["billing_url"],
        "ONCEFLOW_API": info["api_url"],
        "API_METRICS_URL": info["api_metrics_url"],
        "UI_URL": info["ui_url"],
        "DATA_DIR": str(data_dir),
        "COMMAND": json.dumps(command),
        "PID": str(process.pid),
    }
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(30)


def readme_block(after: str, language: str) -> str:
    text = README.read_text()
    start = text.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match, f"no {language} block after {after!r}"
    return match.group(1)


def test_readme_walkthrough_against_onceflow_dev(dev_stack: dict[str, str]) -> None:
    env = dev_stack
    # A second `onceflow dev` on the same folder says so instead of fighting over ports.
    second = subprocess.run(json.loads(env["COMMAND"]), capture_output=True, text=True, timeout=60, env=env)
    assert second.returncode == 1
    assert "already running" in second.stderr

    # The README's client snippet, as written, against the running stack.
    snippet = readme_block("## Start a run from client code", "python")
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "credit_id" in ran.stdout

    # Settle an unknown call yourself: the README's fault, run and `temporal workflow signal`.
    billing = env["ONCEFLOW_BILLING_URL"]
    httpx.put(
        f"{billing}/faults/accounts/acct_1001", json={"mode": "apply_then_hang", "times": 1}
    ).raise_for_status()
    start = subprocess.run(
        [
            str(BIN / "onceflow"),
            "run",
            "start",
            "--agent",
            "billing-assistant-manual",
            "--tenant",
            "acme",
            "--input",
            '{"order_id": "ord_1001"}',
            "--run-id",
            "refund-1001",
            "--data-dir",
            env["DATA_DIR"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert start.returncode == 0, start.stderr
    describe = [
        str(BIN / "temporal"),
        "workflow",
        "query",
        "--workflow-id",
        "refund-1001",
        "--name",
        "status",
        "--address",
        env["TEMPORAL_ADDRESS"],
        "--output",
        "json",
    ]
    deadline = time.monotonic() + 30
    while (
        '"awaiting_reconciliation"'
        not in subprocess.run(describe, capture_output=True, text=True, env=env).stdout
    ):
        assert time.monotonic() < deadline, "the run never paused for reconciliation"
        time.sleep(0.5)
    assert httpx.get(f"{billing}/credits/by-key/refund-1001:call_1_0").status_code == 200

    signal_line = next(
        line
        for line in readme_block("Check the billing service", "sh").splitlines()
        if "workflow signal" in line
    )
    command = (
        signal_line.replace(".venv/bin/temporal", str(BIN / "temporal"))
        + f" --address {env['TEMPORAL_ADDRESS']}"
    )
    sent = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30, env=env)
    assert sent.returncode == 0, sent.stderr
    result = subprocess.run(
        [
            str(BIN / "temporal"),
            "workflow",
            "result",
            "--workflow-id",
            "refund-1001",
            "--address",
            env["TEMPORAL_ADDRESS"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    effects = httpx.get(f"{billing}/effects/refund-1001:call_1_0").json()
    assert effects["applied"] == 1

    # The operator API: a token as the README makes one, then the call as the API shows it.
    token_line = next(
        line
        for line in readme_block("## The operator API and CLI", "sh").splitlines()
        if "tokens create" in line
    )
    created = subprocess.run(
        token_line.removeprefix("export ONCEFLOW_TOKEN=$(")
        .removesuffix(")")
        .replace(".venv/bin/", f"{BIN}/"),
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert created.returncode == 0, created.stderr
    headers = {"Authorization": f"Bearer {created.stdout.strip()}"}
    api = env["ONCEFLOW_API"]
    assert httpx.get(f"{api}/v1/tool-executions", headers=headers).json()["items"] == []
    shown = httpx.get(f"{api}/v1/tool-executions/refund-1001:call_1_0", headers=headers).json()
    assert (shown["status"], shown["settled_by"]) == ("completed", "signal:alice")
    assert httpx.get(f"{api}/v1/tool-executions").status_code == 401
    # Prometheus reads the queue on the API's own metrics listener, not on the console's port.
    assert httpx.get(f"{api}/metrics").status_code == 404
    scraped = httpx.get(env["API_METRICS_URL"])
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")

    # A signal with an operator assertion, as the README sends one (onceflow dev's door is open, and
    # it checks an assertion that comes anyway): recorded as the operator the API named.
    httpx.put(
        f"{billing}/faults/accounts/acct_1002", json={"mode": "apply_then_hang", "times": 1}
    ).raise_for_status()
    start_1002 = [part.replace("1001", "1002") for part in start.args]
    assert subprocess.run(start_1002, capture_output=True, text=True, timeout=60, env=env).returncode == 0
    describe_1002 = [part.replace("refund-1001", "refund-1002") for part in describe]
    deadline = time.monotonic() + 30
    while (
        '"awaiting_reconciliation"'
        not in subprocess.run(describe_1002, capture_output=True, text=True, env=env).stdout
    ):
        assert time.monotonic() < deadline, "the second run never paused for reconciliation"
        time.sleep(0.5)
    block = readme_block("### Signals from outside the API", "sh").replace("refund-1001", "refund-1002")
    block = block.replace(".venv/bin/", f"{BIN}/").replace(
        "--name resolve", f"--name resolve --address {env['TEMPORAL_ADDRESS']}"
    )
    asserted = subprocess.run(
        ["sh", "-ec", block],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "ONCEFLOW_TOKEN": created.stdout.strip()},
    )
    assert asserted.returncode == 0, asserted.stderr
    deadline = time.monotonic() + 30
    while (shown := httpx.get(f"{api}/v1/tool-executions/refund-1002:call_1_0", headers=headers).json())[
        "status"
    ] != "completed":
        assert time.monotonic() < deadline, shown
        time.sleep(0.3)
    assert shown["settled_by"] == "signal:alice"

    # The console, with the same token: the call's page links the run to this stack's Temporal UI.
    with httpx.Client(base_url=api, timeout=30) as browser:
        form = browser.get("/console/sign-in")
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', form.text)
        assert csrf, form.text
        signed_in = browser.post(
            "/console/sign-in", data={"csrf": csrf.group(1), "token": created.stdout.strip()}
        )
        assert signed_in.status_code == 303, signed_in.text
        page = browser.get("/console/calls/refund-1001:call_1_0")
        assert page.status_code == 200, page.text
        assert f'href="{env["UI_URL"]}/namespaces/default/workflows/refund-1001"' in page.text

    # Ctrl-C stops everything `onceflow dev` started.
    os.kill(int(env["PID"]), signal.SIGINT)
    deadline = time.monotonic() + 30
    while Path(env["DATA_DIR"], "stack.json").exists():
        assert time.monotonic() < deadline, "onceflow dev did not stop on Ctrl-C"
        time.sleep(0.2)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{billing}/health", timeout=2)


async def test_onceflow_dev_uses_the_temporal_and_database_it_is_given(
    tmp_path: Path, temporal_env: WorkflowEnvironment, database_url: str
) -> None:
    data_dir = tmp_path / "stack"
    temporal_address = temporal_env.client.service_client.config.target_host
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_address, "ONCEFLOW_DATABASE_URL": database_url}
    command = [
        str(BIN / "onceflow"),
        "dev",
        "--data-dir",
        str(data_dir),
        "--billing-port",
        str(free_port()),
        "--api-port",
        str(free_port()),
        "--api-metrics-port",
        "0",
        # Ports it must not need: nothing may listen on them.
        "--temporal-port",
        str(unused_temporal := free_port()),
        "--ui-port",
        str(free_port()),
    ]
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        process = await asyncio.to_thread(
            subprocess.Popen, command, stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        stack_file = data_dir / "stack.json"
        deadline = time.monotonic() + 90
        while not stack_file.exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "onceflow dev did not come up"
            await asyncio.sleep(0.2)
        info = json.loads(stack_file.read_text())
        assert (info["temporal_address"], info["database_url"], info["ui_url"]) == (
            temporal_address,
            database_url,
            None,
        )
        assert not (data_dir / "postgres").exists()
        assert not (data_dir / "temporal.db").exists()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", unused_temporal)) != 0
        # Its worker and API work against what it was given.
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{info['api_url']}/healthz")).status_code == 200
        # SIGTERM (kill, a supervisor) stops everything it started, as Ctrl-C does.
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
        assert not stack_file.exists()
        async with httpx.AsyncClient() as http:
            for url in (f"{info['api_url']}/healthz", f"{info['billing_url']}/health"):
                with pytest.raises(httpx.TransportError):
                    await http.get(url, timeout=2)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            await asyncio.to_thread(process.wait, 30)


async def test_a_part_that_dies_while_the_stack_waits_for_it_is_named_at_once() -> None:
    """`onceflow dev` waits up to a minute for a part that is still starting, but not for one that
    has exited: it says which, and where its log is."""
    url = f"http://127.0.0.1:{free_port()}/health"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not start: billing exited with code 1 \(see billing.log\)"):
        await _wait_for_http(
            url, "the billing service", lambda: "billing exited with code 1 (see billing.log)"
        )
    assert time.monotonic() - started < 10
