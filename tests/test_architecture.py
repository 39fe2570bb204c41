"""The dependency rules of ARCHITECTURE.md, checked on the source (issue 15).

- No import circle between modules of ``sim/``, ``policies/`` and ``calib/``. Every import counts,
  at module level or inside a function (a lazy import only hides a circle until someone moves it),
  and so does one under ``TYPE_CHECKING``: a circle of types is still two modules that cannot be
  read alone.
- ``policies/`` imports neither SimPy, torch, ``sim`` nor ``calib``: the simulator and calib's real
  engine drive the same policy code.
- ``sim/`` imports no torch, at any depth: the simulator installs and runs without it.

The graph is read from the files with :mod:`ast`, so the check needs none of the imported packages
and fails on a circle before anything runs into it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("sim", "policies", "calib")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imported_names(path: Path, name: str) -> set[str]:
    """Every dotted name this module imports (``from X import Y`` gives X.Y and X)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Edges between project modules: to the exact module imported (a name inside a module is an
    edge to that module, a sub-module to itself)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(path, name):
            if imported in modules and imported != name:
                if f"{imported}." in f"{name}." and modules[imported].name == "__init__.py":
                    continue  # a module's own parent package: Python runs it first anyway
                targets.add(imported)
        # `from pkg import mod` names both pkg and pkg.mod: keep the most specific
        graph[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_no_import_circle_between_modules():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_lazy_and_type_checking_imports_count(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sim.x import A\n"
                   "def f():\n    from sim.y import b\n    import torch.nn\n")
    assert {"sim.x", "sim.x.A", "sim.y", "sim.y.b", "torch.nn"} <= imported_names(src, "m")


def _importers(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name, path in project_modules().items():
        if name.split(".")[0] != package:
            continue
        for imported in imported_names(path, name):
            if imported.split(".")[0] in forbidden:
                bad.append(f"{path.relative_to(REPO)} imports {imported}")
    return sorted(set(bad))


def test_policies_import_no_simulator_no_clock_no_torch():
    assert _importers("policies", ("sim", "calib", "simpy", "torch", "triton")) == []


def test_sim_imports_no_torch():
    assert _importers("sim", ("torch", "triton")) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_is_parsed(package):
    assert any(name.split(".")[0] == package for name in project_modules())
