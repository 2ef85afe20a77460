"""The `onceflow` command: dev stack, demo, runs, worker, migrations, operator API and tokens, drills."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from onceflow.cli.executions import executions_app
from onceflow.cli.ledger import ledger_app
from onceflow.mcp.inspect import mcp_app
from onceflow.runtime.config import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agent tool calls that take effect once.")
run_app = typer.Typer(no_args_is_help=True, help="Start and inspect agent runs.")
app.add_typer(run_app, name="run")
tokens_app = typer.Typer(no_args_is_help=True, help="Operator tokens for the API (stored hashed).")
app.add_typer(tokens_app, name="tokens")
app.add_typer(executions_app, name="executions")
app.add_typer(ledger_app, name="ledger")
app.add_typer(mcp_app, name="mcp")

DataDir = Annotated[Path, typer.Option(help="Where the dev stack keeps its state.")]
TemporalPort = Annotated[int, typer.Option(help="Temporal gRPC port.")]
UiPort = Annotated[int, typer.Option(help="Temporal Web UI port.")]
BillingPort = Annotated[int, typer.Option(help="Example billing service port.")]
ApiPort = Annotated[int, typer.Option(help="Operator API port.")]


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
    from onceflow.cli.dev import running_stack

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
    api_port: ApiPort = 8082,
) -> None:
    """Run Temporal, PostgreSQL, the billing example, a worker and the operator API. Ctrl-C stops all."""
    from onceflow.cli.dev import DevStack, StackBusyError, StackConfig

    config = StackConfig(data_dir, temporal_port, ui_port, billing_port, api_port)

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


@app.command()
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
    from onceflow.runtime.client import RunIdTakenError, connect, start_run
    from onceflow.sdk.payloads import AgentRunInput

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
def worker(
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only check the configuration (agents file, tool contracts) and exit 0 or 1; "
            "needs no Temporal and no database.",
        ),
    ] = False,
) -> None:
    """Run a worker (same as `python worker.py`)."""
    if check:
        from onceflow.runtime.worker import check_configuration

        problem, summary = check_configuration(Settings.from_env())
        if problem:
            typer.echo(problem, err=True)
            raise typer.Exit(1)
        typer.echo(summary)
        return
    from onceflow.runtime.worker import main

    main()


@app.command()
def health(
    max_age: Annotated[
        float, typer.Option(min=1, help="Seconds since the last good probe that still pass.")
    ] = 30,
) -> None:
    """Exit 0 if the worker or API writing ONCEFLOW_HEALTH_FILE passed its probe recently."""
    from onceflow.runtime.health import heartbeat_problem

    path = Settings.from_env().health_file
    if not path:
        typer.echo("ONCEFLOW_HEALTH_FILE is not set, so no heartbeat is written to check", err=True)
        raise typer.Exit(1)
    problem = heartbeat_problem(Path(path), max_age)
    if problem:
        typer.echo(f"unhealthy: {problem}", err=True)
        raise typer.Exit(1)
    typer.echo("healthy")


@app.command()
def migrate(database_url: Annotated[str | None, typer.Option(envvar="ONCEFLOW_DATABASE_URL")] = None) -> None:
    """Apply the ledger's migrations."""
    from onceflow.ledger import migrate as apply

    if not database_url:
        typer.echo("set ONCEFLOW_DATABASE_URL or pass --database-url", err=True)
        raise typer.Exit(2)
    version = asyncio.run(apply(database_url))
    typer.echo(f"ledger schema at version {version}")


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="ONCEFLOW_API_PORT", help="Port to listen on.")] = 8082,
) -> None:
    """Serve the operator API (list, resolve, approve, deny, compensate); OpenAPI at /openapi.json."""
    from onceflow.api.server import main

    main(host, port)


DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        envvar="ONCEFLOW_DATABASE_URL", help="The ledger database (default: the running `onceflow dev`)."
    ),
]


def _tokens(database_url: str | None) -> Any:
    if not database_url:
        _use_stack_environment(Path(".onceflow"))
        database_url = os.environ.get("ONCEFLOW_DATABASE_URL")
    if not database_url:
        typer.echo("set ONCEFLOW_DATABASE_URL or pass --database-url", err=True)
        raise typer.Exit(2)
    from onceflow.ledger import Ledger, OperatorTokens, migrate

    async def open_tokens() -> tuple[Ledger, OperatorTokens]:
        await migrate(database_url)
        ledger = await Ledger.connect(database_url, max_size=1)
        return ledger, OperatorTokens(ledger)

    return open_tokens


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option(help="The tenant this token acts for.")],
    operator: Annotated[str, typer.Option(help="Who uses it; recorded on every decision.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Create a token and print it once. Only its SHA-256 is stored."""
    from onceflow.ledger import ReasonRequiredError

    open_tokens = _tokens(database_url)

    async def create() -> None:
        ledger, tokens = await open_tokens()
        try:
            token, secret = await tokens.create(tenant=tenant, operator=operator)
        finally:
            await ledger.close()
        typer.echo(secret)
        typer.echo(f"id {token.id}, tenant {token.tenant}, operator {token.operator}; shown once", err=True)

    try:
        asyncio.run(create())
    except ReasonRequiredError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (tok_...), as `tokens list` shows.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a token: every request with it answers 401 from now on."""
    from onceflow.ledger import TokenNotFoundError

    open_tokens = _tokens(database_url)

    async def revoke() -> None:
        ledger, tokens = await open_tokens()
        try:
            token = await tokens.revoke(token_id)
        finally:
            await ledger.close()
        typer.echo(f"revoked {token.id} ({token.operator} in {token.tenant}) at {token.revoked_at}")

    try:
        asyncio.run(revoke())
    except TokenNotFoundError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(3) from None


@tokens_app.command("list")
def tokens_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """List tokens (never their secrets)."""
    open_tokens = _tokens(database_url)

    async def show() -> None:
        ledger, tokens = await open_tokens()
        try:
            found = await tokens.list_tokens(tenant)
        finally:
            await ledger.close()
        for token in found:
            state = f"revoked {token.revoked_at:%Y-%m-%d %H:%M}" if token.revoked_at else "active"
            typer.echo(f"{token.id}  {token.tenant:<16} {token.operator:<16} {state}")

    asyncio.run(show())


@app.command()
def drill(
    runs: Annotated[int, typer.Option(min=1, help="Agent runs to start.")] = 200,
    seed: Annotated[int, typer.Option(help="Seeds the plan of kill points and the random kills.")] = 1,
    report: Annotated[
        Path | None, typer.Option(help="JSON report path. Default: in the drill's folder.")
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="Each drill gets a fresh folder in here.")] = Path(
        ".onceflow/drills"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Runs in flight at once.")] = 8,
    random_kills: Annotated[bool, typer.Option(help="Also kill workers at random moments.")] = True,
    planned_kills: Annotated[bool, typer.Option(help="Kill workers at the planned kill points.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds before runs still going count as lost.")] = 1800,
    sabotage_resend_after_timeout: Annotated[
        bool, typer.Option(hidden=True, help="Tests of the drill only: workers that send a write twice.")
    ] = False,
    sabotage_intent: Annotated[
        str | None,
        typer.Option(
            hidden=True, help="Tests of the drill only: declare the credit tool's intent allow or hold."
        ),
    ] = None,
) -> None:
    """Crash drill: SIGKILL workers at every kill point and at random, then count sends per key at a
    receiver that honours no idempotency key."""
    from onceflow.drill.cli import run_from_cli
    from onceflow.drill.scenario import DrillConfig

    if sabotage_intent not in (None, "allow", "hold"):
        raise typer.BadParameter("allow or hold", param_hint="--sabotage-intent")
    config = DrillConfig(
        runs=runs,
        seed=seed,
        data_dir=data_dir,
        report=report,
        concurrency=concurrency,
        random_kills=random_kills,
        planned_kills=planned_kills,
        timeout=timeout,
        sabotage=sabotage_resend_after_timeout,
        sabotage_intent=sabotage_intent,
    )
    _exit_now(run_from_cli(config))


def main() -> None:
    from onceflow.local.extras import MissingExtraError

    try:
        app()
    except MissingExtraError as exc:
        # A part that needs an optional extra: say which one, not a traceback.
        typer.echo(str(exc), err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
