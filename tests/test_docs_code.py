"""The code in docs/adapters.md and README.md runs as written, so the pages cannot drift from the code.

docs/adapters.md is a page a newcomer follows top to bottom: every block is a whole file (its first
line names it). They are written out as they stand and run as the page says, as separate processes,
against the real Temporal dev server, PostgreSQL and the example billing service (honouring no key,
so a key sent twice would show as two requests): both workers, a refund with each framework, and one
whose answer billing loses, settled by the page's reconcile hook.

README.md's Python blocks: each is run here, except the client snippet of "Start a run from client
code", which needs the whole `onceflow dev` stack and runs in tests/test_e2e_dev_stack.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from onceflow.examples.billing.client import BillingClient

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# README blocks run elsewhere, by the heading they follow.
README_RUN_ELSEWHERE = {"## Start a run from client code": "tests/test_e2e_dev_stack.py"}


def page_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for language, body in FENCE.findall((REPO / "docs" / "adapters.md").read_text()):
        first = body.splitlines()[0]
        assert language == "python", f"a {language or 'plain'} block, which no test runs: {first!r}"
        assert first.startswith("# ") and first.endswith(".py"), f"a block that names no file: {first!r}"
        name = first[2:]
        assert name not in files, f"two blocks are {name}"
        files[name] = body
    return files


def test_every_block_of_the_adapters_page_is_a_whole_python_file() -> None:
    files = page_files()
    expected = {"billing_writes.py"} | {
        f"{framework}_{part}.py"
        for framework in ("pydantic", "openai")
        for part in ("agent", "workflow", "worker", "start")
    }
    assert set(files) == expected
    for name, body in files.items():
        compile(body, name, "exec")


def _environment(temporal_env: WorkflowEnvironment, database_url: str, billing_url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "TEMPORAL_", "OTEL_"))}
    return {
        **clean,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_BILLING_URL": billing_url,
    }


async def _run(folder: Path, env: dict[str, str], *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        cwd=folder,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, f"python {' '.join(args)} failed:\n{stderr.decode()}"
    return stdout.decode()


async def _track(
    folder: Path, env: dict[str, str], billing: BillingClient, framework: str, plain: str, lost: str | None
) -> list[tuple[str, str]]:
    """The page's worker for `framework`, one refund, then (`lost`) one whose answer billing loses."""
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        f"{framework}_worker.py",
        cwd=folder,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        ready = await asyncio.wait_for(worker.stdout.readline(), 60)
        assert ready.decode().strip() == "worker ready", ready
        answers = [await _run(folder, env, f"{framework}_start.py", plain)]
        if lost is not None:
            await billing.set_account_fault(f"acct_{lost}", "apply_then_hang", 30, times=1)
            answers.append(await _run(folder, env, f"{framework}_start.py", lost))
    finally:
        if worker.returncode is None:
            os.killpg(worker.pid, signal.SIGTERM)
        _, stderr = await asyncio.wait_for(worker.communicate(), 60)
    assert "Traceback" not in stderr.decode(), stderr.decode()
    return [tuple(answer.strip().split(" ", 1)) for answer in answers]  # type: ignore[misc]


async def test_the_adapters_page_runs_as_written_for_both_frameworks(
    temporal_env: WorkflowEnvironment,
    database_url: str,
    billing_url: str,
    billing: BillingClient,
    tmp_path: Path,
) -> None:
    for name, body in page_files().items():
        (tmp_path / name).write_text(body)
    env = _environment(temporal_env, database_url, billing_url)
    # Both workers at once; the answer lost once (the page's find_credit settles it): the hook is
    # the same code under either framework, and each process costs seconds on a loaded machine.
    pydantic, openai = await asyncio.gather(
        _track(tmp_path, env, billing, "pydantic", "o100", "o200"),
        _track(tmp_path, env, billing, "openai", "o300", None),
    )
    received = (await billing.received_counts()).counts
    [(plain_run, plain_answer), (lost_run, lost_answer)] = pydantic
    [(openai_run, openai_answer)] = openai
    for answer in (plain_answer, openai_answer):
        assert "credit_id" in answer and "reconciler" not in answer, answer
    assert "credit_id" in lost_answer and "reconciler" in lost_answer, lost_answer
    for run_id in (plain_run, lost_run, openai_run):
        keys = {key: n for key, n in received.items() if key.startswith(f"{run_id}:")}
        assert list(keys.values()) == [1], (run_id, received)  # one key, sent once


# -- README.md ------------------------------------------------------------------------------------


def readme_blocks() -> list[tuple[str, str]]:
    """(the heading above it, the block) of each Python block of README.md."""
    text = (REPO / "README.md").read_text()
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        heading = [line for line in text[: match.start()].splitlines() if line.startswith("#")][-1]
        found.append((heading, match.group(1)))
    return found


def test_the_readme_client_snippet_is_run_by_the_dev_stack_test() -> None:
    for heading, test in README_RUN_ELSEWHERE.items():
        assert heading in [h for h, _ in readme_blocks()]
        assert f'readme_block("{heading}", "python")' in (REPO / test).read_text()


async def test_each_readme_python_block_runs(billing_url: str, tmp_path: Path) -> None:
    # Each block is run as a module of its own (one process for all: each costs seconds to start).
    # Each declares tools; as the worker would at start-up, each toolset is then checked: every tool
    # keeps the contract, and a guard's budget reads a read tool that is there (WriteTools checks both).
    blocks = [(h, b) for h, b in readme_blocks() if h not in README_RUN_ELSEWHERE]
    assert len(blocks) >= 2
    for index, (_, block) in enumerate(blocks):
        (tmp_path / f"block_{index}.py").write_text(block)
    (tmp_path / "run_blocks.py").write_text(
        "import runpy\n"
        "from onceflow import Toolset\n"
        "from onceflow.adapters.host import WriteTools\n"
        f"for index in range({len(blocks)}):\n"
        "    found = runpy.run_path(f'block_{index}.py')\n"
        "    toolsets = {n: v for n, v in found.items() if isinstance(v, Toolset)}\n"
        "    for name, toolset in toolsets.items():\n"
        "        WriteTools(toolset, agent=name)\n"
        "    print(index, sorted(toolsets))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEFLOW_", "TEMPORAL_"))}
    output = await _run(tmp_path, {**clean, "ONCEFLOW_BILLING_URL": billing_url}, "run_blocks.py")
    for index, (heading, _) in enumerate(blocks):
        assert f"{index} []" not in output and f"{index} [" in output, f"{heading}: it declared no toolset"
