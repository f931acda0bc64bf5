"""The one configuration `Epoch` and `Run` share: what to read and how, checked once, passed whole.

`Epoch(source, **keywords)` and `Run(source, **keywords)` keep their keyword
signatures; each builds one `EpochConfig` and hands it on whole (`Run` to each of
its epochs), so no keyword is forwarded one by one.  `items_of` turns a source into
the items a façade reads, with the one rule for items passed in
(`streambatch.items.protocol.check_agrees`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .errors import ConfigError
from .items.mix.source import as_mixture
from .items.pack.rows import pack
from .items.protocol import EpochItems, Items, check_agrees
from .items.windows.windows import windows
from .model.documents import Partition

if TYPE_CHECKING:
    from .items.mix.mixture import Mixture
    from .items.pack.rows import Rows
    from .items.protocol import OrderableItems
    from .items.windows.windows import Windows

__all__ = ["EpochConfig", "items_of"]


@dataclass(frozen=True)
class EpochConfig:
    """What an epoch reads besides its source: the keywords of `streambatch.Epoch` (and of `streambatch.Run`)."""

    batch_size: Any  # an int, or a batch-size schedule (streambatch.stages.schedule)
    seed: Any = None  # an int, None (document order), or `streambatch.epoch.UNSET` (not passed)
    context_length: int | None = None
    stride: int | None = None
    partition: Partition | str | None = None
    keep_partition: bool = False
    plan_dir: str | os.PathLike[str] | None = None
    verify_plan: bool = False
    pack: bool = False
    skip_untrained: bool = False  # drop the items with no counted target (`streambatch.items.untrained`)


def items_of(source: object, config: EpochConfig, seed: int | None) -> EpochItems:
    """The items a façade reads: *source* itself when it is items, a mixture file's `Mixture`, else
    ``sb.windows(source, ...)`` (``sb.pack`` with ``pack=True``).

    Given items (windows, packed rows or a mixture), the window arguments may be left out; given, they must agree.
    """
    if isinstance(source, Items) and not isinstance(source, str | bytes):
        given = cast(EpochItems, source)  # every kind is (`_every_kind_is_epoch_items`, checked by mypy)
        if config.skip_untrained and given.untrained is None:
            raise ConfigError(f"skip_untrained=True but {given.words.keeps_all}")  # each kind words its own
        check_agrees(given, context_length=config.context_length, stride=config.stride, partition=config.partition,
                     pack=config.pack)  # fmt: skip
        return given
    mixture = as_mixture(
        source, context_length=config.context_length, stride=config.stride, partition=config.partition,
        keep_partition=config.keep_partition, seed=seed, plan_dir=config.plan_dir, pack=config.pack,
        skip_untrained=config.skip_untrained,
    )  # fmt: skip
    if mixture is not None:
        return mixture
    if config.context_length is None:
        raise ConfigError("context_length is required; pass the number of input tokens per window (T)")
    chosen = Partition.TRAIN if config.partition is None else config.partition
    if config.pack:
        if config.stride is not None:
            raise ConfigError(f"stride={config.stride!r} with pack=True; packing cuts pieces at stride T: leave stride out")
        return pack(source, context_length=config.context_length, partition=chosen, keep_partition=config.keep_partition,
                    plan_dir=config.plan_dir, skip_untrained=config.skip_untrained)  # fmt: skip
    stride = 1 if config.stride is None else config.stride
    return windows(source, context_length=config.context_length, stride=stride, partition=chosen,
                   keep_partition=config.keep_partition, skip_untrained=config.skip_untrained)  # fmt: skip


if TYPE_CHECKING:  # mypy checks that every item kind has every member the façades read

    def _every_kind_is_epoch_items(windows: Windows, rows: Rows, mixture: Mixture) -> tuple[EpochItems, ...]:
        return windows, rows, mixture

    def _windows_and_rows_are_ordered_by_a_plan(windows: Windows, rows: Rows) -> tuple[OrderableItems, ...]:
        return windows, rows
