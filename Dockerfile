# The onceflow image: the worker (default command, `python worker.py`), the operator API
# (`onceflow api`) and the example billing service (`python -m onceflow.examples.billing.service ...`).
# docker-compose.yml builds it once for all three.
#
#   docker build -t onceflow .
#   docker build --build-arg EXTRAS=api -t onceflow .      # without the OTLP exporter
#   docker build --build-arg EXTRAS= -t onceflow-worker .  # a worker only: no web server at all
#
# Production install only: the base dependencies plus EXTRAS (api for the operator API and the
# billing example, otlp for tracing), never the dev extra (Temporal dev server, embedded
# PostgreSQL) or test tools; the build refuses those. The project is installed as a package (not
# editable) into /opt/venv; /app holds only worker.py and agents.yaml, so what runs is what was
# installed. It runs as a fixed non-root user.
#
# HEALTHCHECK serves the worker and the operator API alike: each writes a heartbeat to
# ONCEFLOW_HEALTH_FILE, and `onceflow health` passes while it is fresh, i.e. the process probed
# what it needs in the last 30 s (the worker: its Temporal worker runs, Temporal and the ledger
# answer; the API: its own /healthz, Temporal and the ledger answer). The billing example writes
# none; docker-compose.yml gives it an HTTP check of its own.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, read from pyproject.toml alone, so this layer is rebuilt only when
# pyproject.toml changes, not on every source edit. EXTRAS: comma-separated production extras.
ARG EXTRAS=api,otlp
COPY pyproject.toml ./
RUN python -c 'import os, sys, tomllib; \
project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
extras = [name for name in os.environ.get("EXTRAS", "").split(",") if name]; \
refused = [name for name in extras if name in ("dev", "test")]; \
refused and sys.exit(f"EXTRAS: {refused} are not for a production image (dev stack, test tools)"); \
wanted = project["dependencies"] + [req for name in extras for req in project["optional-dependencies"][name]]; \
open("requirements.txt", "w").write("\n".join(wanted) + "\n")' \
 && pip install -r requirements.txt

# Then the project itself, without touching the dependencies installed above.
COPY README.md worker.py ./
COPY onceflow ./onceflow
COPY ledger ./ledger
COPY workflows ./workflows
COPY activities ./activities
COPY examples ./examples
RUN pip install --no-deps . \
 && pip check


FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed non-root user; /data is a writable place for a volume, should a deployment want one (the
# billing example keeps its credits in PostgreSQL).
RUN groupadd --system --gid 10001 onceflow \
 && useradd --system --uid 10001 --gid onceflow --home-dir /app --no-create-home --shell /usr/sbin/nologin onceflow \
 && mkdir -p /app /data \
 && chown onceflow:onceflow /data
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY worker.py agents.yaml ./
USER onceflow:onceflow
# The worker or the API writes its heartbeat here; /tmp is writable by the user.
ENV ONCEFLOW_HEALTH_FILE=/tmp/onceflow-health.json
EXPOSE 8081 8082
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 CMD ["onceflow", "health"]
CMD ["python", "worker.py"]
