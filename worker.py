"""Run a onceflow worker: `python worker.py`.

Reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, ONCEFLOW_TASK_QUEUE, ONCEFLOW_DATABASE_URL,
ONCEFLOW_AGENTS (default ./agents.yaml), ONCEFLOW_SHUTDOWN_GRACE and ONCEFLOW_HEALTH_FILE (a heartbeat
for `onceflow health`, optional). On SIGINT or SIGTERM it stops polling and lets in-flight activities
finish (up to the grace), then exits.
"""

from onceflow.runtime.worker import main

if __name__ == "__main__":
    main()
