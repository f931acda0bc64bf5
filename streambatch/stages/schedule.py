"""A batch-size schedule: global batch ``B0`` from the start, ``B1`` once ``t1`` tokens were consumed, and so on.

Megatron's ``--step-batch-size-schedule "0:768 250B:1536"``: thresholds in
consumed tokens.  A consumed item (a window, or a packed row) is ``T`` tokens
(``context_length``), as Megatron counts ``samples x seq_length``, so the
schedule is a function of the item count alone: no token is read, and the
batch of any index is known in O(phases).  Batch size ``B_i`` starts at the
first batch boundary where at least ``t_i`` tokens (``ceil(t_i / T)`` items) were
consumed: each batch's size is that of the last phase whose threshold the items
consumed before it reached.  An epoch's final batch is short, never padded.

Thresholds count from the start of training, as Megatron's do: a schedule
carries ``consumed``, the items consumed before its epoch (`BatchSchedule.after`),
and `streambatch.Run` gives epoch ``e`` of ``N`` items ``consumed = e * N``, so
the schedule goes on across epoch boundaries (an epoch's start is a batch
boundary).  `RunSteps` numbers a run's batches, epoch after epoch, in
O(phases): only the epochs a threshold falls in differ from their neighbours.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._checks import check_non_negative, check_positive, is_integer, short_repr
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
    consumed: int = 0  # items consumed before this schedule's epoch (a run's earlier epochs): thresholds count from 0

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
        return self if self.tokens_per_item == per else BatchSchedule(self.phases, per, self.consumed)

    def after(self, consumed: int) -> BatchSchedule:
        """This schedule for an epoch that starts once *consumed* items were (epoch ``e`` of a run of ``N``-item
        epochs: ``e * N``): its first batch's size is the phase reached by then.

        >>> s = BatchSchedule.parse("0:2 8:4 20:3").bound(2)
        >>> s.after(5).widths(13), s.after(10).widths(6)
        ([4, 4, 3, 2], [3, 3])
        """
        items = check_non_negative(consumed, "consumed", "the items consumed before the epoch")
        return self if items == self.consumed else BatchSchedule(self.phases, self.tokens_per_item, items)

    @property
    def largest(self) -> int:
        """The widest batch of any phase."""
        return max(size for _, size in self.phases)

    def _layout(self, items: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
        if self.tokens_per_item is None:
            raise ConfigError(f"batch_size schedule {self} is not bound to a context length; chunk items with it")
        return _layout(self.phases, self.tokens_per_item, items, self.consumed)

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

    def phases_of(self, batches: range, items: int) -> list[tuple[int, int, int, range]]:
        """``(first batch, first item, size, part)`` per phase that increasing *batches* (step 1) reach in an epoch
        of *items* items: *part* is the phase's share of them; its batch ``j`` is the phase's size of items from
        ``first item + (j - first batch) * size`` (the epoch's final batch short)."""
        starts, firsts, sizes, total = self._layout(items)
        out = []
        for p, (start, first, size) in enumerate(zip(starts, firsts, sizes, strict=True)):
            end = starts[p + 1] if p + 1 < len(starts) else total
            part = range(max(batches.start, start), min(batches.stop, end))
            if len(part):
                out.append((start, first, size, part))
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


def _wanted(phases: tuple[tuple[int, int], ...], per: int) -> list[int]:
    """Each phase's threshold in items: consumed once that many tokens were (``ceil(t / T)``)."""
    return [-(-tokens // per) for tokens, _ in phases]


@functools.lru_cache(maxsize=64)
def _layout(
    phases: tuple[tuple[int, int], ...], per: int, items: int, consumed: int = 0
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """Per phase reached in an epoch of *items* items after *consumed*: its first batch, its first item (in the
    epoch), its size; and the batch count.  The epoch starts in the last phase whose threshold *consumed* reached."""
    wanted = _wanted(phases, per)
    reached = bisect.bisect_right(wanted, consumed) - 1
    batches, firsts, sizes = [0], [0], [phases[reached][1]]
    for threshold, (_, size) in zip(wanted[reached + 1 :], phases[reached + 1 :], strict=True):
        wanted_here = threshold - consumed  # > 0: the items of this epoch consumed once the threshold is
        at, step = firsts[-1], sizes[-1]
        start = at + step * max(0, -(-(wanted_here - at) // step))  # the first batch boundary of the phase before
        if start >= items:
            break
        batches.append(batches[-1] + (start - at) // step)
        firsts.append(start)
        sizes.append(size)
    total = batches[-1] + -(-max(items - firsts[-1], 0) // sizes[-1])
    return tuple(batches), tuple(firsts), tuple(sizes), total


class RunSteps:
    """A run's batches numbered epoch after epoch: epochs of *items* items each, under *batch_size* (an int, or a
    schedule bound to its items) going on across epochs (epoch ``e`` starts after ``base + e * items`` items,
    ``base`` the schedule's own `BatchSchedule.consumed`: 0 unless the run's epoch 0 is a later epoch).

    Epochs differ only where a threshold falls: the epochs between two such are alike, so a handful of marks
    (at most two per phase) number every step in O(phases), whatever the run's length.

    >>> steps = RunSteps(BatchSchedule.parse("0:2 12:4").bound(1), 5)
    >>> [steps.count(e) for e in range(5)], steps.first(3), steps.position(9), steps.items_before(2, 1)
    ([3, 3, 2, 2, 2], 8, (3, 1), 12)
    """

    __slots__ = ("_counts", "_firsts", "_marks", "base", "batch_size", "items", "uniform")

    def __init__(self, batch_size: int | BatchSchedule, items: int) -> None:
        self.batch_size, self.items = batch_size, check_non_negative(items, "items", "the items of each epoch")
        self.base = batch_size.consumed if isinstance(batch_size, BatchSchedule) else 0
        marks = [0]
        if isinstance(batch_size, BatchSchedule) and items:
            batch_size.count(items)  # an unbound schedule's refusal
            wanted = [w - self.base for w in _wanted(batch_size.phases, batch_size.tokens_per_item or 1) if w > self.base]
            marks = sorted({0} | {w // items + d for w in wanted for d in (0, 1)})  # a threshold's epoch, the next
        counts = [self._count_of(m) for m in marks]
        firsts = [0]
        for k in range(1, len(marks)):
            firsts.append(firsts[-1] + (marks[k] - marks[k - 1]) * counts[k - 1])
        self._marks, self._counts, self._firsts = tuple(marks), tuple(counts), tuple(firsts)
        self.uniform = len(set(counts)) == 1  # every epoch has as many batches

    def consumed_before(self, epoch: int) -> int:
        """The items consumed before epoch *epoch* starts, as the schedule counts them (``base + epoch * items``)."""
        return self.base + epoch * self.items

    def epoch_size(self, epoch: int) -> int | BatchSchedule:
        """The batch size of epoch *epoch*: the int, or the schedule after the earlier epochs' items."""
        size = self.batch_size
        return size.after(self.consumed_before(epoch)) if isinstance(size, BatchSchedule) else size

    def _count_of(self, epoch: int) -> int:
        size = self.epoch_size(epoch)
        return size.count(self.items) if isinstance(size, BatchSchedule) else -(-self.items // size)

    def _mark(self, epoch: int) -> int:
        return 0 if self.uniform else bisect.bisect_right(self._marks, epoch) - 1

    def count(self, epoch: int) -> int:
        """Batches of epoch *epoch*."""
        return self._counts[self._mark(epoch)]

    def first(self, epoch: int) -> int:
        """The global step of batch 0 of epoch *epoch*."""
        k = self._mark(epoch)
        return self._firsts[k] + (epoch - self._marks[k]) * self._counts[k]

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, batch)`` of global step *step* (``(0, 0)`` when the epochs are empty)."""
        if not self.items:
            return 0, 0
        k = 0 if self.uniform else bisect.bisect_right(self._firsts, step) - 1
        epoch, batch = divmod(step - self._firsts[k], self._counts[k])
        return self._marks[k] + epoch, batch

    def epoch_ranges(self, steps: range) -> Iterator[tuple[int, range]]:
        """``(epoch, batches)`` for increasing global *steps*: each epoch's part as a range of its batch indexes.

        >>> [(e, list(r)) for e, r in RunSteps(2, 5).epoch_ranges(range(1, 9, 2))]
        [(0, [1]), (1, [0, 2]), (2, [1])]
        """
        rest = steps
        while len(rest):
            epoch = self.position(rest[0])[0]
            first, end = self.first(epoch), self.first(epoch + 1)
            count = len(range(rest.start, min(end, rest.stop), rest.step)) if rest.start < end else 0
            part, rest = rest[:count], rest[count:]
            yield epoch, range(part[0] - first, part[-1] - first + 1, part.step)

    def items_before(self, epoch: int, batch: int) -> int:
        """Items the run consumed before batch *batch* of epoch *epoch* (Megatron's consumed samples)."""
        size = self.epoch_size(epoch)
        within = size.items_before(batch, self.items) if isinstance(size, BatchSchedule) else min(batch * size, self.items)
        return self.consumed_before(epoch) + within


def in_epoch(batch_size: int | BatchSchedule, epoch: int, items: int) -> int | BatchSchedule:
    """*batch_size* in epoch *epoch* of a run of *items*-item epochs: a schedule goes on after ``epoch * items``
    items (`BatchSchedule.after`); an int is every epoch's."""
    return batch_size.after(epoch * items) if isinstance(batch_size, BatchSchedule) else batch_size


def state_batch_size(batch_size: int | BatchSchedule) -> int | str:
    """What a run's state records as its ``batch_size``: the int, or the schedule's text (``"0:2 64:4"``)."""
    return str(batch_size) if isinstance(batch_size, BatchSchedule) else batch_size
