"""Configuration, from environment variables only (the same ones docker-compose.yml sets)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from onceflow.runtime.constants import TASK_QUEUE

# Every variable the worker and the operator API read, with its default. README.md documents each.
ENVIRONMENT = {
    "TEMPORAL_ADDRESS": "localhost:7233",
    "TEMPORAL_NAMESPACE": "default",
    "ONCEFLOW_TASK_QUEUE": TASK_QUEUE,
    "ONCEFLOW_DATABASE_URL": "",
    "ONCEFLOW_AGENTS": "agents.yaml",
    "ONCEFLOW_BILLING_URL": "http://127.0.0.1:8081",
    # Where the process writes its heartbeat for `onceflow health` (the container health check);
    # empty: no heartbeat.
    "ONCEFLOW_HEALTH_FILE": "",
    # The secret the API signs operator assertions with and workers check them with (at least 32
    # characters; activities/signal_door.py). Empty: no assertions can be made or accepted.
    "ONCEFLOW_SIGNAL_KEY": "",
}
# Read by the worker only. ONCEFLOW_SHUTDOWN_GRACE: seconds a SIGTERMed worker lets in-flight
# activities finish; unset means the longest tool timeout plus margins (see onceflow/runtime/worker.py).
# ONCEFLOW_AGENTS_ENABLED: which agents it must serve (comma-separated names); unset, it serves every
# agent whose model it can build and names the others in its log (onceflow/runtime/agents.py, check_models).
# ONCEFLOW_TEMPORAL_METRICS_PORT: where the Temporal SDK serves its worker metrics when
# OTEL_METRICS_EXPORTER includes prometheus (onceflow/metrics.py; onceflow's own are on
# OTEL_EXPORTER_PROMETHEUS_PORT).
# ONCEFLOW_MAX_CACHED_WORKFLOWS: how many runs the worker keeps in memory between their tasks
# (Temporal's workflow cache); a waiting run beyond it is evicted and replayed from history when it
# wakes. Unset: the SDK's default (1,000). See docs/benchmarks.md (waiting runs).
# ONCEFLOW_SIGNALS: whether a `resolve` signal or update from outside the API may settle a call
# without an operator assertion the API signed (`open`) or only with one (`verified`).
WORKER_ENVIRONMENT = {
    "ONCEFLOW_SIGNALS": "verified",
    "ONCEFLOW_SHUTDOWN_GRACE": "",
    "ONCEFLOW_MAX_CACHED_WORKFLOWS": "",
    "ONCEFLOW_AGENTS_ENABLED": "",
    "ONCEFLOW_TEMPORAL_METRICS_PORT": "9465",
}
# Read by `onceflow api` only: the port it listens on, the Temporal UI its console links runs to, the
# proxies it trusts to say a request came over HTTPS and from whom, how long a console session lasts
# idle and at most, where it serves /metrics for Prometheus (port 0: nowhere), and how the queue's
# gauges name a tenant (`name`, `hash` or `none`).
API_ENVIRONMENT = {
    "ONCEFLOW_API_PORT": "8082",
    "ONCEFLOW_TEMPORAL_UI": "http://127.0.0.1:8233",
    "ONCEFLOW_FORWARDED_ALLOW_IPS": "127.0.0.1,::1",
    "ONCEFLOW_CONSOLE_IDLE_TIMEOUT": "30m",
    "ONCEFLOW_CONSOLE_SESSION_LIFETIME": "12h",
    "ONCEFLOW_API_METRICS_HOST": "127.0.0.1",
    "ONCEFLOW_API_METRICS_PORT": "9466",
    "ONCEFLOW_METRICS_TENANT_LABEL": "name",
}
# Read by `onceflow executions`, an operator's client of the API.
OPERATOR_ENVIRONMENT = {
    "ONCEFLOW_API": "http://127.0.0.1:8082",
    "ONCEFLOW_TOKEN": "",  # a bearer token from `onceflow tokens create`
}
# Read by the example billing service only: the PostgreSQL database of its credits and the receiver
# kit's keys (when `--database-url` is not given).
BILLING_ENVIRONMENT = {"ONCEFLOW_BILLING_DATABASE_URL": ""}
ALL_ENVIRONMENT = {
    **ENVIRONMENT,
    **WORKER_ENVIRONMENT,
    **API_ENVIRONMENT,
    **OPERATOR_ENVIRONMENT,
    **BILLING_ENVIRONMENT,
}


def env(name: str) -> str:
    return os.environ.get(name) or ALL_ENVIRONMENT[name]


@dataclass(frozen=True)
class Settings:
    temporal_address: str
    temporal_namespace: str
    task_queue: str
    database_url: str
    agents_path: str
    shutdown_grace: str = ""  # ONCEFLOW_SHUTDOWN_GRACE as given; the worker checks it
    max_cached_workflows: str = ""  # ONCEFLOW_MAX_CACHED_WORKFLOWS as given; the worker checks it
    health_file: str = ""
    # None: serve every agent whose model can be built; else exactly these, or refuse to start.
    agents_enabled: tuple[str, ...] | None = None
    signals: str = "verified"  # ONCEFLOW_SIGNALS as given; the worker checks it
    signal_key: str = field(default="", repr=False)  # a secret: never in a log line

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            temporal_address=env("TEMPORAL_ADDRESS"),
            temporal_namespace=env("TEMPORAL_NAMESPACE"),
            task_queue=env("ONCEFLOW_TASK_QUEUE"),
            database_url=env("ONCEFLOW_DATABASE_URL"),
            agents_path=env("ONCEFLOW_AGENTS"),
            shutdown_grace=env("ONCEFLOW_SHUTDOWN_GRACE"),
            max_cached_workflows=os.environ.get("ONCEFLOW_MAX_CACHED_WORKFLOWS", ""),
            health_file=env("ONCEFLOW_HEALTH_FILE"),
            agents_enabled=_names(os.environ.get("ONCEFLOW_AGENTS_ENABLED", "")),
            signals=env("ONCEFLOW_SIGNALS"),
            signal_key=os.environ.get("ONCEFLOW_SIGNAL_KEY", ""),
        )


def _names(text: str) -> tuple[str, ...] | None:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return names or None
