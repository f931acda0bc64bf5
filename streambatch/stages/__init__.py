"""The pipeline stages above the item kinds: ``chunk``, ``share`` (and ``split_rows``), ``materialize``.

Until 0.4 this folder also held the batch model and the order stages; they moved
below the kinds in 0.5 (``streambatch.batch``, ``streambatch.order``).  Their old
module paths (``streambatch.stages.batch``, ``.reduce``, ``.shuffle``, ...) keep
working for one release, with a `DeprecationWarning` naming the new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED = {  # old module (under streambatch.stages) -> its home since 0.5
    "batch": "streambatch.batch.minibatch",
    "span": "streambatch.batch.span",
    "token_sums": "streambatch.batch.sums",
    "reduce": "streambatch.batch.reduce",
    "shuffle": "streambatch.order.shuffle",
    "splitmix": "streambatch.order.splitmix",
    "plan": "streambatch.order.plan",
    "plan_check": "streambatch.order.plan_check",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``streambatch.stages.<old>`` as the module that moved, after a `DeprecationWarning`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        head, _, name = fullname.rpartition(".")
        if head != __name__ or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new} in streambatch 0.5; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the moved one, already executed."""


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())
