"""The `onceflow` command: dev stack, demo, runs, worker, migrations, operator API and tokens, drills.

This module assembles the typer app and holds the short commands; the local stack's commands are
onceflow/cli/stack.py, operator tokens onceflow/cli/tokens.py, `executions` and `ledger` their own."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from onceflow.cli.executions import executions_app
from onceflow.cli.ledger import ledger_app
from onceflow.cli.stack import DataDir, demo, dev, use_stack_environment
from onceflow.cli.tokens import tokens_app
from onceflow.mcp.inspect import mcp_app
from onceflow.runtime.config import Settings
from onceflow.runtime.process_exit import exit_after_cleanup

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agent tool calls that take effect once.")
run_app = typer.Typer(no_args_is_help=True, help="Start and inspect agent runs.")
app.add_typer(run_app, name="run")
app.add_typer(tokens_app, name="tokens")
app.add_typer(executions_app, name="executions")
app.add_typer(ledger_app, name="ledger")
app.add_typer(mcp_app, name="mcp")


# The stack's commands live in onceflow/cli/stack.py, the tokens group in onceflow/cli/tokens.py;
# registered here, in the order `onceflow --help` lists them.
app.command()(dev)
app.command()(demo)


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

    use_stack_environment(data_dir)

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
    exit_after_cleanup(0)


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
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve HTTPS with this certificate (PEM); needs --tls-key.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The certificate's private key (PEM).")] = None,
) -> None:
    """Serve the operator API (list, resolve, approve, deny, compensate) and its console; OpenAPI at
    /openapi.json; /metrics on ONCEFLOW_API_METRICS_HOST:ONCEFLOW_API_METRICS_PORT."""
    from onceflow.api.server import Tls, main

    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither", param_hint="--tls-cert")
    main(host, port, Tls(tls_cert, tls_key) if tls_cert and tls_key else None)


@app.command("receiver-drill")
def receiver_drill(
    runs: Annotated[int, typer.Option(min=1, help="Agent runs to start, one credit each.")] = 200,
    seed: Annotated[int, typer.Option(help="Seeds the faults and the random kills.")] = 1,
    report: Annotated[
        Path | None, typer.Option(help="JSON report path. Default: in the drill's folder.")
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="Each drill gets a fresh folder in here.")] = Path(
        ".onceflow/drills"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Runs in flight at once.")] = 8,
    timeout: Annotated[float, typer.Option(help="Seconds before runs still going count as lost.")] = 1800,
) -> None:
    """Receiver drill: a receiver whose only dedup is onceflow's receiver kit, workers AND the
    receiver SIGKILLed at random; then effects per key, and unknown calls made, settled by the kit, left."""
    from onceflow.drill.kit import KitDrillConfig, run_kit_drill_from_cli

    config = KitDrillConfig(
        runs=runs, seed=seed, data_dir=data_dir, report=report, concurrency=concurrency, timeout=timeout
    )
    raise typer.Exit(run_kit_drill_from_cli(config))


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
            hidden=True, help="Tests of the drill only: declare the credit tool's intent allow or reuse."
        ),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(hidden=True, help="Tests of the drill only: plan just this kind of run (repeatable)."),
    ] = None,
) -> None:
    """Crash drill: SIGKILL workers at every kill point and at random, then count sends per key at a
    receiver that honours no idempotency key."""
    from onceflow.drill.cli import run_from_cli
    from onceflow.drill.scenario import KIND_NAMES, DrillConfig

    if sabotage_intent not in (None, "allow", "reuse"):
        raise typer.BadParameter("allow or reuse", param_hint="--sabotage-intent")
    if set(only or ()) - set(KIND_NAMES):
        raise typer.BadParameter(", ".join(KIND_NAMES), param_hint="--only")
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
        only=tuple(only or ()),
    )
    exit_after_cleanup(run_from_cli(config))


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
