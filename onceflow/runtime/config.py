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
    # `apply`: the worker and the API bring the ledger's schema up to date when they start;
    # `check`: they only check it is, and refuse to start otherwise (for a deployment that migrates
    # with `onceflow migrate` as a step of its own, and whose processes may not change the schema).
    "ONCEFLOW_MIGRATE": "apply",
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
# wakes. Unset: default_max_cached_workflows(), sized from the machine. See docs/benchmarks.md.
# ONCEFLOW_SIGNALS: whether a `resolve` signal or update from outside the API may settle a call
# without an operator assertion the API signed (`open`) or only with one (`verified`).
# ONCEFLOW_PROFILE: `production` stops a worker whose ledger database can lose an acknowledged write
# (onceflow/ledger/durability.py; `onceflow doctor` prints the checks); `development` logs them.
# ONCEFLOW_LEDGER_REPLICATION: `managed` declares a managed service's synchronous copy, which
# PostgreSQL cannot show the ledger's role (docs/operations.md).
# ONCEFLOW_SEARCH_ATTRIBUTES: `register` adds onceflow's search attributes to the namespace when
# they are missing; `check` only checks, and refuses to start without them (an administrator adds
# them: docker-compose.yml's register-search-attributes).
WORKER_ENVIRONMENT = {
    "ONCEFLOW_SIGNALS": "verified",
    "ONCEFLOW_PROFILE": "development",
    "ONCEFLOW_LEDGER_REPLICATION": "streaming",
    "ONCEFLOW_SEARCH_ATTRIBUTES": "register",
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


# The worker's workflow cache when ONCEFLOW_MAX_CACHED_WORKFLOWS is unset. The SDK's own default,
# 1,000 runs, kept every paused run in memory: about 258 kB each, 420 MB for 1,000 paused runs
# (docs/benchmarks.md, waiting). A cached run only saves the replay of its history when its next task
# comes, which matters for runs with work in flight (at most the SDK's 100 workflow task slots plus
# its activities at a time), not for runs that wait hours on a person. So the cache holds
# CACHE_MOST_RUNS, or fewer where an eighth of the memory the process may use (the machine's, or
# its cgroup's limit in a container) would not hold that many.
CACHE_MOST_RUNS = 250
CACHE_LEAST_RUNS = 10
CACHE_RUN_BYTES = 256 * 1024
CACHE_MEMORY_SHARE = 8


def default_max_cached_workflows(memory_bytes: int | None = None) -> int:
    """How many runs the worker caches by default, for `memory_bytes` (default: this machine's)."""
    memory = memory_limit() if memory_bytes is None else memory_bytes
    if memory is None:
        return CACHE_MOST_RUNS
    by_memory = memory // CACHE_MEMORY_SHARE // CACHE_RUN_BYTES
    return max(CACHE_LEAST_RUNS, min(CACHE_MOST_RUNS, by_memory))


def memory_limit() -> int | None:
    """The memory this process may use: the machine's, or less under a cgroup limit; None if unknown."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


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
    profile: str = "development"  # ONCEFLOW_PROFILE as given; the durability check reads it
    ledger_replication: str = "streaming"  # ONCEFLOW_LEDGER_REPLICATION as given
    migrate: str = "apply"  # ONCEFLOW_MIGRATE as given; the worker and the API check it
    search_attributes: str = "register"  # ONCEFLOW_SEARCH_ATTRIBUTES as given; the worker checks it

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
            profile=env("ONCEFLOW_PROFILE"),
            ledger_replication=env("ONCEFLOW_LEDGER_REPLICATION"),
            migrate=env("ONCEFLOW_MIGRATE"),
            search_attributes=env("ONCEFLOW_SEARCH_ATTRIBUTES"),
        )


def _names(text: str) -> tuple[str, ...] | None:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return names or None
