"""docker-compose.yml is a production shape, and the image carries only the production install.

Temporal on its current server image, its schema set up first by Temporal's own admin tools (never
the deprecated auto-setup image), PostgreSQL on a named volume, the UI, more than one worker, stop
grace periods that outlast the worker's own shutdown grace, and health checks that run real
commands. Reads the files (the build machines have no Docker engine); the schema script and the
Dockerfile's requirements step are run for real, with a recording stand-in for temporal-sql-tool.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.support.compose_files import (
    ROOT,
    argv,
    command_problem,
    compose,
    depends_on,
    dockerfile,
    final_stage,
    image_default_command,
    published_ports,
    repo_built_services,
    services,
)
from tests.test_dependencies import declared, requirement_name

# The variables Temporal's built-in config template reads that a PostgreSQL set-up may use
# (temporalio/temporal common/config/config_template_embedded.yaml, server 1.32).
TEMPORAL_SERVER_ENVIRONMENT = {
    "DB",
    "DBNAME",
    "VISIBILITY_DBNAME",
    "DB_PORT",
    "POSTGRES_SEEDS",
    "POSTGRES_USER",
    "POSTGRES_PWD",
    "VISIBILITY_DB_PORT",
    "VISIBILITY_POSTGRES_SEEDS",
    "VISIBILITY_POSTGRES_USER",
    "VISIBILITY_POSTGRES_PWD",
    "SQL_MAX_CONNS",
    "SQL_MAX_IDLE_CONNS",
    "SQL_MAX_CONN_TIME",
    "SQL_VIS_MAX_CONNS",
    "SQL_VIS_MAX_IDLE_CONNS",
    "SQL_VIS_MAX_CONN_TIME",
    "SQL_CONNECT_TIMEOUT",
    "SQL_TLS_ENABLED",
    "NUM_HISTORY_SHARDS",
    "LOG_LEVEL",
    "BIND_ON_IP",
    "TEMPORAL_BROADCAST_ADDRESS",
    "PROMETHEUS_ENDPOINT",
    "DYNAMIC_CONFIG_FILE_PATH",
}
SHUTDOWN_MARGIN = 10  # seconds the worker needs after its grace: close the pool, the connection
# Long-running services without a health check, and why.
NO_HEALTHCHECK = {"temporal-ui": "nothing depends on it; the image documents no health command"}


def service(name: str) -> dict[str, Any]:
    return services()[name]


def environment(name: str) -> dict[str, str]:
    value = service(name).get("environment") or {}
    assert isinstance(value, dict), f"{name}: write `environment` as a mapping"
    return {str(key): str(item) for key, item in value.items()}


def image(name: str) -> tuple[str, str]:
    repository, _, tag = str(service(name)["image"]).partition(":")
    return repository, tag


def admin_tools_jobs() -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in services().items() if image(name)[0] == "temporalio/admin-tools"}


def seconds(duration: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", duration)
    assert parts and "".join(number + unit for number, unit in parts) == duration, duration
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 0.000001}
    return sum(float(number) * scale[unit] for number, unit in parts)


def mounted(name: str, target: str) -> Path | None:
    """The repository file mounted at `target` in service `name`, if any."""
    for volume in service(name).get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target and source.startswith("."):
            return ROOT / source
    return None


# --- Temporal: current server image, schema by its own admin tools --------------------------------


def test_no_service_runs_temporals_deprecated_auto_setup_image() -> None:
    assert [name for name in services() if "auto-setup" in str(services()[name].get("image", ""))] == []
    assert image("temporal")[0] == "temporalio/server"


def test_temporals_schema_is_set_up_by_its_admin_tools_before_the_server_starts() -> None:
    jobs = {
        name: spec
        for name, spec in admin_tools_jobs().items()
        if "setup-schema.sh" in " ".join(argv(spec.get("entrypoint")) + argv(spec.get("command")))
    }
    assert list(jobs) == ["temporal-schema"]
    assert depends_on(service("temporal")) == {"temporal-schema": "service_completed_successfully"}
    assert depends_on(service("temporal-schema")) == {"postgresql": "service_healthy"}
    assert str(service("temporal-schema").get("restart")) == "no"
    assert mounted("temporal-schema", "/deploy/setup-schema.sh") == ROOT / "deploy/temporal/setup-schema.sh"


def test_every_admin_tools_job_matches_the_server_version() -> None:
    server_version = image("temporal")[1]
    assert re.fullmatch(r"\d+\.\d+\.\d+", server_version), "pin the server to a release"
    versions = {name: image(name)[1] for name in admin_tools_jobs()}
    assert {"temporal-schema", "create-namespace", "register-search-attributes"} <= set(versions)
    assert set(versions.values()) == {server_version}, "schema and CLI tools must match the server"


def test_the_schema_job_and_the_server_use_the_same_databases_role_and_plugin() -> None:
    job, server = environment("temporal-schema"), environment("temporal")
    pairs = {
        "SQL_PLUGIN": "DB",
        "SQL_HOST": "POSTGRES_SEEDS",
        "SQL_PORT": "DB_PORT",
        "SQL_USER": "POSTGRES_USER",
        "SQL_PASSWORD": "POSTGRES_PWD",
        "DBNAME": "DBNAME",
        "VISIBILITY_DBNAME": "VISIBILITY_DBNAME",
    }
    assert {ours: job[ours] for ours in pairs} == {ours: server[theirs] for ours, theirs in pairs.items()}
    assert server["DB"] == "postgres12"
    assert server["POSTGRES_SEEDS"] == "postgresql" and "postgresql" in services()


def test_the_schema_script_creates_sets_up_and_updates_both_stores(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    tool = tmp_path / "temporal-sql-tool"
    # Records each call (the password must come from the environment, not the command line).
    tool.write_text(f'#!/bin/sh\necho "$* | password=$SQL_PASSWORD" >> {calls}\n')
    tool.chmod(0o755)
    job = environment("temporal-schema")
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "deploy/temporal/setup-schema.sh")],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", **job},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    connection = f"--plugin postgres12 --ep {job['SQL_HOST']} -p {job['SQL_PORT']} -u {job['SQL_USER']}"
    schemas = "/etc/temporal/schema/postgresql/v12"
    expected = []
    for database, store in ((job["DBNAME"], "temporal"), (job["VISIBILITY_DBNAME"], "visibility")):
        expected += [
            f"{connection} --db {database} create",
            f"{connection} --db {database} setup-schema -v 0.0",
            f"{connection} --db {database} update-schema -d {schemas}/{store}/versioned",
        ]
    assert calls.read_text().splitlines() == [f"{call} | password={job['SQL_PASSWORD']}" for call in expected]


def test_the_schema_script_stops_at_the_first_failure(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    tool = tmp_path / "temporal-sql-tool"
    tool.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *setup-schema*) exit 1;; esac\n')
    tool.chmod(0o755)
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "deploy/temporal/setup-schema.sh")],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", **environment("temporal-schema")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert len(calls.read_text().splitlines()) == 2, "ran on after setup-schema failed"


def test_the_server_is_configured_only_by_variables_its_config_template_reads() -> None:
    server = environment("temporal")
    assert set(server) <= TEMPORAL_SERVER_ENVIRONMENT
    assert {"DB", "POSTGRES_SEEDS", "POSTGRES_USER", "POSTGRES_PWD", "BIND_ON_IP"} <= set(server)
    dynamic = server["DYNAMIC_CONFIG_FILE_PATH"]
    assert PurePosixPath(dynamic).is_absolute()
    source = mounted("temporal", dynamic)
    assert source is not None and source.is_file(), f"nothing of the repository is mounted at {dynamic}"


def test_the_namespace_is_created_before_anything_uses_it() -> None:
    namespace = environment("worker")["TEMPORAL_NAMESPACE"]
    assert environment("create-namespace")["TEMPORAL_NAMESPACE"] == namespace
    assert environment("register-search-attributes")["TEMPORAL_NAMESPACE"] == namespace
    assert environment("temporal-ui")["TEMPORAL_DEFAULT_NAMESPACE"] == namespace
    assert depends_on(service("create-namespace")) == {"temporal": "service_healthy"}
    assert depends_on(service("register-search-attributes"))["create-namespace"] == (
        "service_completed_successfully"
    )
    assert depends_on(service("operator-api"))["create-namespace"] == "service_completed_successfully"
    assert (
        mounted("create-namespace", "/deploy/create-namespace.sh")
        == ROOT / "deploy/temporal/create-namespace.sh"
    )


def test_the_ui_and_the_onceflow_services_talk_to_the_temporal_service() -> None:
    assert image("temporal-ui")[0] == "temporalio/ui"
    for name in ("temporal-ui", "worker", "operator-api", "create-namespace", "register-search-attributes"):
        assert environment(name)["TEMPORAL_ADDRESS"] == "temporal:7233", name


# --- PostgreSQL -----------------------------------------------------------------------------------


def test_postgresql_keeps_its_data_on_a_named_volume() -> None:
    named = [str(volume).split(":") for volume in service("postgresql")["volumes"]]
    data = [parts[0] for parts in named if parts[1:2] == ["/var/lib/postgresql/data"]]
    assert data and not data[0].startswith((".", "/")), "the data directory is not a named volume"
    assert data[0] in (compose().get("volumes") or {}), f"volume {data[0]} is not declared"


def test_the_database_roles_let_temporals_tool_create_its_databases() -> None:
    script = (ROOT / "deploy/postgres/init-databases.sh").read_text()
    assert re.search(r"CREATE ROLE temporal LOGIN CREATEDB", script)
    assert "CREATE DATABASE temporal" not in script, "temporal-sql-tool creates Temporal's databases"
    assert "CREATE DATABASE onceflow OWNER onceflow" in script


# --- workers: more than one, drained before they are killed ----------------------------------------


def test_the_worker_runs_more_than_one_replica_and_can_be_scaled() -> None:
    worker = service("worker")
    assert int(worker.get("deploy", {}).get("replicas", 1)) >= 2
    assert "container_name" not in worker, "a fixed container name allows one replica only"


def test_the_worker_stop_grace_outlasts_its_shutdown_grace() -> None:
    grace = float(environment("worker")["ONCEFLOW_SHUTDOWN_GRACE"])
    assert grace > 0
    assert seconds(str(service("worker")["stop_grace_period"])) >= grace + SHUTDOWN_MARGIN


def test_a_service_the_worker_calls_outlives_it_on_shutdown() -> None:
    # Compose stops a service before the services it depends on, so billing keeps answering the
    # worker's calls in flight while the worker drains.
    assert {"billing", "temporal", "postgresql"} <= set(depends_on(service("worker")))


@pytest.mark.parametrize("duration", ["75s", "1m15s", "2m"])
def test_durations_are_read_like_compose_does(duration: str) -> None:
    assert seconds(duration) in (75, 120)


# --- health checks --------------------------------------------------------------------------------


def dockerfile_healthcheck() -> list[str]:
    checks = [instruction for instruction in final_stage() if instruction.keyword == "HEALTHCHECK"]
    assert checks, "the image has no HEALTHCHECK"
    _, _, command = checks[-1].rest.partition("CMD ")
    return argv(json.loads(command)) if command.startswith("[") else argv(command)


def healthcheck_command(name: str) -> list[str] | None:
    check = service(name).get("healthcheck")
    if check is None:
        return None
    test = argv(check["test"])
    assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck test {test}"
    return test[1:]


def test_every_long_running_service_has_a_health_check() -> None:
    missing = []
    for name, spec in services().items():
        if str(spec.get("restart", "no")) == "no" or name in NO_HEALTHCHECK:
            continue
        inherits = name in repo_built_services() and not spec.get("command")
        if healthcheck_command(name) is None and not inherits:
            missing.append(name)
    assert missing == []


@pytest.mark.parametrize("name", ["worker", "operator-api"])
def test_the_worker_and_api_health_checks_run_a_project_command_that_reads_their_heartbeat(
    name: str,
) -> None:
    command = healthcheck_command(name)
    assert command == ["onceflow", "health"]
    assert command_problem(command) is None
    assert environment(name)["ONCEFLOW_HEALTH_FILE"], f"{name} writes no heartbeat"


def test_the_images_own_health_check_reads_the_heartbeat_the_services_write() -> None:
    assert image_default_command() == ["python", "worker.py"]
    command = dockerfile_healthcheck()
    assert command == ["onceflow", "health"]
    assert command_problem(command) is None
    image_env = {
        key: value
        for instruction in final_stage()
        if instruction.keyword == "ENV"
        for key, value in re.findall(r"(\w+)=(\S+)", instruction.rest)
    }
    for name in ("worker", "operator-api"):
        assert image_env.get("ONCEFLOW_HEALTH_FILE") == environment(name)["ONCEFLOW_HEALTH_FILE"], name


def test_the_billing_example_checks_its_own_health_endpoint() -> None:
    command = " ".join(healthcheck_command("billing") or [])
    assert f"127.0.0.1:{published_ports(service('billing'))[0][2]}/health" in command


# --- the image: production install only ------------------------------------------------------------


def requirements_step() -> tuple[str, str]:
    """The Dockerfile's step that writes requirements.txt, and its default EXTRAS."""
    default = next(
        instruction.rest.partition("=")[2]
        for instruction in dockerfile()
        if instruction.keyword == "ARG" and instruction.rest.startswith("EXTRAS=")
    )
    step = next(
        instruction.rest
        for instruction in dockerfile()
        if instruction.keyword == "RUN" and "requirements.txt" in instruction.rest
    )
    script, _, rest = step.partition(" && pip install -r requirements.txt")
    assert rest == "", f"the requirements step does more than write and install them: {rest!r}"
    return script, default


def run_requirements_step(tmp_path: Path, extras: str) -> subprocess.CompletedProcess[str]:
    script, _ = requirements_step()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    return subprocess.run(
        ["/bin/sh", "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "EXTRAS": extras},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_image_installs_the_base_dependencies_and_production_extras_only(tmp_path: Path) -> None:
    _, default = requirements_step()
    assert set(default.split(",")) == {"api", "otlp"}  # compose runs the API and billing from it
    done = run_requirements_step(tmp_path, default)
    assert done.returncode == 0, done.stderr
    wanted = {requirement_name(line) for line in (tmp_path / "requirements.txt").read_text().split()}
    assert wanted == declared()["base"] | declared()["api"] | declared()["otlp"]
    assert not wanted & (declared()["dev"] - declared()["api"]), "the dev stack is in the image"
    assert not wanted & declared()["test"], "test tools are in the image"


@pytest.mark.parametrize("extras", ["dev", "api,test"])
def test_the_image_build_refuses_the_dev_and_test_extras(tmp_path: Path, extras: str) -> None:
    done = run_requirements_step(tmp_path, extras)
    assert done.returncode != 0
    assert "not for a production image" in done.stderr
    assert not (tmp_path / "requirements.txt").exists()


def test_the_project_itself_is_installed_without_touching_the_dependencies() -> None:
    runs = [instruction.rest for instruction in dockerfile() if instruction.keyword == "RUN"]
    assert any(re.search(r"pip install --no-deps \.(\s|$)", run) for run in runs)
    assert not any("-e " in run or "--editable" in run for run in runs), "the image installs editable"
