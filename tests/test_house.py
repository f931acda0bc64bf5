"""Tests for the package's shape: layers, module and folder sizes, item and batch dispatches, the public surface, one version."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import streambatch as sb

PACKAGE = Path(sb.__file__).parent
LAYERS = {  # a module may import its own layer and the ones below it, never one above
    "errors": 0,
    "_checks": 0,
    "_progress": 0,
    "_paths": 0,
    "_signals": 0,
    "_kernels": 0,
    "model": 1,
    "io": 2,
    "read": 2,
    "batch": 3,
    "order": 4,
    "items": 5,
    "stages": 6,
    "config": 7,
    "state": 7,
    "epoch": 7,
    "run": 7,
    "prepare": 7,
    "parts": 7,
    "torch": 8,
    "tools": 8,
    "hf": 9,
    "lightning": 9,
    "ray": 8,
    "cli": 10,
    "__main__": 11,
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


def test_every_module_is_under_500_lines() -> None:
    """Small modules, one job each (the house rule: under 500 lines)."""
    assert [] == [f"{p}: {n}" for p in PACKAGE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) >= 500]


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


def test_every_module_has_a_layer() -> None:
    """No module sits outside the layers (so the one-way rule sees every import)."""
    assert [] == sorted(name for name in _modules() if name != "streambatch" and _layer(name) is None)


def test_no_folder_imports_a_folder_that_imports_it() -> None:
    """Between the package's top-level folders and modules the import graph has no cycle (folders import one way)."""
    graph: dict[str, set[str]] = {}
    for name, path in _modules().items():
        parts = name.split(".")
        if len(parts) < 2:
            continue
        for target in _imports(name, path):
            theirs = target.split(".")
            if len(theirs) > 1 and theirs[1] != parts[1]:
                graph.setdefault(parts[1], set()).add(theirs[1])
    both = sorted(f"{a} <-> {b}" for a, edges in graph.items() for b in edges if a < b and a in graph.get(b, set()))
    assert [] == both
    state: dict[str, int] = {}

    def cycle(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (found := cycle(nxt, [*trail, node])):
                return found
        state[node] = 2
        return None

    assert [] == [c for n in sorted(graph) if n not in state and (c := cycle(n, []))]


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


REMOVED = ("Batches", "WindowIndex", "shard", "iter_records", "read_jsonl", "StoreError", "audit_epoch", "window_counts")


@pytest.mark.parametrize("name", REMOVED)
def test_the_names_deprecated_in_0_3_are_gone(name: str) -> None:
    """The aliases that left ``__all__`` in 0.3 warned for one release; in 0.4 ``sb.NAME`` is an AttributeError."""
    with pytest.raises(AttributeError):
        getattr(sb, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    """The package invents no names."""
    with pytest.raises(AttributeError, match="no attribute 'no_such_stage'"):
        _ = sb.no_such_stage


# -- one class per idea: item and batch kinds are not dispatched on --------------------
KINDS = {  # the item, space and batch classes (and their 0.3 aliases) a dispatch may name
    "Windows", "Rows", "PackedRows", "Mixture", "PlannedItems", "Items", "Chunks", "Batches", "MixSpace",
    "WindowSpace", "RowSpace", "MiniBatch", "PackedBatch", "MixtureBatch", "PackedMixtureBatch",
}  # fmt: skip
DISPATCH_LIMIT = 8


def _names(node: ast.AST, aliases: dict[str, str]) -> set[str]:
    if isinstance(node, ast.Name):
        return {aliases.get(node.id, node.id)}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple | ast.List):
        return set().union(*(_names(e, aliases) for e in node.elts))
    if isinstance(node, ast.BinOp):
        return _names(node.left, aliases) | _names(node.right, aliases)
    return set()


def _is_type_of(node: ast.AST) -> bool:
    """``type(x)`` or ``x.__class__``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "__class__"
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"


def _dispatch(node: ast.AST, aliases: dict[str, str], kinds: set[str] = KINDS) -> bool:
    """Whether *node* asks an object's kind: isinstance/issubclass (bare or ``builtins.``), a ``type(x)`` or
    ``x.__class__`` compared with a kind (``is``, ``==``, ``in``), or a ``case Kind():`` pattern."""
    if isinstance(node, ast.Call) and len(node.args) == 2:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in ("isinstance", "issubclass") and bool(_names(node.args[1], aliases) & kinds)
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(_is_type_of(side) for side in sides) and any(_names(side, aliases) & kinds for side in sides)
    if isinstance(node, ast.MatchClass):
        return bool(_names(node.cls, aliases) & kinds)
    return False


def kind_dispatches(root: Path, skip: set[str] = frozenset(), kinds: set[str] = KINDS) -> list[str]:  # type: ignore[assignment]
    """``path:line`` of each place that asks whether an object is of an item, space or batch class (`_dispatch`;
    a name imported under another name counts as the class it names); *kinds*: the classes to look for."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in skip:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {
            alias.asname: alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.asname
        }
        found += [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree) if _dispatch(node, aliases, kinds)]
    return sorted(set(found), key=lambda at: (at.rsplit(":", 1)[0], int(at.rsplit(":", 1)[1])))


def test_kind_dispatches_counts_what_it_should(tmp_path: Path) -> None:
    """The counter sees a bare name, an attribute, a tuple, a union, ``builtins.isinstance``, an aliased import,
    ``type(x) is``, ``x.__class__ ==``, ``type(x) in`` and a ``case`` pattern; it skips other classes."""
    (tmp_path / "m.py").write_text(
        "from .w import Windows as W\n"
        "isinstance(a, Windows)\nisinstance(a, x.Rows)\nisinstance(a, (int, Mixture))\nissubclass(t, MiniBatch | int)\n"
        "isinstance(a, int)\nisinstance(a, Corpus)\nbuiltins.isinstance(a, Rows)\nisinstance(a, W)\n"
        "type(a) is Windows\na.__class__ == Rows\ntype(a) in (WindowSpace, RowSpace)\ntype(a) is int\n"
        "match a:\n    case Mixture():\n        pass\n    case int():\n        pass\n"
    )
    lines = [2, 3, 4, 5, 8, 9, 10, 11, 12, 15]
    assert [f"m.py:{n}" for n in lines] == kind_dispatches(tmp_path)


def test_at_most_eight_item_or_batch_dispatches() -> None:
    """Each item kind gathers itself and every batch is a `MiniBatch`: stages, façades and tools ask no kind."""
    found = kind_dispatches(PACKAGE)
    assert len(found) <= DISPATCH_LIMIT, found


# -- one store protocol: the kinds read `TokenSource.flat()`, never a store's class or a probed member --------
STORE_KINDS = {"DocumentStore", "Corpus"}
STORE_DISPATCH_LIMIT = 2
# the two left are doors, not dispatches: model/source.py's `is_source` (is a user's object a source already, or
# documents to read: what as_source, write_store and open_corpus take) and model/corpus.py's refusal of a shard
# that is not a store
STORE_MEMBERS = {  # what TokenSource declares (and the arrays behind it): read, never probed with getattr/hasattr
    "has_loss_mask", "loss_bits", "target_mask", "mask_at", "flat", "shards", "tokens", "bases",
    "document_bases", "starts", "paths",
}  # fmt: skip
STORE_PROBE_LIMIT = 0


def store_probes(root: Path) -> list[str]:
    """``path:line`` of each ``getattr(x, "member", ...)`` or ``hasattr(x, "member")`` of a store member."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in STORE_MEMBERS
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_store_counters_count_what_they_should(tmp_path: Path) -> None:
    """The store counters see isinstance of either store class (aliased too) and getattr/hasattr of a store
    member; they skip other classes and other attributes."""
    (tmp_path / "m.py").write_text(
        "from .c import Corpus as C\n"
        "isinstance(s, DocumentStore)\nisinstance(s, (int, Corpus))\nisinstance(s, C)\nisinstance(s, Windows)\n"
        "getattr(s, 'has_loss_mask', False)\nhasattr(s, 'shards')\ngetattr(s, 'name', None)\ns.has_loss_mask\n"
    )
    assert kind_dispatches(tmp_path, kinds=STORE_KINDS) == ["m.py:2", "m.py:3", "m.py:4"]
    assert store_probes(tmp_path) == ["m.py:6", "m.py:7"]


def test_store_kinds_are_not_dispatched_on() -> None:
    """The kinds, the mixture and the remote reader read ``store.flat()``: no store class is asked for
    (was 23 before the protocol) beyond the two doors named above."""
    found = kind_dispatches(PACKAGE, kinds=STORE_KINDS)
    assert len(found) <= STORE_DISPATCH_LIMIT, found


def test_store_members_are_not_probed() -> None:
    """Every source declares its mask members and `flat` (`streambatch.model.source.TokenSource`): none is
    probed with getattr or hasattr (was 14 probes of has_loss_mask alone)."""
    found = store_probes(PACKAGE)
    assert len(found) <= STORE_PROBE_LIMIT, found


def test_no_folder_holds_more_than_15_modules() -> None:
    """A package folder holds at most 15 modules (its ``__init__`` included): subpackages by idea beyond that."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    crowded = {str(f.relative_to(PACKAGE.parent)): n for f in folders if (n := len(list(f.glob("*.py")))) > 15}
    assert {} == crowded


def test_every_exception_class_lives_in_errors() -> None:
    """One family in one module: no module but ``errors.py`` defines an exception class."""
    outside = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                n.endswith(("Error", "Exception")) for b in node.bases for n in _names(b, {})
            ):
                outside.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert [] == outside


def test_one_version_everywhere() -> None:
    """``pyproject.toml``, ``streambatch.__version__`` and ``streambatch --version`` agree."""
    toml = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"', toml, flags=re.M)
    assert found is not None
    cli = subprocess.run([sys.executable, "-m", "streambatch", "--version"], capture_output=True, text=True, check=True)
    assert found.group(1) == sb.__version__ == cli.stdout.split()[1]


def test_the_kernels_share_one_buffer_header() -> None:
    """Every C file checks its buffers with ``_buffers.h``, which every extension depends on and the package ships,
    and ``setup.py`` compiles every C file (``_row_gather`` from four)."""
    kernels = sorted(PACKAGE.glob("_*.c"))
    assert kernels
    assert [] == [k.name for k in kernels if '#include "_buffers.h"' not in k.read_text(encoding="utf-8")]
    setup = (PACKAGE.parent / "setup.py").read_text(encoding="utf-8")
    assert setup.count("Extension(") == setup.count("depends=HEADERS") + setup.count("depends=[*HEADERS") == 4
    assert [] == [k.name for k in kernels if f'"streambatch/{k.name}"' not in setup and f'"{k.name}"' not in setup]
    assert '"streambatch/_buffers.h"' in setup
    assert '"*.h"' in (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")


TEST_FOLDERS = {"model", "io", "read", "batch", "order", "items", "stages", "facades", "tools", "cli", "torch", "hf", "on_ray"}
HOUSE_TESTS = {  # whole-package rules that belong to no one folder: the house, docs, errors, messages, hostile input
    "test_house", "test_docs", "test_newcomer", "test_errors", "test_messages", "test_signals", "test_collect",
    "test_old_paths", "test_kernels", "test_small_breaks", "test_hostile_arrow_fuzz", "test_hostile_catalogue",
    "test_hostile_fuzz", "test_hostile_hangs", "test_hostile_json", "test_hostile_limits",
}  # fmt: skip


def test_the_tests_mirror_the_package_folders() -> None:
    """A test file lives in the folder of the package layer it tests (``tests/items/`` for ``streambatch/items/``,
    ``facades`` for Epoch and Run, ``torch``/``hf``/``on_ray`` for the adapters); only whole-package rules sit at
    the root."""
    tests = Path(__file__).parent
    misplaced = sorted(
        str(path.relative_to(tests))
        for path in tests.rglob("test_*.py")
        if (path.parent == tests and path.stem not in HOUSE_TESTS)
        or (path.parent != tests and path.relative_to(tests).parts[0] not in TEST_FOLDERS)
    )
    assert [] == misplaced
    assert all((tests / name / "__init__.py").exists() for name in TEST_FOLDERS)
