"""OTEL_METRICS_EXPORTER=otlp: a real worker process pushes onceflow's metrics and the Temporal SDK's
own worker metrics to the OTLP endpoint the standard variables name (here a receiver in this test)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from temporalio.testing import WorkflowEnvironment

from onceflow.runtime.client import start_run
from onceflow.sdk.payloads import AgentRunInput
from tests.support.billing_tools import PROCESS_AGENTS_YAML
from tests.support.processes import ChildProcesses


class Receiver:
    """An OTLP/HTTP metrics endpoint: the names of every metric posted to /v1/metrics, per service."""

    def __init__(self) -> None:
        self.names: dict[str, set[str]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest.FromString(body)
                with receiver.lock:
                    for resource in request.resource_metrics:
                        service = next(
                            (
                                a.value.string_value
                                for a in resource.resource.attributes
                                if a.key == "service.name"
                            ),
                            "",
                        )
                        seen = receiver.names.setdefault(service, set())
                        seen |= {m.name for scope in resource.scope_metrics for m in scope.metrics}
                self.send_response(200 if self.path == "/v1/metrics" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def all_names(self) -> set[str]:
        with self.lock:
            return set().union(*self.names.values()) if self.names else set()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    thread = threading.Thread(target=found.server.serve_forever, daemon=True)
    thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


async def test_a_worker_pushes_its_own_and_the_sdk_metrics_over_otlp(
    temporal_env: WorkflowEnvironment, database_url: str, billing_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    client = temporal_env.client
    agents = tmp_path / "agents.yaml"
    agents.write_text(PROCESS_AGENTS_YAML)
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_DATABASE_URL": database_url,
        "ONCEFLOW_AGENTS": str(agents),
        "ONCEFLOW_BILLING_URL": billing_url,
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server.server_port}",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_SERVICE_NAME": "otlp-test-worker",
    }
    processes = ChildProcesses(tmp_path / "logs")
    try:
        processes.start("worker", ["worker.py"], env)
        handle = await start_run(
            client,
            AgentRunInput(
                agent="credit-billing", tenant="acme", input=json.dumps({"order_id": "ord_otlp_1"})
            ),
            run_id=f"run-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
        )
        await asyncio.wait_for(handle.result(), 60)
        wanted = {"onceflow.call.sent", "temporal_worker_task_slots_available"}
        async with asyncio.timeout(30):
            while not wanted <= receiver.all_names():
                await asyncio.sleep(0.2)
    except TimeoutError:
        pytest.fail(f"received {sorted(receiver.all_names())}\n{processes.logs_text()}")
    finally:
        processes.close()
    assert "onceflow.call.sent" in receiver.names["otlp-test-worker"]
