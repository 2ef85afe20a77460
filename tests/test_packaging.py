"""The built wheel, installed without extras into a clean virtual environment, is a working worker.

`pip install onceflow` must give a production worker what it imports and nothing more: no Temporal
dev server, no embedded PostgreSQL, no web server. In that environment every module of the wheel
imports, or names the extra it needs; `onceflow --help` answers; `onceflow worker --check` loads
agents.yaml and checks its tools without Temporal or PostgreSQL.

Slow-ish (a venv and pip, about 30 s): marker `packaging`, run by `make packaging` and `make test`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.test_dependencies import declared

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parent.parent
PIP_TIMEOUT = 600  # a cold pip cache downloads temporalio and friends

# Modules of the wheel that need an extra, and the extra their import error must name.
NEED_AN_EXTRA = {
    "onceflow.api": "api",
    "onceflow.api.app": "api",
    "onceflow.api.auth": "api",
    "onceflow.api.errors": "api",
    "onceflow.api.headers": "api",
    "onceflow.api.inputs": "api",
    "onceflow.api.metrics": "api",
    "onceflow.api.models": "api",
    "onceflow.api.options": "api",
    "onceflow.api.server": "api",
    "onceflow.api.console": "api",
    "onceflow.api.console.actions": "api",
    "onceflow.api.console.calls": "api",
    "onceflow.api.console.forms": "api",
    "onceflow.api.console.receiver": "api",
    "onceflow.api.console.rendering": "api",
    "onceflow.api.console.routes": "api",
    "onceflow.api.console.throttle": "api",
    "onceflow.api.problems": "api",
    "onceflow.api.routes": "api",
    "onceflow.api.routes.assertions": "api",
    "onceflow.api.routes.compensation": "api",
    "onceflow.api.routes.decisions": "api",
    "onceflow.api.routes.listing": "api",
    "onceflow.api.routes.params": "api",
    "onceflow.examples.billing.credits": "api",
    "onceflow.examples.billing.received": "api",
    "onceflow.examples.billing.problems": "api",
    "onceflow.examples.billing.service": "api",
    "onceflow.examples.billing.serving": "api",
    "onceflow.receiver.asgi": "receiver",
    "onceflow.receiver.fastapi": "receiver",
    "onceflow.receiver.mcp": "mcp",
    "onceflow.examples.refunds_mcp.__main__": "mcp",
    "onceflow.examples.refunds_mcp.server": "mcp",
    "onceflow.examples.billing_mcp": "mcp",
    "onceflow.examples.billing_mcp.__main__": "mcp",
    "onceflow.examples.billing_mcp.server": "mcp",
    "onceflow.examples.billing_mcp.store": "mcp",  # its package imports the server
    "onceflow.adapters.pydantic_ai": "pydantic-ai",
    "onceflow.examples.pydantic_ai_billing": "pydantic-ai",
    "onceflow.examples.pydantic_ai_billing.__main__": "pydantic-ai",
    "onceflow.examples.pydantic_ai_billing.agent": "pydantic-ai",
    "onceflow.examples.pydantic_ai_billing.workflow": "pydantic-ai",
    "onceflow.adapters.openai_agents": "openai-agents",
    "onceflow.examples.openai_agents_billing": "openai-agents",
    "onceflow.examples.openai_agents_billing.__main__": "openai-agents",
    "onceflow.examples.openai_agents_billing.agent": "openai-agents",
    "onceflow.examples.openai_agents_billing.workflow": "openai-agents",
}

# Run inside the clean environment: import every module the wheel installed, report each outcome.
IMPORT_EVERY_MODULE = """
import importlib, json, sys, sysconfig
from pathlib import Path
from onceflow.local.extras import MissingExtraError

site = Path(sysconfig.get_paths()["purelib"])
results = {}
for top in sys.argv[1:]:
    root = site / top
    files = sorted(root.rglob("*.py")) if root.is_dir() else [site / f"{top}.py"]
    for file in files:
        parts = list(file.relative_to(site).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        try:
            module = importlib.import_module(name)
        except MissingExtraError as exc:
            results[name] = {"extra": exc.extra, "message": str(exc)}
        except Exception as exc:
            results[name] = {"error": repr(exc)}
        else:
            results[name] = {"file": str(Path(module.__file__).resolve())}
print(json.dumps(results))
"""


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def run(
        self, *command: str, cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=cwd, env=env or clean_environment(), capture_output=True, text=True, timeout=120
        )


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points at the repository or its venv."""
    dropped = ("ONCEFLOW_", "TEMPORAL_", "OTEL_", "PYTHON", "VIRTUAL_ENV")
    environment = {name: value for name, value in os.environ.items() if not name.startswith(dropped)}
    environment["PATH"] = os.pathsep.join(
        part for part in environment.get("PATH", "").split(os.pathsep) if not part.startswith(str(ROOT))
    )
    return {**environment, **extra}


def pip(*arguments: str, python: str = sys.executable) -> None:
    done = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *arguments],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        env=clean_environment(),
    )
    assert done.returncode == 0, f"pip {' '.join(arguments)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # hatchling comes with the test extra, so no build environment is downloaded.
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(ROOT))
    [built] = out.glob("onceflow-*.whl")
    return built


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A new virtual environment with the wheel installed, no extras: pip brings the base deps."""
    path = tmp_path_factory.mktemp("base-venv")
    done = subprocess.run(
        [sys.executable, "-m", "venv", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    venv = Venv(path)
    pip("install", "--quiet", str(wheel), python=str(venv.bin / "python"))
    return venv


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the repository, so nothing is imported from the checkout."""
    return tmp_path


def installed_distributions(venv: Venv, cwd: Path) -> set[str]:
    done = venv.run(str(venv.bin / "python"), "-m", "pip", "list", "--format=json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {entry["name"].lower().replace("_", "-") for entry in json.loads(done.stdout)}


def test_the_base_install_holds_the_base_dependencies_and_nothing_of_the_extras(
    base_venv: Venv, elsewhere: Path
) -> None:
    installed = installed_distributions(base_venv, elsewhere)
    assert "onceflow" in installed
    assert declared()["base"] <= installed
    for extra in ("api", "dev", "test", "otlp"):
        only_there = declared()[extra] - declared()["base"]
        assert not installed & only_there, f"the base install pulled in {extra}: {installed & only_there}"
    check = base_venv.run(str(base_venv.bin / "python"), "-m", "pip", "check", cwd=elsewhere)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_wheel_ships_the_consoles_templates_and_style_sheet(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
    console = ROOT / "onceflow" / "api" / "console"
    shipped = [*console.glob("templates/*.html"), *console.glob("static/*")]
    assert len(shipped) > 5
    missing = [str(p.relative_to(ROOT)) for p in shipped if str(p.relative_to(ROOT)) not in names]
    assert missing == []


def test_every_module_of_the_wheel_imports_or_names_the_extra_it_needs(
    base_venv: Venv, elsewhere: Path
) -> None:
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    tops = [Path(package).name for package in hatch["packages"]]
    done = base_venv.run(str(base_venv.bin / "python"), "-I", "-c", IMPORT_EVERY_MODULE, *tops, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert {
        "onceflow.runtime.worker",
        "onceflow.ledger.store",
        "onceflow.workflows.agent_run",
        "onceflow.activities.tools",
    } <= set(results)
    needing = {name: result.get("extra") for name, result in results.items() if "file" not in result}
    assert needing == NEED_AN_EXTRA, "modules that fail to import (or import but should not)"
    for name, extra in NEED_AN_EXTRA.items():
        assert f"pip install 'onceflow[{extra}]'" in results[name]["message"], results[name]
    outside = {name for name, result in results.items() if "file" in result and str(ROOT) in result["file"]}
    assert outside == set(), "imported from the checkout, not the installed wheel"


@pytest.mark.parametrize("command", [["onceflow"], ["python", "-m", "onceflow"]], ids=["script", "module"])
def test_the_installed_cli_answers_help(base_venv: Venv, elsewhere: Path, command: list[str]) -> None:
    done = base_venv.run(str(base_venv.bin / command[0]), *command[1:], "--help", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    for name in ("worker", "api", "dev", "health", "executions"):
        assert name in done.stdout


def test_the_installed_worker_check_passes_on_agents_yaml_without_temporal_or_postgres(
    base_venv: Venv, elsewhere: Path
) -> None:
    agents = elsewhere / "agents.yaml"
    agents.write_text((ROOT / "agents.yaml").read_text())
    # Nothing listens here: the check must not try.
    environment = clean_environment(
        TEMPORAL_ADDRESS="127.0.0.1:1", ONCEFLOW_DATABASE_URL="postgresql://127.0.0.1:1/x"
    )
    done = base_venv.run(str(base_venv.bin / "onceflow"), "worker", "--check", cwd=elsewhere, env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    shipped = yaml.safe_load((ROOT / "agents.yaml").read_text())["agents"]
    assert f"agents.yaml: {len(shipped)} agent(s) ({', '.join(sorted(shipped))})" in done.stdout
    assert "all keep the tool contract" in done.stdout


def test_the_installed_worker_check_fails_on_a_broken_agents_file(base_venv: Venv, elsewhere: Path) -> None:
    agents = elsewhere / "agents.yaml"
    agents.write_text(
        (ROOT / "agents.yaml").read_text().replace("onceflow.examples.billing.tools:", "examples.no_such:", 1)
    )
    done = base_venv.run(str(base_venv.bin / "onceflow"), "worker", "--check", cwd=elsewhere)
    assert done.returncode == 1
    assert "cannot start the worker: agents.yaml" in done.stderr
    assert "examples.no_such" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("command", "extra"),
    [(["api", "--port", "1"], "api"), (["dev", "--data-dir", "stack"], "dev")],
)
def test_commands_that_need_an_extra_say_which_and_start_nothing(
    base_venv: Venv, elsewhere: Path, command: list[str], extra: str
) -> None:
    done = base_venv.run(str(base_venv.bin / "onceflow"), *command, cwd=elsewhere)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"pip install 'onceflow[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"onceflow"}


# An application laid out the way Temporal's samples are: its own top-level `ledger` and `workflows`.
APP_FILES = {
    "pyproject.toml": """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
[project]
name = "someones-app"
version = "1.0"
[tool.hatch.build.targets.wheel]
packages = ["ledger", "workflows"]
""",
    "ledger/__init__.py": 'OWNER = "someones-app"\n',
    "workflows/__init__.py": 'OWNER = "someones-app"\n',
}

BOTH_IMPORT = """
import json, ledger, workflows
import onceflow.ledger, onceflow.workflows
from onceflow import Guards, Toolset, ToolContext, external, read
print(json.dumps({
    "app": [ledger.OWNER, workflows.OWNER],
    "ours": [onceflow.ledger.Ledger.__module__, onceflow.workflows.AgentRunWorkflow.__module__],
}))
"""


def test_the_wheel_installs_beside_an_app_with_its_own_ledger_and_workflows(
    wheel: Path, tmp_path: Path, elsewhere: Path
) -> None:
    source = tmp_path / "app"
    for name, text in APP_FILES.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), str(source))
    [app_wheel] = (tmp_path / "dist").glob("someones_app-*.whl")
    venv_path = tmp_path / "venv"
    done = subprocess.run([sys.executable, "-m", "venv", str(venv_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    venv = Venv(venv_path)
    pip("install", "--quiet", str(app_wheel), str(wheel), python=str(venv.bin / "python"))
    done = venv.run(str(venv.bin / "python"), "-I", "-c", BOTH_IMPORT, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "app": ["someones-app", "someones-app"],
        "ours": ["onceflow.ledger.store", "onceflow.workflows.agent_run"],
    }
