"""The package's import graph, read from the source: no module imports a higher layer, and no two modules (or
packages) import each other, directly or through others.

Layers, highest first (a module imports its own layer or lower ones):
  cli/, serve/, __main__  ->  bench/  ->  quality/  ->  the facade (sdaccel/__init__)  ->  pipeline/,
  diffusers_adapter/  ->  engines/  ->  onnx/, kernels/  ->  models/  ->  the small shared modules.
Imports inside functions count: they are how a module defers a cost, not how it escapes the layering.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sdaccel"
SHARED = ("errors", "atomic", "device", "version", "cache", "outputs")
LAYERS = {  # top-level part of the module name -> rank
    **{name: 0 for name in SHARED},
    "models": 1, "kernels": 2, "onnx": 2, "engines": 3, "pipeline": 4, "diffusers_adapter": 4, "": 5,
    "quality": 6, "bench": 7, "cli": 8, "serve": 8, "__main__": 8,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """The sdaccel modules `name` imports (a name imported from a package counts as the package, unless it is a
    submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                       for alias in node.names]
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _rank(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] not in LAYERS]


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if _rank(t) > _rank(m))
    assert upward == []


def test_no_import_circle_between_modules():
    assert _cycles(GRAPH) == []


def test_no_import_circle_between_packages():
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2])  # sdaccel.cli, sdaccel.serve, sdaccel.errors, ...; the root package as itself

    collapsed: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        others = {package(t) for t in targets} - {package(module)}
        collapsed.setdefault(package(module), set()).update(others)
    assert _cycles(collapsed) == []


def test_the_package_root_holds_the_facade_and_small_shared_modules():
    root_files = sorted(p.stem for p in ROOT.glob("*.py"))
    assert root_files == sorted(["__init__", "__main__", *SHARED])


@pytest.mark.parametrize("package", sorted(m for m, path in MODULES.items() if path.name == "__init__.py"))
def test_packages_do_not_shadow_their_modules(package):
    """A package's attribute named like one of its modules is that module (never a function re-exported over it:
    `sdaccel.kernels.group_norm` is the module, `sdaccel.pipeline.load` too)."""
    import importlib
    import pkgutil

    imported = importlib.import_module(package)
    for info in pkgutil.iter_modules(imported.__path__):
        if info.name == "__main__":
            continue  # running it is what importing it does
        submodule = importlib.import_module(f"{package}.{info.name}")
        assert getattr(imported, info.name) is submodule, f"{package}.{info.name} is not the module"
