"""Tests for the package's shape: layers, module sizes, the public surface, the deprecated names."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import streambatch as sb
from streambatch._deprecated import MOVED

PACKAGE = Path(sb.__file__).parent
LAYERS = {  # a module may import its own layer and the ones below it, never one above
    "errors": 0,
    "_checks": 0,
    "_progress": 0,
    "_paths": 0,
    "model": 1,
    "io": 2,
    "read": 2,
    "stages": 3,
    "items": 3,
    "state": 4,
    "epoch": 4,
    "run": 4,
    "prepare": 4,
    "torch": 5,
    "tools": 5,
    "cli": 6,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            targets.add(".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])))
    return targets


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_no_module_is_over_500_lines() -> None:
    """Small modules, one job each."""
    assert [] == [f"{p}: {n}" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500]


def test_imports_run_one_way() -> None:
    """No module imports a layer above its own (model < io < stages < façades < adapters and tools)."""
    upward = []
    for name, path in _modules().items():
        mine = _layer(name)
        for target in _imports(name, path):
            theirs = _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target}")
    assert [] == upward


def test_no_import_circle() -> None:
    """The import graph between the package's modules has no cycle."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in _imports(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, "streambatch"):
                edges.add(target)
        graph[name] = edges
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (found := visit(nxt, [*trail, node])):
                return found
        state[node] = 2
        return None

    cycles = [c for n in graph if n not in state and (c := visit(n, []))]
    assert [] == cycles


def test_public_surface_is_small() -> None:
    """``__all__`` keeps at most 40 names, each of them importable."""
    assert len(sb.__all__) <= 40
    assert all(hasattr(sb, name) for name in sb.__all__)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_all_still_works_with_a_warning(name: str) -> None:
    """``sb.NAME`` for a moved helper warns once and returns the object of its module."""
    with pytest.warns(DeprecationWarning, match=f"import it from {MOVED[name]}"):
        found = getattr(sb, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert found is getattr(importlib.import_module(MOVED[name]), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    """The deprecation hook does not invent names."""
    with pytest.raises(AttributeError, match="no attribute 'no_such_stage'"):
        _ = sb.no_such_stage
