"""SplitMix64, the chapter's generator: its draws, its state after a number of draws, and derived seeds.

Every seeded order in streambatch comes from here: the shuffle's Fisher–Yates
draws, and the seed of each epoch of a run (`derive_seed`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .._checks import check_non_negative, check_seed

GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1
_BLOCK = 1 << 15


def splitmix64_draws(seed: int, first: int, count: int) -> npt.NDArray[np.uint64]:
    """Draws number ``first .. first + count - 1`` (1-based) of SplitMix64 from *seed*.

    >>> [hex(d) for d in splitmix64_draws(0, 1, 2).tolist()]
    ['0xe220a8397b1dcdaf', '0x6e789e6aa1b965f4']
    """
    out = np.arange(count, dtype=np.uint64)
    scratch = np.empty(min(count, _BLOCK), dtype=np.uint64)
    offset = np.uint64(((first * GOLDEN) + seed) & _MASK64)
    for lo in range(0, count, _BLOCK):  # cache-sized blocks, no temporaries
        z = out[lo : lo + _BLOCK]
        tmp = scratch[: z.size]
        z *= np.uint64(GOLDEN)
        z += offset
        _mix(z, tmp)
    return out


def _mix(z: npt.NDArray[np.uint64], tmp: npt.NDArray[np.uint64]) -> None:
    """SplitMix64's output function, in place on *z*, using *tmp* as scratch."""
    for shift, factor in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        z ^= tmp
        z *= factor
    np.right_shift(z, np.uint64(31), out=tmp)
    z ^= tmp


def state_after(seed: int, draws: int) -> int:
    """The SplitMix64 state after *draws* draws from *seed*.

    >>> state_after(9, 0)
    9
    """
    return (seed + draws * GOLDEN) & _MASK64


def derive_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch *epoch* of a run seeded with *seed*; epoch 0 uses *seed* itself.

    Epoch ``e > 0`` takes SplitMix64 draw number ``e`` from *seed*, so every
    epoch's order follows from the run seed and the epoch number alone.

    >>> derive_seed(7, 0), derive_seed(7, 1) != derive_seed(7, 2)
    (7, True)
    >>> derive_seed(7, -1)
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: epoch=-1 must be a non-negative int; pass the epoch number (0 for the first)
    """
    checked = check_seed(seed)
    number = check_non_negative(epoch, "epoch", "the epoch number (0 for the first)")
    if number == 0:
        return checked
    return int(splitmix64_draws(checked, number, 1)[0])
