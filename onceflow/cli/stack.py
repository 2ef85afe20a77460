"""`onceflow dev` and `onceflow demo`: the embedded local stack, and the scenarios run on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from onceflow.runtime.process_exit import exit_after_cleanup

DataDir = Annotated[Path, typer.Option(help="Where the dev stack keeps its state.")]
TemporalPort = Annotated[int, typer.Option(help="Temporal gRPC port.")]
UiPort = Annotated[int, typer.Option(help="Temporal Web UI port.")]
BillingPort = Annotated[int, typer.Option(help="Example billing service port.")]
ApiPort = Annotated[int, typer.Option(help="Operator API port.")]
ApiMetricsPort = Annotated[
    int, typer.Option(envvar="ONCEFLOW_API_METRICS_PORT", help="Where the API serves /metrics; 0: nowhere.")
]


def use_stack_environment(data_dir: Path) -> None:
    """Point this process at a running `onceflow dev` unless the environment already says where to go."""
    from onceflow.cli.dev import running_stack

    info = running_stack(data_dir.resolve())
    if info is None:
        return
    for name, value in info.environment().items():
        os.environ.setdefault(name, value)


def dev(
    data_dir: DataDir = Path(".onceflow"),
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    billing_port: BillingPort = 8081,
    api_port: ApiPort = 8082,
    api_metrics_port: ApiMetricsPort = 9466,
) -> None:
    """Run Temporal, PostgreSQL, the billing example, a worker and the operator API. Ctrl-C stops all."""
    from onceflow.cli.dev import DevStack, StackBusyError, StackConfig

    config = StackConfig(
        data_dir, temporal_port, ui_port, billing_port, api_port, api_metrics_port=api_metrics_port
    )

    async def serve() -> None:
        # Ctrl-C and SIGTERM (kill, systemd, a supervisor) both stop everything this started.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stack = DevStack(config)
        try:
            info = await stack.start()
        except StackBusyError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(1) from None
        try:
            typer.echo(
                f"Temporal UI:   {info.ui_url or '(external Temporal at ' + info.temporal_address + ')'}"
            )
            typer.echo(f"Temporal:      {info.temporal_address}")
            typer.echo(f"Ledger:        {info.database_url}")
            typer.echo(f"Billing:       {info.billing_url}")
            typer.echo(f"Operator API:  {info.api_url}  (OpenAPI: {info.api_url}/openapi.json)")
            typer.echo(f"Console:       {info.api_url}/console")
            if info.api_metrics_url:
                typer.echo(f"API metrics:   {info.api_metrics_url}  (for Prometheus)")
            typer.echo("Start a run in another shell:")
            typer.echo(
                '  onceflow run start --agent billing-assistant --tenant acme --input \'{"order_id": "ord_1001"}\''
            )
            typer.echo("Get an operator token for tenant acme, then list its unknown calls:")
            typer.echo("  export ONCEFLOW_TOKEN=$(onceflow tokens create --tenant acme --operator $USER)")
            typer.echo("  onceflow executions list")
            typer.echo("Ctrl-C stops everything.")
            while (problem := stack.check_alive()) is None and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1)
            if problem:
                typer.echo(f"stopping: {problem}", err=True)
        finally:
            await stack.stop()
        typer.echo("stopped")

    asyncio.run(serve())
    exit_after_cleanup(0)  # the Temporal client's native threads must not crash the exit


def demo(
    data_dir: DataDir = Path(".onceflow"),
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    billing_port: BillingPort = 8081,
    api_port: ApiPort = 8082,
    report: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
) -> None:
    """Run the scenarios on a running `onceflow dev`, or on a stack started just for the demo."""
    from onceflow.cli.demo import run_demo
    from onceflow.cli.dev import DevStack, StackConfig, running_stack

    async def main() -> bool:
        info = running_stack(data_dir.resolve())
        stack = None
        if info is None:
            stack = DevStack(StackConfig(data_dir, temporal_port, ui_port, billing_port, api_port))
            typer.echo("starting the embedded stack (Temporal, PostgreSQL, billing, worker, operator API)...")
            info = await stack.start()
        os.environ.update(info.environment())
        try:
            results = await run_demo(info)
        finally:
            if stack is not None:
                await stack.stop()
        if report:
            report.write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
        passed = sum(r.ok for r in results)
        typer.echo(f"\n{passed} passed, {len(results) - passed} failed")
        if info.ui_url:
            typer.echo(f"Temporal UI: {info.ui_url}/namespaces/{info.namespace}/workflows")
            if stack is not None:
                typer.echo("(the stack stopped with the demo; `onceflow dev` keeps it up to browse the runs)")
        return passed == len(results)

    passed = asyncio.run(main())
    exit_after_cleanup(0 if passed else 1)  # the Temporal client's native threads must not crash the exit
