"""Configuration, from environment variables only (the same ones docker-compose.yml sets)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from onceflow.constants import TASK_QUEUE

# Every variable onceflow reads, with its default. README.md documents each one.
ENVIRONMENT = {
    "TEMPORAL_ADDRESS": "localhost:7233",
    "TEMPORAL_NAMESPACE": "default",
    "ONCEFLOW_TASK_QUEUE": TASK_QUEUE,
    "ONCEFLOW_DATABASE_URL": "",
    "ONCEFLOW_AGENTS": "agents.yaml",
    "ONCEFLOW_BILLING_URL": "http://127.0.0.1:8081",
}


def env(name: str) -> str:
    return os.environ.get(name) or ENVIRONMENT[name]


@dataclass(frozen=True)
class Settings:
    temporal_address: str
    temporal_namespace: str
    task_queue: str
    database_url: str
    agents_path: str

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            temporal_address=env("TEMPORAL_ADDRESS"),
            temporal_namespace=env("TEMPORAL_NAMESPACE"),
            task_queue=env("ONCEFLOW_TASK_QUEUE"),
            database_url=env("ONCEFLOW_DATABASE_URL"),
            agents_path=env("ONCEFLOW_AGENTS"),
        )
