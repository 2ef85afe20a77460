"""The layout keeps its shape: no import cycles, and imports run one way between planes.

Every module under onceflow/ is parsed with `ast` (the symlinked workflows/, activities/, ledger/
and examples/ included, as `onceflow.workflows` and so on). For cycles, only imports that run when a
module is imported count: those at module level, outside `if TYPE_CHECKING:` (a provider's config
may build the provider's model in a function). The direction between planes holds for every import.

The planes, from the top; docs/architecture.md draws the same map. A module may import its own plane
and the planes below it, never one above. A plane is a list of module prefixes; the longest prefix
that matches a module decides its plane, so a module can sit below the rest of its folder:

    cli          the `onceflow` command, also as `python -m onceflow` (and `onceflow mcp inspect`, which
                 lives beside the MCP code)
    services     the operator API, the crash drill, the billing example: processes beside the worker;
                 the receiver kit (onceflow.receiver), a library for such services
    runtime      the worker process and what it starts with; the embedded local stack; the
                 framework adapters (their workflows host onceflow's write protocol)
    workflows    Temporal workflows: they order activities and decide nothing from the outside world
    activities   what workflows schedule: ledger steps, tool calls, model calls
    providers    agents.yaml (runtime/agents.py), model providers, MCP servers as toolsets
    sdk          what tool authors write against: tools, payloads, guard sources, durations
    ledger       the PostgreSQL ledger
    base         call keys, the metrics instruments, the worker's constants (task queue, search attributes, retry
                 policies): leaves that import nothing of onceflow, shared by workflows and ledger
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import onceflow

PACKAGE = Path(__file__).resolve().parent.parent / "onceflow"

# From the top plane down.
PLANES: list[tuple[str, list[str]]] = [
    ("cli", ["onceflow.cli", "onceflow.__main__", "onceflow.mcp.inspect"]),
    ("services", ["onceflow.api", "onceflow.drill", "onceflow.examples", "onceflow.receiver"]),
    ("runtime", ["onceflow.runtime", "onceflow.local", "onceflow.adapters"]),
    ("workflows", ["onceflow.workflows"]),
    ("activities", ["onceflow.activities"]),
    ("providers", ["onceflow.runtime.agents", "onceflow.models", "onceflow.mcp"]),
    ("sdk", ["onceflow.sdk"]),
    ("ledger", ["onceflow.ledger"]),
    ("base", ["onceflow.sdk.keys", "onceflow.runtime.constants", "onceflow.metrics"]),
]
# Public name -> the module `from onceflow import name` imports (onceflow/__init__.py).
REEXPORTED: dict[str, str] = onceflow._MODULE_OF
RANK = {plane: len(PLANES) - index for index, (plane, _) in enumerate(PLANES)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    # Path.rglob does not follow the symlinked folders before Python 3.13; os.walk is told to.
    for root, _, files in os.walk(PACKAGE, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                path = Path(root) / file
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in functions or classes' methods, not under
    `if TYPE_CHECKING:`; inside `try:` and other `if`s they do run."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _import_time_statements(node.body)
            found += _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _import_time_statements(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += _import_time_statements(node.body)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _every_import_statement(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports anywhere in the module: in functions and under `if TYPE_CHECKING:` too."""
    tree = ast.Module(body=body, type_ignores=[])
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _imports(module: str, path: Path, *, at_import_time: bool = True) -> set[str]:
    """The onceflow modules `module` imports: at import time, or anywhere."""
    is_package = path.name == "__init__.py"
    statements = _import_time_statements if at_import_time else _every_import_statement
    named: set[str] = set()  # modules the statements name, each imported with its parent packages
    for node in statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
            continue
        source = _resolve(module, is_package, node)
        submodules = {f"{source}.{alias.name}" for alias in node.names} & MODULES.keys()
        named |= submodules
        if source == "onceflow":  # a public name: `onceflow` imports its home module on first use
            named |= {REEXPORTED[alias.name] for alias in node.names if alias.name in REEXPORTED}
        if len(submodules) < len(node.names):  # `from package import name` needs the package itself
            named.add(source)
    targets: set[str] = set()
    for name in named:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            # The packages that hold `module` were imported before it: passing through one on the
            # way to a sibling adds nothing; naming one for a name it defines does.
            if (
                prefix in MODULES
                and prefix != module
                and (prefix == name or not module.startswith(prefix + "."))
            ):
                targets.add(prefix)
    return targets


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}
# The direction between planes holds for every import, also those in functions and for type checking.
EVERY_IMPORT = {module: _imports(module, path, at_import_time=False) for module, path in MODULES.items()}


def _plane(module: str) -> str | None:
    """The plane of `module`; None for the top package, which belongs to none (it imports nothing)."""
    best: tuple[int, str] | None = None
    for plane, prefixes in PLANES:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), plane)
    return None if best is None else best[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_is_found_through_the_symlinked_folders_and_has_a_plane() -> None:
    for module in ("onceflow.workflows.agent_run", "onceflow.ledger.store", "onceflow.activities.tools"):
        assert module in MODULES
    assert "onceflow.examples.billing.tools" in MODULES
    assert [module for module in MODULES if module != "onceflow" and _plane(module) is None] == []
    assert _plane("onceflow.runtime.worker") == "runtime"
    assert _plane("onceflow.runtime.agents") == "providers"
    assert _plane("onceflow.sdk.keys") == "base"


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_imports_run_one_way_between_planes() -> None:
    upward = []
    for module, targets in sorted(EVERY_IMPORT.items()):
        plane = _plane(module)
        for target in sorted(targets):
            into = _plane(target)
            # Importing runtime.agents runs runtime/__init__.py too; a package's empty __init__ on
            # the way carries no dependency (should it import something, the edge counts again).
            passed_through = MODULES[target].name == "__init__.py" and not GRAPH[target]
            if plane is not None and into is not None and RANK[into] > RANK[plane] and not passed_through:
                upward.append(f"{module} ({plane}) imports {target} ({into})")
    assert upward == []


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        # Durations and ${VAR} live in the SDK (sdk/durations.py, sdk/variables.py), not in agents.py.
        ("onceflow.models.config", "onceflow.runtime.agents"),
        ("onceflow.mcp.config", "onceflow.runtime.agents"),
        # The report is what the runner returns; what both need (DrillConfig) is in scenario.py.
        ("onceflow.drill.report", "onceflow.drill.runner"),
    ],
)
def test_modules_that_once_went_round_in_a_circle_do_not(importer: str, imported: str) -> None:
    assert imported not in EVERY_IMPORT[importer]


def test_the_base_plane_imports_nothing_of_onceflow() -> None:
    base = [module for module in MODULES if _plane(module) == "base"]
    assert base and all(GRAPH[module] == set() for module in base)


def test_a_public_name_imported_from_onceflow_counts_as_an_import_of_its_home() -> None:
    assert "onceflow.sdk.tools" in GRAPH["onceflow.examples.billing.tools"]


def test_the_top_package_imports_nothing_at_import_time() -> None:
    # The workflow sandbox re-imports a workflow module's parent packages (onceflow/__init__.py says why).
    assert GRAPH["onceflow"] == set()


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], cycle: list[list[str]]) -> None:
    assert _cycles(graph) == cycle


def test_imports_inside_functions_and_type_checking_do_not_count(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import onceflow.sdk.keys\n"
        "if TYPE_CHECKING:\n    from onceflow.runtime import worker\n"
        "def f():\n    from onceflow.cli import app\n"
        "try:\n    from onceflow.ledger import store\nexcept ImportError:\n    pass\n"
    )
    found = _import_time_statements(ast.parse(source).body)
    named = [node.module if isinstance(node, ast.ImportFrom) else node.names[0].name for node in found]
    assert named == ["typing", "onceflow.sdk.keys", "onceflow.ledger"]
