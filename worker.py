"""Run a onceflow worker: `python worker.py`.

Reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, ONCEFLOW_TASK_QUEUE, ONCEFLOW_DATABASE_URL,
ONCEFLOW_AGENTS (default ./agents.yaml) and ONCEFLOW_HEALTH_FILE (a heartbeat for `onceflow health`,
optional). Stops cleanly on SIGINT or SIGTERM.
"""

from onceflow.worker import main

if __name__ == "__main__":
    main()
