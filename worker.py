"""Run a onceflow worker: `python worker.py`.

Reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, ONCEFLOW_TASK_QUEUE, ONCEFLOW_DATABASE_URL and
ONCEFLOW_AGENTS (default ./agents.yaml) and ONCEFLOW_SHUTDOWN_GRACE. On SIGINT or SIGTERM it stops
polling and lets in-flight activities finish (up to the grace), then exits.
"""

from onceflow.worker import main

if __name__ == "__main__":
    main()
