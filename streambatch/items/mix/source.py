"""Where a mixture enters the façades: a `Mixture` itself, or an opened ``mixture.json`` made into one.

`as_mixture` is the one place `streambatch.Epoch` (and through it `Run`, the
datasets and every command) turns a source into a mixture: a `Mixture` passes
through (its window arguments, if given, must agree; ``pack=True`` needs a
mixture of packed rows); a `MixtureSource` (what `streambatch.open_source`
returns for a mixture file) becomes
``mix([windows(store_s, ...) for each source], weights, seed=seed, length=...)``,
or with ``pack=True`` ``mix([pack(store_s, context_length=T, ...) ...], ...)``
(each packing a packing file in *plan_dir* when given).  Anything else is not a
mixture (None).
"""

from __future__ import annotations

import os
from typing import Any

from ...errors import ConfigError, StreamBatchError
from ...io.files import short_path
from ...io.mixture_file import MixtureSource
from ...model.documents import Partition
from ..pack.rows import pack as pack_rows
from ..windows.windows import windows
from .mixture import Mixture, mix
from .parts import Part


def as_mixture(
    source: Any,
    *,
    context_length: int | None,
    stride: int | None,
    partition: Partition | str | None,
    keep_partition: bool,
    seed: int | None,
    plan_dir: str | os.PathLike[str] | None,
    pack: bool = False,
    skip_untrained: bool = False,
) -> Mixture | None:
    """The `Mixture` a mixture file *source* names (of packed rows with *pack*), else None.

    With *skip_untrained* each source's parts drop their items (packed: pieces) with no counted target first.

    A mixture passed itself is items: `streambatch.config.items_of` checks it.
    """
    if not isinstance(source, MixtureSource):
        return None
    if context_length is None:
        raise ConfigError(
            f"{short_path(source.path)}: a mixture needs context_length (-T); pass the number of input tokens per window"
        )
    if seed is None:
        raise ConfigError(
            f"{short_path(source.path)}: a mixture needs a seed (--seed): each source's order is its seeded shuffle"
        )
    chosen = Partition.TRAIN if partition is None else partition
    each: dict[str, Any] = {"partition": chosen, "keep_partition": keep_partition, "skip_untrained": skip_untrained}
    if pack:
        if stride is not None:
            raise ConfigError(f"stride={stride!r} with pack=True; packing cuts pieces at stride T: leave stride out")
        parts: list[Part] = [pack_rows(s, context_length=context_length, plan_dir=plan_dir, **each) for s in source.stores]
    else:
        step = 1 if stride is None else stride
        parts = [windows(s, context_length=context_length, stride=step, **each) for s in source.stores]
    spec = source.spec
    try:
        return mix(
            parts, spec.weights, seed=seed, length=spec.length, names=spec.names, plan_dir=plan_dir, weight_by=spec.weight_by
        )
    except StreamBatchError as err:  # what the file asks for cannot be mixed: name the file
        raise type(err)(f"{short_path(source.path)}: {err}") from None
