"""The chapter's stand-in loss: one deterministic per-token loss for the audit, the chapter's demo and the README.

A target token ``t`` of the window at document index ``d``, start ``s`` has loss
``((8d + 2s + t + 1) mod 64) / 8`` and gradient ``[2l, 2 - l]``.  Wrapping at 8
keeps every loss a multiple of 1/8 below 8, so float64 sums of up to ~10**14
tokens are exact in any order; on the chapter's fixture nothing wraps and the
values are the chapter's ``(8d + 2s + t + 1) / 8``.  Losses are computed in
integer *units* of 1/8.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..batch.reduce import TokenContribution, TokenSums

CYCLE = 64  # units wrap here: losses below 8
_CYCLE_PREFIX = np.concatenate([[0], np.cumsum(np.arange(2 * CYCLE) % CYCLE)]).astype(np.int64)


def _base(documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    base: npt.NDArray[np.int64] = 8 * (documents % 8) + 2 * (starts % 32) + 1  # reduced first: no int64 overflow
    return base


def loss_units(documents: npt.ArrayLike, starts: npt.ArrayLike, context_length: int) -> npt.NDArray[np.int64]:
    """Per-token losses in units of 1/8, ``[rows, context_length]``."""
    base = _base(np.asarray(documents, np.int64), np.asarray(starts, np.int64))
    units: npt.NDArray[np.int64] = (base[:, None] + np.arange(context_length, dtype=np.int64)) % CYCLE
    return units


def window_loss_units(documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], context_length: int) -> int:
    """Sum of `loss_units` over whole windows in closed form: full cycles plus a prefix-sum difference.

    >>> d, s = np.array([1, 0, 9]), np.array([1, 0, 70])
    >>> window_loss_units(d, s, 100) == int(loss_units(d, s, 100).sum())
    True
    """
    return int(span_units(_base(documents, starts), context_length).sum())


def span_units(base: npt.ArrayLike, count: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """``sum((base + t) % 64 for t in range(count))`` per element, in closed form: full cycles plus a prefix difference.

    >>> span_units(np.array([5, 63]), np.array([3, 130])).tolist() == [5 + 6 + 7, sum((63 + t) % 64 for t in range(130))]
    True
    """
    first = np.asarray(base, dtype=np.int64) % CYCLE
    cycles, rest = np.divmod(np.asarray(count, dtype=np.int64), CYCLE)
    units: npt.NDArray[np.int64] = cycles * int(_CYCLE_PREFIX[CYCLE]) + _CYCLE_PREFIX[first + rest] - _CYCLE_PREFIX[first]
    return units


def target_units(documents: npt.ArrayLike, targets: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The packed audit's stand-in loss, in units of 1/8, of target *targets* (0-based, in its document) of *documents*.

    ``(8 (d mod 8) + t + 1) mod 64``: a document's targets in order run through
    the units from ``8 (d mod 8) + 1``, so a document's sum is `span_units` of it.

    >>> target_units([1, 1, 2], [0, 1, 100]).tolist()
    [9, 10, 53]
    """
    docs, spots = np.asarray(documents, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    units: npt.NDArray[np.int64] = (8 * (docs % 8) + spots % CYCLE + 1) % CYCLE
    return units


def stand_in_losses(document_indices: npt.ArrayLike, starts: npt.ArrayLike, context_length: int) -> npt.NDArray[np.float64]:
    """Per-token stand-in losses ``[rows, context_length]``: the chapter's ``(8d + 2s + t + 1) / 8``, taken mod 8.

    >>> stand_in_losses([1, 0], [1, 0], 2).tolist()
    [[1.375, 1.5], [0.125, 0.25]]
    """
    return loss_units(document_indices, starts, context_length) / 8.0


def sums_of_units(units: int, token_count: int) -> TokenSums:
    """`TokenSums` of a loss of *units* eighths over *token_count* tokens, gradient sums ``[2l, 2 - l]`` summed."""
    loss = units / 8.0
    return TokenSums(loss, token_count, np.array([2.0 * loss, 2.0 * token_count - loss]))


def stand_in_sums(document_indices: npt.ArrayLike, starts: npt.ArrayLike, context_length: int) -> TokenSums:
    """Raw `TokenSums` of a batch's stand-in losses: loss sum, ``rows * context_length`` tokens, gradient sums.

    >>> s = stand_in_sums([0, 0], [0, 2], 2)
    >>> s.loss_sum, s.token_count, s.gradient_sum.tolist()
    (1.75, 4, [3.5, 6.25])
    """
    units = loss_units(document_indices, starts, context_length)
    return sums_of_units(int(units.sum()), int(units.size))


def stand_in_contributions(
    document_indices: npt.ArrayLike, starts: npt.ArrayLike, context_length: int
) -> list[TokenContribution]:
    """One `TokenContribution` per target token, row by row: the stand-in loss ``l`` and its gradient ``[2l, 2 - l]``.

    >>> [(c.loss, c.gradient.tolist()) for c in stand_in_contributions([1], [1], 2)]
    [(1.375, [2.75, 0.625]), (1.5, [3.0, 0.5])]
    """
    losses: list[float] = stand_in_losses(document_indices, starts, context_length).ravel().tolist()
    return [TokenContribution(loss, [2.0 * loss, 2.0 - loss]) for loss in losses]
