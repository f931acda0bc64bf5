"""A batch-size schedule: global batch ``B0`` from the start, ``B1`` once ``t1`` tokens were consumed, and so on.

Megatron's ``--step-batch-size-schedule "0:768 250B:1536"``: thresholds in
consumed tokens.  A consumed item (a window, or a packed row) is ``T`` tokens
(``context_length``), as Megatron counts ``samples x seq_length``, so the
schedule is a function of the item count alone: no token is read, and the
batch of any index is known in O(phases).  Batch size ``B_i`` starts at the
first batch boundary where at least ``t_i`` tokens (``ceil(t_i / T)`` items) were
consumed; the epoch's final batch is short, never padded.  Thresholds count
from each epoch's start.

`BatchSchedule.parse` reads ``"0:2 64:4 200:3"`` (``K``, ``M``, ``B``, ``T``
suffixes allowed: ``"0:768 250B:1536"``), ``[(0, 2), (64, 4), (200, 3)]`` or an
int; a one-phase schedule is that int, so the fixed path stays as it was.
`chunk` binds a schedule to its items' ``T`` (`BatchSchedule.bound`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._checks import check_positive, is_integer, short_repr
from ..errors import ConfigError

BatchSizeArg = Any  # what batch_size= takes: an int, a schedule's text, (tokens, size) pairs, or a BatchSchedule
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
_PHASE = re.compile(r"(\d+)([KMBT]?):(\d+)")
_FORM = "pass an int, or a schedule 'tokens:size ...' with thresholds from 0 increasing (e.g. '0:768 250B:1536')"


@dataclass(frozen=True)
class BatchSchedule:
    """Global batch sizes by consumed tokens: ``phases`` are ``(threshold tokens, batch size)``, the first at 0.

    ``tokens_per_item`` is ``T`` once bound to items (`bound`); an unbound
    schedule cannot lay out batches yet.

    >>> s = BatchSchedule.parse("0:2 8:4 20:3").bound(2)
    >>> s.widths(13), s.count(13), s.span(3, 13), str(s)
    ([2, 2, 4, 4, 1], 5, (8, 12), '0:2 8:4 20:3')
    """

    phases: tuple[tuple[int, int], ...]
    tokens_per_item: int | None = None

    @classmethod
    def parse(cls, value: Any) -> int | BatchSchedule:
        """*value* as a batch size: an int (also ``"8"``, and a one-phase schedule ``"0:8"``), or a schedule."""
        if isinstance(value, BatchSchedule):
            return value
        if is_integer(value):
            return check_positive(value, "batch_size", "the number of windows per batch")
        if isinstance(value, str):
            text = value.strip()
            if text.isdigit():
                return check_positive(int(text), "batch_size", "the number of items per batch, or a schedule")
            found = [_PHASE.fullmatch(word) for word in text.replace(",", " ").split()]
            if not found or any(m is None for m in found):
                raise ConfigError(f"batch_size={short_repr(value)} is not a batch size or a schedule; {_FORM}")
            pairs: list[Any] = [(int(m[1]) * _SUFFIX[m[2]], int(m[3])) for m in found if m is not None]
        elif isinstance(value, Sequence) and not isinstance(value, bytes):
            pairs = [tuple(p) if isinstance(p, Sequence) and not isinstance(p, str) else p for p in value]
        else:  # a float, a bool, None...: the fixed path's own refusal
            return check_positive(value, "batch_size", "the number of windows per batch (or a schedule)")
        return cls._checked(value, pairs)

    @classmethod
    def _checked(cls, value: Any, pairs: list[Any]) -> int | BatchSchedule:
        if not pairs or any(not (isinstance(p, tuple) and len(p) == 2 and all(map(is_integer, p))) for p in pairs):
            raise ConfigError(f"batch_size={short_repr(value)} is not a list of (tokens, size) pairs; {_FORM}")
        phases = tuple((int(t), int(b)) for t, b in pairs)
        if phases[0][0] != 0:
            raise ConfigError(f"batch_size={short_repr(value)}: the first threshold is {phases[0][0]}, not 0; {_FORM}")
        for (before, _), (after, _) in itertools.pairwise(phases):
            if after <= before:
                raise ConfigError(f"batch_size={short_repr(value)}: threshold {after} does not follow {before}; {_FORM}")
        for _, size in phases:
            check_positive(size, "batch size", f"each phase's batch size (in {short_repr(value)})")
        return phases[0][1] if len(phases) == 1 else cls(phases)

    def bound(self, tokens_per_item: int) -> BatchSchedule:
        """This schedule over items of *tokens_per_item* tokens (``T``)."""
        per = check_positive(tokens_per_item, "context_length", "the tokens each item counts (T)")
        return self if self.tokens_per_item == per else BatchSchedule(self.phases, per)

    @property
    def largest(self) -> int:
        """The widest batch of any phase."""
        return max(size for _, size in self.phases)

    def _layout(self, items: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
        if self.tokens_per_item is None:
            raise ConfigError(f"batch_size schedule {self} is not bound to a context length; chunk items with it")
        return _layout(self.phases, self.tokens_per_item, items)

    def count(self, items: int) -> int:
        """Batches of an epoch of *items* items."""
        return self._layout(items)[3]

    def span(self, batch: int, items: int) -> tuple[int, int]:
        """``(first, stop)``: the items of batch *batch* of an epoch of *items* items."""
        batches, firsts, sizes, _ = self._layout(items)
        phase = bisect.bisect_right(batches, batch) - 1
        first = firsts[phase] + (batch - batches[phase]) * sizes[phase]
        return first, min(first + sizes[phase], items)

    def runs(self, items: int) -> list[tuple[int, int]]:
        """``(width, batches)`` of each run of equal widths, in order: a phase's full batches, then the final one."""
        batches, _, sizes, total = self._layout(items)
        out: list[tuple[int, int]] = []
        for p, size in enumerate(sizes):
            count = (batches[p + 1] if p + 1 < len(batches) else total) - batches[p]
            if count:
                out.append((size, count))
        if out:
            last = items - self.span(total - 1, items)[0]  # the final batch: short, never padded
            if last != out[-1][0]:
                out[-1:] = [(out[-1][0], out[-1][1] - 1), (last, 1)] if out[-1][1] > 1 else [(last, 1)]
        return out

    def widths(self, items: int) -> list[int]:
        """The width of every batch of an epoch of *items* items (the last may be short)."""
        return [width for width, count in self.runs(items) for _ in range(count)]

    def size_of(self, batch: int, items: int) -> int:
        """The phase size (the capacity) of batch *batch*."""
        batches, _, sizes, _ = self._layout(items)
        return sizes[bisect.bisect_right(batches, batch) - 1]

    def items_before(self, batch: int, items: int) -> int:
        """Items consumed before batch *batch* (*batch* may be the batch count: every item)."""
        return items if batch >= self.count(items) else self.span(batch, items)[0]

    def __str__(self) -> str:
        return " ".join(f"{t}:{b}" for t, b in self.phases)


@functools.lru_cache(maxsize=64)
def _layout(
    phases: tuple[tuple[int, int], ...], per: int, items: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """Per phase reached in an epoch of *items* items: its first batch, its first item, its size; and the batch count."""
    batches, firsts, sizes = [0], [0], [phases[0][1]]
    for tokens, size in phases[1:]:
        wanted = -(-tokens // per)  # the items consumed once that many tokens were
        at, step = firsts[-1], sizes[-1]
        start = at + step * max(0, -(-(wanted - at) // step))  # the first batch boundary of the phase before
        if start >= items:
            break
        batches.append(batches[-1] + (start - at) // step)
        firsts.append(start)
        sizes.append(size)
    total = batches[-1] + -(-max(items - firsts[-1], 0) // sizes[-1])
    return tuple(batches), tuple(firsts), tuple(sizes), total


def state_batch_size(batch_size: int | BatchSchedule) -> int | str:
    """What a run's state records as its ``batch_size``: the int, or the schedule's text (``"0:2 64:4"``)."""
    return str(batch_size) if isinstance(batch_size, BatchSchedule) else batch_size


def items_before(batch_size: int | BatchSchedule, batch: int, items: int) -> int | None:
    """Items consumed before batch *batch* of an epoch of *items* under a schedule; None for a fixed size."""
    return batch_size.items_before(batch, items) if isinstance(batch_size, BatchSchedule) else None
