# The onceflow image: the worker (default command, `python worker.py`) and the example billing
# service (`python -m examples.billing.service ...`). docker-compose.yml builds it for both.
#
#   docker build -t onceflow .
#   docker build --build-arg EXTRAS= -t onceflow .      # without the OTLP exporter
#
# The project is installed as a package (not editable, no test extras) into /opt/venv; /app holds
# only worker.py and agents.yaml, so what runs is what was installed.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Dependencies first, read from pyproject.toml alone, so this layer is rebuilt only when
# pyproject.toml changes, not on every source edit. EXTRAS: comma-separated optional extras.
ARG EXTRAS=otlp
COPY pyproject.toml ./
RUN python -c 'import os, tomllib; \
project = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
extras = [name for name in os.environ.get("EXTRAS", "").split(",") if name]; \
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
# A fixed non-root user; /data is where the billing service keeps its SQLite file (a volume in
# docker-compose.yml: a fresh named volume takes this directory's owner).
RUN groupadd --system --gid 10001 onceflow \
 && useradd --system --uid 10001 --gid onceflow --home-dir /app --no-create-home --shell /usr/sbin/nologin onceflow \
 && mkdir -p /app /data \
 && chown onceflow:onceflow /data
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY worker.py agents.yaml ./
USER onceflow:onceflow
EXPOSE 8081
CMD ["python", "worker.py"]
