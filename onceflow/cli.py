"""The `onceflow` command: dev stack, demo, runs, worker, migrations."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from onceflow.config import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agent tool calls that take effect once.")
run_app = typer.Typer(no_args_is_help=True, help="Start and inspect agent runs.")
app.add_typer(run_app, name="run")

DataDir = Annotated[Path, typer.Option(help="Where the dev stack keeps its state.")]
TemporalPort = Annotated[int, typer.Option(help="Temporal gRPC port.")]
UiPort = Annotated[int, typer.Option(help="Temporal Web UI port.")]
BillingPort = Annotated[int, typer.Option(help="Example billing service port.")]


def _exit_now(code: int) -> None:
    """Leave without interpreter finalization.

    Temporal's client runtime keeps native threads that can call into Python while the interpreter
    shuts down ("PyGILState_Release ... finalizing", SIGABRT) after the work is already done. Short
    CLI commands flush their output and leave directly.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _use_stack_environment(data_dir: Path) -> None:
    """Point this process at a running `onceflow dev` unless the environment already says where to go."""
    from onceflow.dev import running_stack

    info = running_stack(data_dir.resolve())
    if info is None:
        return
    for name, value in info.environment().items():
        os.environ.setdefault(name, value)


@app.command()
def dev(
    data_dir: DataDir = Path(".onceflow"),
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    billing_port: BillingPort = 8081,
) -> None:
    """Run Temporal, PostgreSQL, the billing example and a worker in the foreground. Ctrl-C stops all."""
    from onceflow.dev import DevStack, StackBusyError, StackConfig

    config = StackConfig(data_dir, temporal_port, ui_port, billing_port)

    async def serve() -> None:
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
            typer.echo("Start a run in another shell:")
            typer.echo(
                '  onceflow run start --agent billing-assistant --tenant acme --input \'{"order_id": "ord_1001"}\''
            )
            typer.echo("Ctrl-C stops everything.")
            while (problem := stack.check_alive()) is None:
                await asyncio.sleep(1)
            typer.echo(f"stopping: {problem}", err=True)
        finally:
            await stack.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        typer.echo("stopped")


@app.command()
def demo(
    data_dir: DataDir = Path(".onceflow"),
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    billing_port: BillingPort = 8081,
    report: Annotated[Path | None, typer.Option(help="Also write the results as JSON here.")] = None,
) -> None:
    """Run the scenarios on a running `onceflow dev`, or on a stack started just for the demo."""
    from onceflow.demo import run_demo
    from onceflow.dev import DevStack, StackConfig, running_stack

    async def main() -> bool:
        info = running_stack(data_dir.resolve())
        stack = None
        if info is None:
            stack = DevStack(StackConfig(data_dir, temporal_port, ui_port, billing_port))
            typer.echo("starting the embedded stack (Temporal dev server, PostgreSQL, billing, worker)...")
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

    if not asyncio.run(main()):
        raise typer.Exit(1)


@run_app.command("start")
def run_start(
    agent: Annotated[str, typer.Option(help="Agent name from agents.yaml.")],
    tenant: Annotated[str, typer.Option(help="Tenant the run acts for.")],
    input: Annotated[
        str, typer.Option("--input", help="What the agent is asked (the scripted model reads JSON).")
    ],
    run_id: Annotated[str | None, typer.Option(help="Run id; never reuse one. Default: generated.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the run's final answer.")] = False,
    data_dir: DataDir = Path(".onceflow"),
) -> None:
    """Start an agent run and print its id."""
    from onceflow.client import RunIdTakenError, connect, start_run
    from onceflow.payloads import AgentRunInput

    _use_stack_environment(data_dir)

    async def main() -> None:
        client = await connect(Settings.from_env())
        try:
            handle = await start_run(
                client, AgentRunInput(agent=agent, tenant=tenant, input=input), run_id=run_id
            )
        except RunIdTakenError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        typer.echo(handle.id)
        if wait:
            result = await handle.result()
            typer.echo(result.final)

    asyncio.run(main())
    _exit_now(0)


@app.command()
def worker() -> None:
    """Run a worker (same as `python worker.py`)."""
    from onceflow.worker import main

    main()


@app.command()
def migrate(database_url: Annotated[str | None, typer.Option(envvar="ONCEFLOW_DATABASE_URL")] = None) -> None:
    """Apply the ledger's migrations."""
    from ledger import migrate as apply

    if not database_url:
        typer.echo("set ONCEFLOW_DATABASE_URL or pass --database-url", err=True)
        raise typer.Exit(2)
    version = asyncio.run(apply(database_url))
    typer.echo(f"ledger schema at version {version}")


def main() -> None:
    app()
