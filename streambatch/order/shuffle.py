"""Stage 3, order: the chapter's seeded shuffle, bit-exact, in bounded scratch memory.

The specification is a plain loop: SplitMix64 (state = seed; each draw adds
``0x9E3779B97F4A7C15`` and mixes) drives Fisher–Yates from the last index down
to 1, drawing each swap target below ``upper + 1`` by rejection (threshold
``2**64 mod bound``; redraw while ``draw < threshold``; then ``draw % bound``).

`shuffled_order` runs it on one of two paths, the ``shuffle`` kernel's switch
(`streambatch._kernels`: ``backend("shuffle")``, ``use("shuffle", "python")``):

``"c"``
    The compiled extension ``streambatch._fisher_yates`` (built by ``pip install``
    where a C compiler is present) runs the loop literally, in place on the output
    array, with the GIL released.  Scratch memory: a few hundred bytes.  About a
    quarter to a half of ``numpy.random.default_rng().permutation``'s time
    (``scripts/bench_shuffle.py``).
``"python"``
    numpy, the fallback when the extension is missing (no compiler at install time):
    exact too, but several times slower than numpy's permutation.  The steps are
    taken in blocks of ``_CHUNK``; each block's swap chain is resolved vectorized
    on just the positions it touches (`apply_swaps`), so scratch memory stays
    bounded (about 65 MB) whatever the count.

The vectorized pieces are public:

1. `swap_targets`: every draw is ``mix(seed + k * golden)`` for its draw number
   ``k``, so all draws are computed at once; the (astronomically rare) rejections
   are found exactly and shift the later draw numbers by one.
2. `apply_swaps`: the sequential swap chain is resolved without a loop per
   window.  Position ``i`` finally holds what location ``H[i]`` held just before
   step ``i``: the value left there by the previous (next-larger) step with the
   same target, or ``H[i]`` itself if there was none; and what step ``m`` leaves
   behind is what its own position held before it, which is a root-finding
   problem in a forest, solved by pointer doubling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import check_non_negative, check_seed
from .._kernels import extension, legacy_switch
from ..errors import ConfigError, StoreError
from .protocol import ItemWords, OrderedT, ShuffleOrder
from .splitmix import splitmix64_draws, state_after

_CHUNK = 1 << 19  # steps per block: the numpy backend peaks near 128 bytes per step of scratch
_BLOCK = 1 << 15
_U32_LIMIT = (1 << 32) - 1

IndexArray = npt.NDArray[np.uint32] | npt.NDArray[np.int64]

legacy_switch(__name__, "BACKEND", "shuffle", "numpy")  # the old switch ("c" or "numpy"), for one release


def index_dtype(count: int) -> type[np.unsignedinteger[Any]] | type[np.signedinteger[Any]]:
    """uint32 while every index and the count itself fit, else int64.

    >>> index_dtype(5).__name__, index_dtype(2**32).__name__
    ('uint32', 'int64')
    """
    return np.uint32 if count <= _U32_LIMIT else np.int64


def swap_targets(count: int, seed: int) -> tuple[IndexArray, int]:
    """Return ``(H, draws)``: step ``i`` swaps positions ``i`` and ``H[i]``.

    Steps run ``i = count - 1`` down to 1; ``H[0] = 0`` is a no-op placeholder.
    *draws* counts every SplitMix64 draw consumed, rejected ones included.

    >>> H, draws = swap_targets(5, seed=7)
    >>> H.tolist(), draws
    ([0, 1, 0, 0, 2], 4)
    """
    count = check_non_negative(count, "count", "the number of items to shuffle")
    seed = check_seed(seed)
    targets = np.zeros(count, dtype=index_dtype(count))

    def store(lower: int, block: npt.NDArray[np.uint64]) -> None:
        targets[lower : lower + block.size] = block

    return targets, _draw_targets(count, seed, store)


def _draw_targets(count: int, seed: int, sink: Callable[[int, npt.NDArray[np.uint64]], None]) -> int:
    """Draw the swap targets of steps ``count - 1`` down to 1, in blocks of at most ``_CHUNK`` steps.

    Calls ``sink(lower, block)`` once per block, top block first: ``block[k]`` is the
    target of step ``lower + k``.  Returns the number of draws, rejected ones included.
    """
    extra = 0  # draws rejected so far; each shifts all later draw numbers by one
    upper = count - 1
    while upper >= 1:
        lower = max(1, upper - _CHUNK + 1)
        draws = splitmix64_draws(seed, count - upper + extra, upper - lower + 1)
        bounds = np.arange(upper + 1, lower, -1, dtype=np.uint64)  # bound of step i is i + 1
        accepted = draws.size
        maybe = np.flatnonzero(draws < bounds)  # rejection needs draw < (2**64 % bound) < bound
        if maybe.size:
            bound = bounds[maybe]
            rejected = maybe[draws[maybe] < (np.uint64(0) - bound) % bound]
            if rejected.size:
                accepted = int(rejected[0])
        if accepted:
            values = draws[:accepted]
            values %= bounds[:accepted]
            sink(upper - accepted + 1, values[::-1])
        if accepted < draws.size:
            extra += 1  # redo step ``upper - accepted`` with the next draw
        upper -= accepted
        if accepted == draws.size:
            upper = lower - 1
    return max(count - 1, 0) + extra


def apply_swaps(targets: IndexArray) -> IndexArray:
    """Resolve the Fisher–Yates swap chain ``targets`` into the final order, vectorized.

    Equal to ``a = list(range(n)); for i in range(n - 1, 0, -1): a[i], a[t[i]] = a[t[i]], a[i]``.

    >>> apply_swaps(np.array([0, 1, 0, 0, 2], dtype=np.uint32)).tolist()
    [4, 1, 3, 0, 2]
    """
    return _resolve(targets, reuse=False)


def _resolve(targets: IndexArray, *, reuse: bool) -> IndexArray:
    """`apply_swaps`; with *reuse*, *targets* is consumed as scratch space (peak memory)."""
    count = int(targets.size)
    if count <= 1:
        return np.zeros(count, dtype=targets.dtype)
    # uint32 needs one spare value for the sentinel "no such step"
    dtype = np.uint32 if count < _U32_LIMIT else np.int64
    none = count
    # Steps grouped by target, ascending within a group.  Steps sharing target h
    # write location h one after another (largest first), so the value step i
    # finds at h is the leftover of the next-larger step in its group.
    by_target, steps = _group_by_target(targets, dtype)
    boundary = np.empty(count, dtype=bool)  # boundary[p]: p starts a new target group
    boundary[0] = True
    np.not_equal(by_target[1:], by_target[:-1], out=boundary[1:])
    starts = _flatnonzero(boundary, dtype)
    # parent[m]: the step whose leftover position m holds just before step m: the
    # smallest step targeting m other than m itself (H[m] == m puts m first).
    group_target = by_target[starts]
    group_first = steps[starts]
    own = group_first == group_target
    following = starts[own] + 1  # the second member of a group led by its own step
    exists = following < count
    exists[exists] = ~boundary[following[exists]]
    group_first[own] = np.where(exists, steps[np.minimum(following, count - 1)], none)
    del following, exists, own, starts
    # root[m]: what step m leaves at its target, i.e. position m's value before step m
    root = np.arange(count + 1, dtype=dtype)
    linked = group_first != none
    active = group_target[linked]
    root[active] = group_first[linked]  # increasing indices: a streaming write
    del group_first, group_target, linked
    while active.size:  # pointer doubling: each round halves every remaining path
        ancestor = root[active]
        jump = root[ancestor]
        root[active] = jump
        active = active[jump != ancestor]
    # step steps[p] finds the leftover of steps[p + 1] when both share a target,
    # else the untouched original value of its target
    found = targets if reuse and targets.dtype == dtype else np.empty(count, dtype=dtype)
    for lo in range(0, count, _CHUNK):  # in blocks: bounded temporaries
        hi = min(lo + _CHUNK, count)
        found[lo:hi] = by_target[lo:hi]
        inner = np.flatnonzero(~boundary[lo + 1 : hi + 1]) + lo  # only these need a random gather
        found[inner] = root[steps[inner + 1]]
    result: IndexArray = root[:count]  # every position is rewritten below: reuse the buffer
    result[steps] = found
    return result


def _sorted_unique(values: npt.NDArray[np.uint64]) -> tuple[Any, Any]:
    """``(unique, rank)``: *values* sorted without repeats, and each value's index in it.

    One sort of packed ``(value, index)`` keys when they fit 64 bits, else a stable argsort.
    """
    if not values.size:
        return values, np.zeros(0, dtype=np.intp)
    bits = (values.size - 1).bit_length()
    if int(values.max()) < 1 << (64 - bits):
        keys = values << np.uint64(bits)
        keys |= np.arange(values.size, dtype=np.uint64)
        keys.sort()
        ordered = keys >> np.uint64(bits)
        keys &= np.uint64((1 << bits) - 1)
        where = keys.astype(np.intp)
    else:
        where = np.argsort(values, kind="stable")
        ordered = values[where]
    first = np.empty(ordered.size, dtype=bool)  # first[p]: ordered[p] starts a run of equal values
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    rank = np.empty(ordered.size, dtype=np.intp)
    rank[where] = np.cumsum(first) - 1
    return ordered[first], rank


def _flatnonzero(mask: npt.NDArray[np.bool_], dtype: Any) -> Any:
    """``np.flatnonzero(mask)`` as *dtype*, built in blocks (no full-size int64 temporary)."""
    parts = [np.flatnonzero(mask[lo : lo + _CHUNK]).astype(dtype) + dtype(lo) for lo in range(0, mask.size, _CHUNK)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _group_by_target(targets: IndexArray, dtype: Any) -> tuple[Any, Any]:
    """Steps sorted by (target, step), as two arrays, from one sort of packed 64-bit keys."""
    count = int(targets.size)
    if dtype == np.uint32 and np.little_endian:
        keys = np.arange(count, dtype=np.uint64)  # low half: the step
        halves = keys.view(np.uint32)
        halves[1::2] = targets  # high half: its target
        keys.sort()
        return halves[1::2], halves[0::2]
    order = np.argsort(targets, kind="stable")
    return targets[order].astype(dtype), order.astype(dtype)


def shuffled_order(count: int, seed: int, out: IndexArray | None = None) -> tuple[IndexArray, int]:
    """Return ``(order, state_after)``: the chapter's seeded permutation of ``range(count)``.

    *order* is uint32 when *count* fits (4 bytes per window), else int64; see
    `index_dtype`.  Pass *out*, a writable contiguous 1-D array of that dtype and
    length *count* (a writable `numpy.memmap` of a plan file, say), to have the
    order written straight into it; it is then returned as *order*.  Beyond *order*
    itself the shuffle needs only bounded scratch memory, on either path.

    >>> order, state = shuffled_order(5, seed=7)
    >>> order.tolist()
    [4, 1, 3, 0, 2]
    >>> shuffled_order(0, seed=9)[1]
    9
    """
    count = check_non_negative(count, "count", "the number of items to shuffle")
    seed = check_seed(seed)
    order = np.empty(count, dtype=index_dtype(count)) if out is None else _check_out(out, count)
    kernel = extension("shuffle")
    draws = _shuffle_blocked(order, seed) if kernel is None else kernel.shuffle(order, seed)
    return order, state_after(seed, draws)


def _check_out(out: Any, count: int) -> IndexArray:
    """*out* itself if it can hold the order of *count* items, else raise `ConfigError` saying why."""
    dtype = np.dtype(index_dtype(count))
    if not isinstance(out, np.ndarray):
        problems = ["not a numpy array"]
    else:
        problems = [
            *([f"dtype={out.dtype}"] if out.dtype != dtype else []),
            *([f"shape={out.shape}"] if out.shape != (count,) else []),
            *(["not C-contiguous"] if not out.flags.c_contiguous else []),
            *(["read-only"] if not out.flags.writeable else []),
        ]
    if problems:
        raise ConfigError(
            f"out={type(out).__name__} ({', '.join(problems)}) cannot hold the order of count={count} items; "
            f"pass a writable, C-contiguous {dtype} array of shape ({count},) (index_dtype(count)), or out=None"
        )
    result: IndexArray = out
    return result


def _shuffle_blocked(order: IndexArray, seed: int, fill: bool = True) -> int:
    """The numpy backend: shuffle *order* (filled with the identity first) in place; return the draws.

    Each block of steps ``lower .. upper`` touches its own positions and some of
    its targets below ``lower``.  Only those positions are gathered, the block's
    swap chain is resolved on them with `apply_swaps` (the positions below
    ``lower`` become no-op steps), and the result is scattered back.
    """
    count = int(order.size)
    for lo in range(0, count if fill else 0, _CHUNK):  # the identity, in blocks: no full-size temporary
        hi = min(lo + _CHUNK, count)
        order[lo:hi] = np.arange(lo, hi, dtype=order.dtype)

    def apply(lower: int, targets: npt.NDArray[np.uint64]) -> None:
        below = np.flatnonzero(targets < lower)  # the steps whose target lies outside the block
        outside, rank = _sorted_unique(targets[below])
        steps = outside.size + targets.size
        local = np.empty(steps, dtype=np.uint32 if steps < _U32_LIMIT else np.int64)
        local[: outside.size] = np.arange(outside.size, dtype=local.dtype)  # no-op steps
        inside = local[outside.size :]
        inside[:] = targets - np.uint64(lower - outside.size)  # wraps below lower: overwritten next
        inside[below] = rank  # sorted compression keeps every H[i] <= i
        positions = np.concatenate([outside, np.arange(lower, lower + targets.size, dtype=np.uint64)])
        order[positions] = order[positions][_resolve(local, reuse=True)]

    return _draw_targets(count, seed, apply)


def permute(values: npt.NDArray[Any], seed: int) -> int:
    """Put *values* in the chapter's seeded order, in place; return the SplitMix64 state after.

    ``values[i]`` ends up holding the old ``values[order[i]]`` for
    ``order, state = shuffled_order(len(values), seed)``: Fisher–Yates run on the
    values themselves, so no index array is ever allocated.

    >>> values = np.array([10, 11, 12, 13, 14], dtype=np.uint32)
    >>> permute(values, seed=7) == state_after(7, 4), values.tolist()
    (True, [14, 11, 13, 10, 12])
    """
    seed = check_seed(seed)
    if not isinstance(values, np.ndarray) or values.dtype not in (np.uint32, np.int64) or values.ndim != 1:
        raise ConfigError(f"values={values!r} must be a 1-D uint32 or int64 numpy array; pass the plan to permute")
    if not values.flags.c_contiguous or not values.flags.writeable:
        raise ConfigError("values must be C-contiguous and writable; pass a fresh copy (np.array(values))")
    if values.dtype == np.uint32 and values.size > _U32_LIMIT + 1:
        raise ConfigError(f"values has {values.size} uint32 entries; more than 2**32 need int64")
    kernel = extension("shuffle")
    draws = _shuffle_blocked(values, seed, fill=False) if kernel is None else kernel.shuffle(values, seed, False)
    return state_after(seed, draws)


def shuffle(windows: OrderedT, seed: int) -> OrderedT:
    """The same windows (or packed `Rows`) in the chapter's exact SplitMix64 Fisher–Yates order.

    The result is backed by a plan of one uint32 per window (first-token
    positions; for rows, row numbers); ``state_after`` holds the SplitMix64
    state after the shuffle.

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> order = sb.shuffle(sb.windows(docs, context_length=2), seed=7)
    >>> list(order), order.shuffle_state_after == state_after(7, 4)
    ([4, 1, 3, 0, 2], True)
    """
    seed = check_seed(seed)
    words: ItemWords | None = getattr(windows, "words", None)  # what the kind is called (any object may be passed)
    own = None if words is None else words.orders_itself  # a kind whose order is its own (a mixture): no plan to permute
    if own is not None:
        raise ConfigError(f"sb.shuffle: {own}")
    try:
        values = windows.plan_values()  # fresh in document order; a view of the plan otherwise
        plan = values if windows.is_sequential else values.copy()
    except MemoryError:  # numpy's _ArrayMemoryError: say what was needed instead
        count = len(windows)
        need = count * np.dtype(windows.space.plan_dtype(count)).itemsize
        raise StoreError(
            f"shuffle: a plan of {count} {type(windows).__name__.lower()} needs {need} bytes of memory "
            "and they could not be allocated; raise the memory limit (ulimit -v) or shuffle on a larger machine"
        ) from None
    state = permute(plan, seed)
    return windows.with_plan(plan, ShuffleOrder(seed, state))
