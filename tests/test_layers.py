"""The package's folders are its layers: every import, function-local ones included, points down.

A module may import modules of its own layer or of a lower one, never of a higher one, and the
module import graph has no circle. Walked with ``ast`` over the source, so a lazy import inside a
function counts like one at the top of the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "pipelines"

# Lowest first. A top-level module or sub-package of ``pipelines`` not listed here fails the test,
# so a new folder has to take its place in the order on purpose.
LAYERS = (
    ("core",),
    ("config",),
    ("data",),
    ("synth", "models", "hlo"),
    ("training",),
    ("outputs",),
    ("flows",),
    ("reports",),
    ("commands",),
    ("cli", "__main__"),
)
LAYER_OF = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE_DIR.rglob("*.py")}


def imported_modules(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The ``pipelines`` modules that module ``name`` imports, wherever the import statement sits
    (``from pkg import module`` resolves to the module)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules] or [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("pipelines") and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(path.read_text(), name, path.name == "__init__.py", set(modules))
            for name, path in modules.items()}


def layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return -1  # the package's own __init__: below everything
    return LAYER_OF.get(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                  if layer(target) > layer(source))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
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


def test_every_module_sits_in_a_known_layer():
    unplaced = sorted(name for name in package_modules() if layer(name) is None)
    assert unplaced == [], f"add these to LAYERS in {__file__}: {unplaced}"


def test_imports_point_only_down():
    assert upward_imports(import_graph()) == []


def test_the_import_graph_has_no_circle():
    assert circles(import_graph()) == []


def test_the_checks_catch_an_upward_import_and_a_circle():
    graph = {"pipelines.core.a": {"pipelines.flows.b"}, "pipelines.flows.b": {"pipelines.core.a"}}
    assert upward_imports(graph) == ["pipelines.core.a -> pipelines.flows.b"]
    assert circles(graph) == [["pipelines.core.a", "pipelines.flows.b"]]


def test_a_function_local_import_counts():
    source = "import numpy\n\ndef late():\n    from pipelines.flows import run\n    return run\n"
    modules = {"pipelines.core.late", "pipelines.flows", "pipelines.flows.run"}
    assert imported_modules(source, "pipelines.core.late", False, modules) == {"pipelines.flows.run"}


def test_a_relative_import_resolves_against_its_package():
    modules = {"pipelines.models.gnn", "pipelines.models.gnn.model", "pipelines.models.gnn.batch"}
    found = imported_modules("from .batch import collate\n", "pipelines.models.gnn.model", False, modules)
    assert found == {"pipelines.models.gnn.batch"}


@pytest.mark.parametrize("name", sorted(LAYER_OF))
def test_each_layer_exists(name):
    assert (PACKAGE_DIR / name).is_dir() or (PACKAGE_DIR / f"{name}.py").is_file()
