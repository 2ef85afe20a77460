"""`onceflow tokens create` prints the token alone on stdout, so `export ONCEFLOW_TOKEN=$(...)` works.

The README tells operators to make a token that way; the line about the token (its id, tenant,
operator, that it is shown once) goes to stderr, where the shell's `$(...)` leaves it. The real
command, as a process, against a real PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from onceflow.ledger import Ledger, OperatorTokens

ONCEFLOW = Path(sys.executable).parent / "onceflow"
README = Path(__file__).resolve().parent.parent / "README.md"


async def _run(*command: str, database_url: str, cwd: Path) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `command`, with the ledger at `database_url`."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ONCEFLOW_DATABASE_URL": database_url},
        cwd=cwd,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_the_token_alone_is_on_stdout_and_the_note_on_stderr(
    database_url: str, ledger: Ledger, tmp_path: Path
) -> None:
    code, stdout, stderr = await _run(
        str(ONCEFLOW),
        "tokens",
        "create",
        "--tenant",
        "acme",
        "--operator",
        "alice",
        database_url=database_url,
        cwd=tmp_path,
    )
    assert code == 0, stderr
    secret = stdout.removesuffix("\n")
    assert secret and "\n" not in secret and " " not in secret
    token = await OperatorTokens(ledger).authenticate(secret)
    assert token is not None and (token.tenant, token.operator) == ("acme", "alice")
    assert f"id {token.id}, tenant acme, operator alice; shown once" in stderr


async def test_the_readme_export_line_holds_a_token_that_authenticates(
    database_url: str, ledger: Ledger, tmp_path: Path
) -> None:
    # The README's own line, run by a shell with this environment's onceflow; the shell then prints
    # what it exported.
    line = next(
        line for line in README.read_text().splitlines() if line.startswith("export ONCEFLOW_TOKEN=$(")
    )
    script = line.replace(".venv/bin/", f"{ONCEFLOW.parent}/") + '\nprintf %s "$ONCEFLOW_TOKEN"\n'
    code, stdout, stderr = await _run("sh", "-c", script, database_url=database_url, cwd=tmp_path)
    assert code == 0, stderr
    token = await OperatorTokens(ledger).authenticate(stdout)
    assert token is not None and token.tenant == "acme"
    assert "shown once" in stderr


async def test_data_dir_finds_the_dev_stack_running_there_like_run_start(
    database_url: str, ledger: Ledger, tmp_path: Path
) -> None:
    """`--data-dir` names the folder of a running `onceflow dev` (its stack.json); from any other
    directory, with no ONCEFLOW_DATABASE_URL, the token lands in that stack's ledger."""
    stack = tmp_path / "elsewhere" / "state"
    stack.mkdir(parents=True)
    info = {
        "temporal_address": "127.0.0.1:1",
        "namespace": "default",
        "task_queue": "onceflow",
        "database_url": database_url,
        "billing_url": "http://127.0.0.1:1",
        "ui_url": None,
        "api_url": None,
        "pid": os.getpid(),  # alive: this test's own process stands in for `onceflow dev`
    }
    (stack / "stack.json").write_text(json.dumps(info))
    env = {k: v for k, v in os.environ.items() if k != "ONCEFLOW_DATABASE_URL"}
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    command = [str(ONCEFLOW), "tokens", "create", "--tenant", "acme", "--operator", "dora"]
    for extra, expected in (([], 2), (["--data-dir", str(stack)], 0)):
        process = await asyncio.create_subprocess_exec(
            *command,
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=elsewhere,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == expected, stderr.decode()
    assert "no `onceflow dev` runs on" not in stderr.decode()
    token = await OperatorTokens(ledger).authenticate(stdout.decode().strip())
    assert token is not None and (token.tenant, token.operator) == ("acme", "dora")
