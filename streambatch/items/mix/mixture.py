"""Stage: mix, several sources' windows (or packed rows) blended at exact weights into one sequence of items.

``sb.mix(parts, weights, seed=k)`` takes one `Windows` per source (each from its
own store or corpus, all with the same context length and stride, in document
order; or each built with ``skip_untrained=True``: its kept windows, the sizes
mixed being the kept counts, `Mixture.untrained` each source's report) and
gives a `Mixture`: a sized, sliceable `streambatch.items.protocol.Items`
whose item ``i`` is ``(source, window)``.  `chunk`, `share`, `split_rows` and
`materialize` take it unchanged; its batches are `streambatch.MiniBatch` es carrying
``sources``, one per row.  Parts may instead all be packed `Rows`
(``sb.pack(source, context_length=T)`` of each source): the items are then
``(source, row)`` and the batches packed `streambatch.MiniBatch` es
carrying ``sources`` (`streambatch.items.mix.packed_gather`).

The order is `streambatch.items.mix.plan`'s: Tijdeman's chairman assignment over the
sources (after every prefix of ``n`` items source ``s`` holds within
``1 - 1/(2k-2)`` of ``w_s n``), and within source ``s`` its windows in the
chapter's exact SplitMix64 order, source epoch after source epoch: source epoch
``e`` of source ``s`` is ``sb.shuffle(parts[s], source_epoch_seed(k, s, e))`` (for rows too)
with ``source_epoch_seed(k, s, e) = derive_seed(k, 256 e + s + 1)``.  A source
given more items than it has repeats whole epochs (every window once before any
twice); a smaller share takes a prefix of its first epoch.  The default length
passes the largest source exactly once at its weight.

Random access is O(1): the plan (`MixPlan`: one uint8 per item plus a checkpoint
table, 1.375 bytes per item for three sources) gives any position's source and
index within that source; the source's epoch order (a plan of its own, the
same as a single-source epoch's) gives the window.  With ``plan_dir`` both are
plan files, computed once and memory-mapped by every process
(`streambatch.items.mix.plan_file`).

>>> import streambatch as sb
>>> web = sb.windows([sb.Document("w", "train", range(12))], context_length=2)
>>> code = sb.windows([sb.Document("c", "train", range(100, 105))], context_length=2)
>>> mixture = mix([web, code], [0.75, 0.25], seed=7)
>>> len(mixture), mixture.counts().tolist(), mixture.sources().tolist()[:8]
(13, [10, 3], [0, 0, 1, 0, 0, 0, 1, 0])
>>> [b.sources.tolist() for b in sb.materialize(sb.chunk(mixture, 5))]
[[0, 0, 1, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0]]
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ..._checks import check_seed, is_integer
from ...batch.minibatch import MiniBatch, SourceArray, present
from ...errors import ConfigError, OutOfRangeError
from ...io.keyed_file import check_plan_dir
from ...model.validate import check_one_tokenizer
from ...order.protocol import ItemWords
from ..pack._pack_gather import check_emittable
from ..pack.rows import row_spans
from ..road import BatchReader, fetched, gather_one
from ..windows.gather import window_batch
from .gather import mixture_masks
from .parts import Part, check_names, check_parts
from .plan import MixPlan, plan_mix
from .space import MixItem, MixSpace, counted_targets
from .targets import item_weights

IntArray = npt.NDArray[np.int64]
FORMAT = "streambatch.mixture"
_BLOCK_ROWS = 1 << 16  # rows of consecutive batches located at once when iterating


class Mixture:
    """A blend of several sources' windows at exact weights: a sized, sliceable sequence of `MixItem`.

    Made by `mix`.  Slicing gives a view; ``view(lo, hi, batch_index=)`` is what
    `chunk` takes; ``gather`` gathers a view into a `MiniBatch` with ``sources``.
    """

    __slots__ = ("_batch_index", "_global_count", "_hi", "_lo", "_space")
    # its order is its plan and its sources' epochs, never one shuffle; what a façade's messages call it:
    words = ItemWords(
        item="item", items="items", kind="a mixture (sb.mix)", call="sb.mix(parts, weights, seed=...)", empty="items",
        passed=("the mixture passed", "has", "is"),
        seed_taken="the mixture passed has seed {seed}; leave it out or use mixture.reseeded",
        not_packed="the mixture passed blends windows; mix sb.pack(...) parts, or drop pack",
        keeps_all=(
            "the mixture passed mixes every item of its sources; mix parts built with skip_untrained=True, or pass "
            "the mixture file itself"
        ),
        orders_itself=(
            "a mixture orders itself (its plan and each source's seeded epochs); give the seed to sb.mix(..., seed=N), "
            "or use mixture.reseeded(N), instead of shuffling it"
        ),
    )  # fmt: skip

    @property
    def stores(self) -> tuple[Any, ...]:
        """Every store the mixture reads: one per source."""
        return tuple(part.store for part in self._space.parts)

    @property
    def store(self) -> Any:
        """Refused: a mixture reads one store per source (`stores`)."""
        raise ConfigError("a mixture has one store per source; use epoch.items.parts[s].store")

    @property
    def window_index(self) -> Any:
        """Refused: each source has its own window numbering."""
        raise ConfigError("a mixture has one window numbering per source; use epoch.items.parts[s].window_index")

    def reseed(self, seed: int | None) -> tuple[Mixture, int]:
        """What an epoch of *seed* is made of: the same plan with the source orders of *seed* (None: its own)."""
        mixture = self.reseeded(self.seed if seed is None else seed)
        return mixture, mixture.seed

    def unordered(self) -> Mixture:
        """The mixture itself: it has no other order."""
        return self

    def __init__(
        self,
        space: MixSpace,
        lo: int = 0,
        hi: int | None = None,
        *,
        batch_index: int | None = None,
        global_count: int | None = None,
    ) -> None:
        self._space = space
        self._lo = lo
        self._hi = len(space.plan) if hi is None else hi
        self._batch_index = batch_index
        self._global_count = global_count

    # -- what the mixture is ---------------------------------------------------------
    @property
    def space(self) -> MixSpace:
        """The parts, plan and seed every view shares."""
        return self._space

    @property
    def parts(self) -> tuple[Part, ...]:
        """One `Windows` (or packed `Rows`) per source, in document order."""
        return self._space.parts

    @property
    def packed(self) -> bool:
        """True when the parts are packed `Rows` (the items are rows, the batches packed)."""
        return self._space.packed

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names (``source-0``, ... unless given)."""
        return self._space.names

    @property
    def plan(self) -> MixPlan:
        """The whole mixture's source order (Tijdeman's), shared by every view."""
        return self._space.plan

    @property
    def seed(self) -> int:
        """The mixture seed: source epoch ``e`` of source ``s`` shuffles with ``source_epoch_seed(seed, s, e)``."""
        return self._space.seed

    @property
    def order(self) -> tuple[str, int]:
        """What orders the items (never None: a mixture is always ordered)."""
        return ("mixture", self._space.seed)

    @property
    def shuffle_state_after(self) -> None:
        """None: a mixture's order is the plan and each source's epochs, not one shuffle."""
        return None

    @property
    def weights(self) -> tuple[Any, ...]:
        """The exact normalised weights (Fractions)."""
        return self._space.plan.weights

    @property
    def untrained(self) -> tuple[Any, ...] | None:
        """Each source's `streambatch.items.untrained.UntrainedReport` when its parts were built with
        ``skip_untrained=True`` (the mixture mixes the kept items), else None."""
        reports = tuple(p.untrained for p in self._space.parts)
        return None if reports[0] is None else reports

    @property
    def sizes(self) -> list[int]:
        """Windows (packed: rows) of each source (one source epoch)."""
        return [int(n) for n in self._space.sizes.tolist()]

    @property
    def config(self) -> Any:
        """The context length and stride every part shares."""
        return self._space.parts[0].config

    @property
    def context_length(self) -> int:
        """``T``."""
        return int(self._space.parts[0].context_length)

    @property
    def partition(self) -> Any:
        """The partition every part reads."""
        return self._space.parts[0].partition

    @property
    def fingerprint(self) -> str:
        """What the order depends on besides the seed: every source's fingerprint and window count, the weights, the length."""
        known: str | None = self._space.cache.get("fingerprint")
        if known is None:
            known = self._space.cache["fingerprint"] = mixture_fingerprint(self._space.parts, self.plan, len(self._space.plan))
        return known

    def content_fingerprint(self) -> str:
        """The same as `fingerprint` (a mixture has no other)."""
        return self.fingerprint

    @property
    def plan_nbytes(self) -> int:
        """Bytes of the mixture's plan (the sources' epoch plans are their own)."""
        return self._space.plan.nbytes

    @property
    def batch_index(self) -> int | None:
        """The batch index of a chunk made by `streambatch.chunk`, else None."""
        return self._batch_index

    def reseeded(self, seed: int) -> Mixture:
        """The same mixture with source orders of *seed*: what epoch ``e`` of a `streambatch.Run` reads."""
        return Mixture(self._space.reseeded(check_seed(seed)))

    @property
    def global_count(self) -> int | None:
        """A rank's share of a batch: the counted targets of the whole batch over every rank (None: a whole batch)."""
        return self._global_count

    def view(self, lo: int, hi: int, *, batch_index: int | None = None, global_count: int | None = None) -> Mixture:
        """Items ``lo:hi`` of this view, tagged with *batch_index* (and, for a rank's share, *global_count*)."""
        return Mixture(self._space, self._lo + lo, self._lo + hi, batch_index=batch_index, global_count=global_count)

    @property
    def bounds(self) -> tuple[int, int]:
        """``(lo, hi)``: the items of the whole mixture this view holds."""
        return self._lo, self._hi

    def counted_targets(self) -> int:
        """The targets of this view that count in a token mean (`counted_targets`): no token is read."""
        return counted_targets(self)

    # -- where each item comes from -----------------------------------------------------
    def sources(self) -> SourceArray:
        """The source of each item of this view."""
        return self._space.plan.ids(self._lo, self._hi)

    def locate(self) -> tuple[SourceArray, IntArray]:
        """``(source, index within that source's stream)`` of each item, without replaying the order.

        A view is contiguous: the counts before it (one checkpoint row and at most one
        block), then each source's items numbered in order.
        """
        plan = self._space.plan
        sources, before, _ = plan.span(self._lo, self._hi)
        indices = np.empty(sources.size, dtype=np.int64)
        for s in present(sources):
            rows = sources == s
            indices[rows] = np.arange(before[s], before[s] + int(np.count_nonzero(rows)), dtype=np.int64)
        return sources, indices

    def items(self) -> tuple[SourceArray, IntArray]:
        """``(source, window number within that source)`` of each item."""
        sources, indices = self.locate()
        return sources, self._space.windows(sources, indices)

    def numbers(self) -> IntArray:
        """Window number (within its own source) of each item: ``items()[1]``."""
        return self.items()[1]

    def counts(self, n: int | None = None) -> IntArray:
        """Items of each source among the mixture's first *n* (default: all) items."""
        return self._space.plan.counts(n)

    def source_epochs(self, n: int | None = None) -> list[float]:
        """Source epochs each source has passed among the first *n* items (2.5: two whole epochs and half of one)."""
        counts = self.counts(n)
        return [int(c) / int(size) for c, size in zip(counts.tolist(), self._space.sizes.tolist(), strict=True)]

    def source_plans(self) -> list[Part]:
        """Every source epoch order this mixture reads, computed now (plan files, with a plan folder)."""
        counts = self.counts().tolist()
        return [self._space.order(s, e) for s, n in enumerate(counts) for e in range(-(-n // int(self._space.sizes[s])))]

    def token_spans(self) -> list[tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """``[(store, starts, lengths)]`` per source: the flat token spans this view reads."""
        space = self._space
        if space.packed:
            sources, numbers = space.numbers(self._lo, self._hi)
            return [span for s in present(sources) for span in row_spans(space.spaces[s], numbers[sources == s])]
        sources, positions, _ = space.window_rows(self._lo, self._hi)
        spans = []
        for s in present(sources):
            starts = positions[sources == s].astype(np.int64)
            window = space.spaces[s]
            spans.append((window.store, starts, np.full(starts.size, window.config.context_length + 1, dtype=np.int64)))
        return spans

    def gather(self, index: int) -> MiniBatch:
        """Gather this view's rows into a `MiniBatch` with ``sources`` (packed parts: a packed one) numbered *index*:
        the one-batch case of `gather_batches`."""
        return gather_one(self, index)

    def gather_batches(self, batch_size: int, batches: range, *, reader: BatchReader | None = None) -> Iterator[MiniBatch]:
        """Batches *batches* of this mixture chunked by *batch_size*, consecutive ones located and checked a block at a
        time, each fetched first from remote stores (`streambatch.items.road.fetched`; *reader*: a `streambatch.Batches`'
        own).  A strided share (workers) takes one batch per block."""
        return fetched(self, batch_size, batches, lambda todo: self._batches(batch_size, todo), reader)

    def _batches(self, size: int, batches: range) -> Iterator[MiniBatch]:
        """The mixture's one batch loop: per batch only the gather remains, as for one source."""
        if batches.step != 1:
            for b in batches:
                yield from self._batches(size, range(b, b + 1))
            return
        space = self._space
        if space.packed:
            yield from self._packed_chunks(size, batches)
            return
        gather, spaces = space.gather(), space.spaces
        masks = mixture_masks(spaces)  # decided once
        per = max(1, _BLOCK_ROWS // size)
        for head in range(0, len(batches), per):
            group = batches[head : head + per]
            lo, hi = group[0] * size, min((group[-1] + 1) * size, len(self))
            sources, positions, rows = space.window_rows(self._lo + lo, self._lo + hi)
            for batch in group:
                first = batch * size - lo
                cut = slice(first, min(first + size, hi - lo))
                inputs, targets = gather.take((rows[0][cut],) if len(rows) == 1 else tuple(r[cut] for r in rows))
                at, of = positions[cut], sources[cut]
                yield window_batch(batch, inputs, targets, at, spaces, masks, of, space.names)

    def _packed_chunks(self, size: int, batches: range) -> Iterator[MiniBatch]:
        """Consecutive packed batches: sources and row numbers located a block of batches at a time."""
        space, per = self._space, max(1, _BLOCK_ROWS // size)
        gather = space.packed_gather()
        check_emittable(min(size, len(self)), gather.spaces[0].packing.context_length, gather.dtype, batch_size=size)
        for head in range(0, len(batches), per):
            group = batches[head : head + per]
            lo, hi = group[0] * size, min((group[-1] + 1) * size, len(self))
            sources, numbers = space.numbers(self._lo + lo, self._lo + hi)
            for batch in group:
                cut = slice(batch * size - lo, min(batch * size - lo + size, hi - lo))
                yield gather(sources[cut], numbers[cut], batch)

    # -- the sequence protocol ----------------------------------------------------------
    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, item: int) -> MixItem: ...
    @overload
    def __getitem__(self, item: slice) -> Mixture: ...
    def __getitem__(self, item: int | slice) -> MixItem | Mixture:
        size = len(self)
        if isinstance(item, slice):
            try:
                start, stop, step = item.indices(size)
            except (TypeError, ValueError) as err:
                raise OutOfRangeError(f"slice {item!r} is not a slice of ints with a non-zero step ({err})") from None
            if step != 1:
                raise OutOfRangeError(f"slice {item!r} has step {step}; a mixture view is contiguous (step 1)")
            return self.view(start, max(start, stop))
        if not is_integer(item):
            raise OutOfRangeError(f"index={item!r} is not an int or a slice; index a mixture by position")
        at = int(item) + size if int(item) < 0 else int(item)
        if not 0 <= at < size:
            raise OutOfRangeError(f"index={item!r} is out of range for {size} items; use -len <= index < len")
        sources, windows = self[at : at + 1].items()
        return MixItem(int(sources[0]), int(windows[0]))

    def __iter__(self) -> Iterator[MixItem]:
        sources, windows = self.items()
        return (MixItem(s, w) for s, w in zip(sources.tolist(), windows.tolist(), strict=True))

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={float(w):.4g}" for n, w in zip(self.names, self.weights, strict=True))
        rows = ", packed rows" if self.packed else ""
        return f"Mixture({len(self)} items, {shares}, seed={self.seed}, context_length={self.context_length}{rows})"


def _too_long(parts: Sequence[Part], names: Sequence[str], weights: Any, length: int | None) -> ConfigError:
    """The mixture's plan cannot be made: name the weights (and, for the default length, the source that sets it)."""
    given = ", ".join(f"{n!r}: {w!r}" for n, w in zip(names, weights, strict=True))
    if length is not None:
        return ConfigError(f"a mixture of length={length} at weights {{{given}}} does not fit in memory; pass a smaller length")
    sizes = [len(p) for p in parts]
    big = max(range(len(parts)), key=lambda s: (sizes[s], -float(weights[s])))
    share = float(weights[big]) / sum(float(w) for w in weights)
    return ConfigError(
        f"the default length passes the largest source {names[big]!r} ({sizes[big]} items) once at its share {share:.3g} "
        f"of the weights {{{given}}}: about {sizes[big] / share:.3g} items, too many to plan; give the mixture a length, "
        f"or {names[big]!r} a larger weight"
    )


def check_distinct_stores(parts: Sequence[Part], names: Sequence[str]) -> None:
    """Refuse one store (or corpus) listed under two names: every item of it would come twice per pass."""
    seen: dict[Any, str] = {}
    for part, name in zip(parts, names, strict=True):
        store = part.store
        key = store.fingerprint if store.fingerprint is not None else id(store)
        if key in seen:
            raise ConfigError(
                f"sources {seen[key]!r} and {name!r} are the same store (fingerprint {str(key)[:24]}...); "
                "each window would come twice per pass: list it once, with the sum of the weights"
                if isinstance(key, str)
                else f"sources {seen[key]!r} and {name!r} are the same store; list it once, with the sum of the weights"
            )
        seen[key] = name


def mixture_fingerprint(parts: Sequence[Part], plan: MixPlan, length: int) -> str:
    """``mixture:`` + BLAKE2b-128 of the sources' fingerprints and item counts, the integer weights and the length.

    A mixture of packed rows adds ``"rows"`` and ``T`` (a mixture of windows keeps its fingerprint); one of parts
    built with ``skip_untrained`` adds each source's dropped count.
    """
    rows = [["rows", parts[0].context_length]] if parts[0].packed else []
    filtered = [["skip_untrained", [p.untrained.dropped for p in parts]]] if parts[0].untrained is not None else []
    key = [
        FORMAT,
        *rows,
        *filtered,
        [p.store.fingerprint or p.store.content_fingerprint() for p in parts],
        [len(p) for p in parts],
        [str(a) for a in plan.integer_weights],
        length,
    ]
    return "mixture:" + hashlib.blake2b(json.dumps(key).encode(), digest_size=16).hexdigest()


def mix(
    parts: Sequence[Part],
    weights: Sequence[Any],
    *,
    seed: int,
    length: int | None = None,
    names: Sequence[str] | None = None,
    plan_dir: str | os.PathLike[str] | None = None,
    weight_by: str = "items",
) -> Mixture:
    """Blend *parts* (one `Windows` per source, or one packed `Rows` per source) at *weights* into a `Mixture`.

    It holds *length* items (``None``: the largest source once at its weight).  *weights* are positive finite
    numbers (normalised to sum 1, exactly): shares of items, or with ``weight_by="targets"`` of counted targets
    (`streambatch.items.mix.targets`).  With *plan_dir* the plan and each source epoch's order are plan files.
    """
    found = check_parts(parts)
    ints = item_weights(found, weights, weight_by, names)
    if len(ints) != len(found):
        raise ConfigError(f"weights has {len(ints)} entries for {len(found)} parts; pass one weight per source")
    seed = check_seed(seed)
    chosen = check_names(names, len(found))
    check_distinct_stores(found, chosen)
    check_one_tokenizer([f"source {n!r}" for n in chosen], [p.store.tokenizer for p in found], "a mixture")
    directory = None if plan_dir is None else check_plan_dir(plan_dir)
    try:
        if directory is None:
            return Mixture(MixSpace(found, chosen, plan_mix(ints, length, sizes=[len(p) for p in found]), seed, None))
        from .plan_file import mix_plan_file

        plan, path = mix_plan_file(found, ints, length, directory)
    except MemoryError:  # e.g. the default length of a largest source with a tiny weight
        raise _too_long(found, chosen, weights, length) from None
    except ConfigError as err:
        if length is None and "below 2**48" in str(err):  # the default length: say which weights make it
            raise _too_long(found, chosen, weights, length) from None
        raise
    return Mixture(MixSpace(found, chosen, plan, seed, directory, str(path)))
