"""The module paths that moved in 0.5 (`streambatch.stages.MOVED`) still import, warn, and give the same objects."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import pytest

from streambatch import stages

OLD_TO_NEW = {  # written out here, apart from the package's table
    "streambatch.stages.batch": "streambatch.batch.minibatch",
    "streambatch.stages.reduce": "streambatch.batch.reduce",
    "streambatch.stages.span": "streambatch.batch.span",
    "streambatch.stages.token_sums": "streambatch.batch.sums",
    "streambatch.stages.shuffle": "streambatch.order.shuffle",
    "streambatch.stages.splitmix": "streambatch.order.splitmix",
    "streambatch.stages.plan": "streambatch.order.plan",
    "streambatch.stages.plan_check": "streambatch.order.plan_check",
}


def _public(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    assert names, module.__name__
    return list(names)


def test_the_table_holds_every_moved_module() -> None:
    assert {f"streambatch.stages.{old}": new for old, new in stages.MOVED.items()} == OLD_TO_NEW


@pytest.mark.parametrize(("old", "new"), sorted(OLD_TO_NEW.items()))
def test_an_old_path_imports_the_new_module_with_a_warning(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    """``import streambatch.stages.X`` warns, naming the new module, and is that module: every public object the same."""
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh, so the warning is raised here
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new} in streambatch 0\.5; import it from there"):
        found = importlib.import_module(old)
    module = importlib.import_module(new)
    assert found is module
    for name in _public(module):
        assert getattr(found, name) is getattr(module, name), name


@pytest.mark.parametrize(("old", "new"), sorted(OLD_TO_NEW.items()))
def test_from_import_of_an_old_name_gives_the_same_objects(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    """``from streambatch.stages.X import name`` gives the object of the new module, after the warning."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    module = importlib.import_module(new)
    name = _public(module)[0]
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from {old} import {name}", namespace)  # the statement form is what is tested
    assert namespace[name] is getattr(module, name)


def test_an_unknown_old_name_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("streambatch.stages.no_such_stage")
