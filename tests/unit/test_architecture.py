"""The package's folders stand on one another (docs/architecture.md): each imports only folders below it, and no
module imports another in a circle, counting imports made inside functions; for circles, ``TYPE_CHECKING`` ones too
(two modules that need each other's names are one idea in two files, however the import is spelled)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "plugins" / "pgtrain"
TRAINER = REPO / "trainer_image" / "trainer"
# Bottom to top; a folder may import its own folder and the ones before it. Folders on one line are side by side.
LAYERS: list[tuple[str, ...]] = [
    ("pgtrain.core",),
    ("pgtrain.config",),
    ("pgtrain.runs",),
    ("pgtrain.data",),
    ("pgtrain.models",),  # the model builders: the trainer trains what they build, store.inference rebuilds versions
    ("pgtrain.store",),
    ("pgtrain.launch",),
    ("pgtrain.planning",),  # planning a run: admission, capacity, freshness, the shards
    ("trainer",),  # a rank's code: python -m trainer
    ("pgtrain.airflow.dag", "pgtrain.cli"),
    ("pgtrain.airflow.local", "pgtrain.airflow.kubernetes", "pgtrain.airflow.triggers", "pgtrain.airflow.ui"),
    ("pgtrain.airflow.pipeline", "pgtrain.airflow.plugins"),
]


def module_name(path: Path) -> str:
    root = PACKAGE.parent if PACKAGE in path.parents else TRAINER.parent
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for base in (PACKAGE, TRAINER) for p in sorted(base.rglob("*.py"))}


def layer(module: str) -> int:
    best = None
    for index, folders in enumerate(LAYERS):
        for folder in folders:
            if (module == folder or module.startswith(folder + ".")) and (best is None or len(folder) > best[1]):
                best = (index, len(folder))
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: place it (and say where in docs/architecture.md)")
    return best[0]


def imports(path: Path, type_checking: bool = False) -> set[str]:
    """The pgtrain and trainer modules ``path`` imports, anywhere but under ``if TYPE_CHECKING`` (there too with
    ``type_checking``)."""
    tree = ast.parse(path.read_text())
    skipped = set() if type_checking else {
        id(node) for stmt in ast.walk(tree) if isinstance(stmt, ast.If)
        and ast.unparse(stmt.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for body in stmt.body for node in ast.walk(body)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        found |= {resolve(name) for name in names if name.split(".")[0] in ("pgtrain", "trainer")}
    return {name for name in found if name is not None}


def resolve(name: str) -> str | None:
    """The module ``name`` is (a module, or a name defined in one: the longest module prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


GRAPH = {module: imports(path) - {module} for module, path in MODULES.items()}
TYPED_GRAPH = {module: imports(path, type_checking=True) - {module} for module, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in ("pgtrain", "trainer")))
def test_a_module_imports_only_its_own_layer_and_the_ones_below(module):
    # the package's own __init__ files (pgtrain.data, ...) are empty: parents are not imports of substance
    upward = sorted(target for target in GRAPH[module]
                    if target not in ("pgtrain", "trainer") and MODULES[target].name != "__init__.py"
                    and layer(target) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports higher layers: {upward}"


def test_no_import_circles():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(TYPED_GRAPH[module]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(target):] + [target]))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(TYPED_GRAPH):
        if module not in state:
            visit(module)


# The model builders are torch modules: imported by a rank, and lazily by store.inference when a version is used;
# models.cost (a network's work a row) by a rank only.
TORCH_MODULES = ("pgtrain.models.network", "pgtrain.models.ensemble", "pgtrain.models.layers",
                 "pgtrain.models.piecewise", "pgtrain.models.booster", "pgtrain.models.cost")


def test_the_library_below_airflow_imports_no_airflow_and_no_torch_at_module_level():
    """The core stays plain: Airflow only under pgtrain.airflow; torch only where a rank or a scoring needs it."""
    for module, path in MODULES.items():
        if not module.startswith("pgtrain") or module.startswith("pgtrain.airflow"):
            continue
        top = {alias.name.split(".")[0] for node in ast.parse(path.read_text()).body
               if isinstance(node, (ast.Import, ast.ImportFrom))
               for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
        banned = {"airflow", "horovod"} | (set() if module in TORCH_MODULES else {"torch"})
        assert not top & banned, f"{module} imports {top & banned}"


def is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def test_every_import_of_a_pgtrain_name_resolves():
    """Imports inside functions run only when the function does: check that each names what exists."""
    import importlib

    missing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in ("pgtrain", "trainer")):
                continue
            try:
                target = importlib.import_module(node.module)
            except ImportError as error:
                missing.append(f"{module}: {node.module} ({error})")
                continue
            for alias in node.names:
                if not hasattr(target, alias.name) and not is_module(f"{node.module}.{alias.name}"):
                    missing.append(f"{module}: from {node.module} import {alias.name}")
    assert not missing, missing


# Each table's SQL lives in its owner (docs/architecture.md, "Who owns which table"); other modules call its functions.
TABLE_OWNERS = {
    "training_runs": ("pgtrain.runs",),
    "model_versions": ("pgtrain.runs.versions",),
    "model_heads": ("pgtrain.runs.versions",),
    "model_head_history": ("pgtrain.runs.versions",),
}


@pytest.mark.parametrize("table", sorted(TABLE_OWNERS))
def test_a_tables_sql_lives_in_its_owner(table):
    statement = re.compile(rf"\b(?:FROM|JOIN|UPDATE|INTO|TABLE)\s+pgtrain\.{table}\b", re.IGNORECASE)
    outside = sorted(module for module, path in MODULES.items() if statement.search(path.read_text())
                     and not any(module == owner or module.startswith(owner + ".") for owner in TABLE_OWNERS[table]))
    assert not outside, f"SQL on pgtrain.{table} outside its owner {TABLE_OWNERS[table]}: {outside}"
