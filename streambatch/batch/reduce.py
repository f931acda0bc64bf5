"""Stage 6, reduce: token means from raw sums, merged across pieces, divided once.

Keep the loss sum, the gradient sums and the token count; merge raw sums; divide
once at the end.  Never average per-piece means.  A piece is a `TokenSums`
(micro-batch, worker, rank); `token_mean` folds a stream of them.  Every
accumulator operation preflights its whole result first, so a failed call
leaves the accumulator exactly as it was.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
from more_itertools import spy

from .._checks import SIZE_LIMIT, is_integer, short_repr
from ..errors import AccumulationError
from .sums import (
    FloatArray,
    TokenContribution,
    TokenMean,
    TokenSums,
    check_finite,
    float_vector,
    merge_sources,
    real,
    to_array,
)

__all__ = ["TokenContribution", "TokenMean", "TokenMeanAccumulator", "TokenSums", "accumulated", "token_mean"]


class TokenMeanAccumulator:
    """Raw loss sum, gradient sums and token count that merge before one division.

    >>> acc = TokenMeanAccumulator(gradient_width=2)
    >>> acc.add_token(TokenContribution(0.125, [0.25, 1.875]))
    >>> acc.add_token(TokenContribution(0.375, [0.75, 1.625]))
    >>> mean = acc.finish()
    >>> mean.token_count, mean.mean_loss, mean.mean_gradient.tolist()
    (2, 0.25, [0.5, 1.75])

    A failed call changes nothing:

    >>> acc.add_token(TokenContribution(1.0, [1.0]))
    Traceback (most recent call last):
    ...
    streambatch.errors.AccumulationError: contribution has gradient width 1, but this accumulator has width 2; ...
    >>> acc.token_count
    2
    """

    __slots__ = ("_gradient_sums", "_loss_sum", "_token_count")

    def __init__(self, gradient_width: int) -> None:
        if not is_integer(gradient_width) or not 0 < int(gradient_width) < SIZE_LIMIT:
            raise AccumulationError(
                f"gradient_width={short_repr(gradient_width)} must be a positive int below 2**48; "
                "pass the number of gradient coordinates"
            )
        self._loss_sum = 0.0
        self._gradient_sums: FloatArray = np.zeros(int(gradient_width), dtype=np.float64)
        self._token_count = 0

    @property
    def gradient_width(self) -> int:
        """Number of gradient coordinates."""
        return int(self._gradient_sums.size)

    @property
    def token_count(self) -> int:
        """Target tokens added so far."""
        return self._token_count

    @property
    def loss_sum(self) -> float:
        """Raw sum of every added loss."""
        return self._loss_sum

    @property
    def gradient_sums(self) -> FloatArray:
        """Raw per-coordinate gradient sums (a read-only view)."""
        view: FloatArray = self._gradient_sums.view()
        view.flags.writeable = False
        return view

    def copy(self) -> TokenMeanAccumulator:
        """An independent accumulator with the same sums."""
        twin = TokenMeanAccumulator(self.gradient_width)
        twin._commit(self._loss_sum, self._gradient_sums, self._token_count)
        return twin

    def add_token(self, contribution: TokenContribution) -> None:
        """Add one target token's loss and gradient, left to right as the chapter does."""
        if not isinstance(contribution, TokenContribution):
            raise AccumulationError(
                f"contribution={contribution!r} is not a TokenContribution; wrap it with TokenContribution(loss, gradient)"
            )
        self._check_width(contribution.gradient_width, "contribution")
        self._apply(contribution.loss, contribution.gradient, 1)

    def add_tokens(self, losses: Any, gradients: Any) -> None:
        """Add many tokens at once: *losses* shape ``(k,)``, *gradients* ``(k, width)``.

        The sums use numpy's (pairwise) summation order, so they may differ from
        ``k`` calls of `add_token` in the last bits; use `add_token` when results must
        match a left-to-right sum bit for bit.
        """
        loss_array = to_array(losses, "losses")
        grad_array = to_array(gradients, "gradients")
        if loss_array.ndim != 1 or loss_array.dtype.kind not in "fiu":
            raise AccumulationError(f"losses has shape {loss_array.shape} and dtype {loss_array.dtype}; pass a 1-D float array")
        if grad_array.ndim != 2 or grad_array.dtype.kind not in "fiu":
            raise AccumulationError(
                f"gradients has shape {grad_array.shape} and dtype {grad_array.dtype}; pass a 2-D (tokens, width) float array"
            )
        if grad_array.shape[0] != loss_array.shape[0]:
            raise AccumulationError(
                f"losses has {loss_array.shape[0]} tokens but gradients has {grad_array.shape[0]} rows; "
                "pass one gradient row per loss"
            )
        self._check_width(grad_array.shape[1], "gradients")
        loss_values = loss_array.astype(np.float64)
        grad_values = grad_array.astype(np.float64)
        check_finite(loss_values, "losses", "every loss")
        check_finite(grad_values, "gradients")
        self._apply(float(loss_values.sum()), grad_values.sum(axis=0), loss_values.size)

    def add_sums(self, loss_sum: Any, token_count: Any, gradient_sum: Any) -> None:
        """Add a pre-summed piece, e.g. after a sum-reduced backward over *token_count* tokens.

        The arguments come in `TokenSums`'s order: ``add_sums(loss_sum, token_count,
        gradient_sum)`` is ``add(TokenSums(loss_sum, token_count, gradient_sum))``.  The
        0.3 order ``(loss_sum, gradient_sum, token_count)``, recognized by a count in the
        last place and an array in the middle, still works for one release with a
        `DeprecationWarning`.
        """
        if is_integer(gradient_sum) and not is_integer(token_count):
            warnings.warn(
                "add_sums(loss_sum, gradient_sum, token_count) is the old order: pass (loss_sum, token_count, gradient_sum), "
                "as TokenSums takes them (or keywords)",
                DeprecationWarning,
                stacklevel=2,
            )
            token_count, gradient_sum = gradient_sum, token_count
        if not is_integer(token_count) or int(token_count) < 0:
            raise AccumulationError(
                f"token_count={short_repr(token_count)} must be a non-negative int; pass the number of target tokens summed"
            )
        loss = real(loss_sum, "loss_sum")
        gradient = float_vector(gradient_sum, "gradient_sum")
        self._check_width(gradient.size, "gradient_sum")
        if int(token_count) == 0 and (loss != 0.0 or gradient.any()):
            raise AccumulationError("token_count=0 but the sums are not zero; a piece without tokens must carry zero sums")
        self._apply(loss, gradient, int(token_count))

    def merge(self, other: TokenMeanAccumulator | TokenSums) -> None:
        """Add *other*'s raw sums to this one (never its mean): another accumulator, or a `TokenSums`."""
        if isinstance(other, TokenSums):
            self.add_sums(other.loss_sum, other.token_count, other.gradient_sum)
            return
        if not isinstance(other, TokenMeanAccumulator):
            raise AccumulationError(
                f"other={short_repr(other)} is not a TokenMeanAccumulator or TokenSums; wrap raw sums as TokenSums"
            )
        self._check_width(other.gradient_width, "other accumulator")
        self._apply(other._loss_sum, other._gradient_sums, other._token_count)

    def add(self, piece: TokenSums | TokenContribution | TokenMeanAccumulator) -> None:
        """Add one piece of any kind: `TokenSums`, a `TokenContribution` or another accumulator."""
        if isinstance(piece, (TokenSums, TokenMeanAccumulator)):
            self.merge(piece)
        elif isinstance(piece, TokenContribution):
            self.add_token(piece)
        else:
            raise AccumulationError(
                f"piece={piece!r} is not TokenSums, TokenContribution or TokenMeanAccumulator; wrap raw sums as TokenSums"
            )

    @property
    def sums(self) -> TokenSums:
        """The raw sums so far, as one `TokenSums` (a copy)."""
        return TokenSums(self._loss_sum, self._token_count, self._gradient_sums.copy())

    def finish(self) -> TokenMean:
        """Divide the raw sums once by the token count; an empty accumulator is an error."""
        if self._token_count == 0:
            raise AccumulationError("cannot finish an empty accumulator: token_count=0; add at least one token first")
        mean = self.sums.mean()
        mean.mean_gradient.flags.writeable = False
        return mean

    def _check_width(self, width: int, what: str) -> None:
        if width != self.gradient_width:
            raise AccumulationError(
                f"{what} has gradient width {width}, but this accumulator has width "
                f"{self.gradient_width}; every contribution must have the same number of coordinates"
            )

    def _apply(self, loss: float, gradient: FloatArray, count: int) -> None:
        # preflight everything, then commit: a failure leaves every field unchanged
        next_loss = self._loss_sum + loss
        if not math.isfinite(next_loss):
            raise AccumulationError(
                f"loss sum would become {next_loss!r} (not finite); nothing was added. "
                "Scale the loss or accumulate in smaller pieces"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            next_gradient = self._gradient_sums + gradient
        bad = ~np.isfinite(next_gradient)
        if bad.any():
            at = int(np.argmax(bad))
            raise AccumulationError(
                f"gradient sum coordinate {at} would become {float(next_gradient[at])!r} (not finite); "
                "nothing was added. Scale the gradients or accumulate in smaller pieces"
            )
        self._commit(next_loss, next_gradient, self._token_count + count)

    def _commit(self, loss: float, gradient: FloatArray, count: int) -> None:
        self._gradient_sums[...] = gradient  # in place: the allocation is kept
        self._loss_sum = loss
        self._token_count = count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenMeanAccumulator):
            return NotImplemented
        return (
            self._token_count == other._token_count
            and self._loss_sum == other._loss_sum
            and np.array_equal(self._gradient_sums, other._gradient_sums)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"TokenMeanAccumulator(gradient_width={self.gradient_width}, token_count={self._token_count}, "
            f"loss_sum={self._loss_sum!r})"
        )


def accumulated(contributions: Any, gradient_width: int | None = None) -> TokenMeanAccumulator:
    """A fresh accumulator with *contributions* added left to right (the chapter's order).

    *gradient_width* defaults to the first contribution's width.

    >>> accumulated([TokenContribution(1.0, [2.0]), TokenContribution(2.0, [4.0])]).loss_sum
    3.0
    """
    items = list(contributions)
    if gradient_width is None:
        if not items:
            raise AccumulationError("contributions=[] is empty; pass gradient_width or at least one contribution")
        first = items[0]
        if not isinstance(first, TokenContribution):
            raise AccumulationError(f"contributions[0]={first!r} is not a TokenContribution")
        gradient_width = first.gradient_width
    accumulator = TokenMeanAccumulator(gradient_width)
    for item in items:
        accumulator.add_token(item)
    return accumulator


def _width(piece: Any) -> int:
    if isinstance(piece, TokenSums):
        return int(np.size(piece.gradient_sum))
    if isinstance(piece, (TokenContribution, TokenMeanAccumulator)):
        return piece.gradient_width
    raise AccumulationError(
        f"piece={piece!r} is not TokenSums, TokenContribution or TokenMeanAccumulator; wrap raw sums as TokenSums"
    )


def token_mean(pieces: Iterable[TokenSums | TokenContribution | TokenMeanAccumulator]) -> TokenMean:
    """Fold a stream of raw-sum pieces into one token mean: add raw sums, divide once.

    Pieces are `TokenSums` (the main path: a micro-batch's, worker's or rank's
    sums), single `TokenContribution`s, or accumulators, added left to right.
    The stream is consumed lazily; its first piece sizes the gradient.

    >>> token_mean([TokenSums(1.75, 4, np.array([3.5, 6.25])), TokenSums(6.125, 6, np.array([12.25, 5.875]))]).mean_loss
    0.7875
    >>> token_mean([TokenContribution(1.0, [2.0]), TokenContribution(2.0, [4.0])]).mean_loss
    1.5
    """
    if not isinstance(pieces, Iterable) or isinstance(pieces, (str, bytes)):  # type: ignore[unreachable]
        raise AccumulationError(f"pieces={pieces!r} is not an iterable of TokenSums; pass a list or a generator of pieces")
    head, stream = spy(pieces)
    if not head:
        raise AccumulationError("pieces is empty; there is nothing to average (pass at least one piece with tokens)")
    accumulator = TokenMeanAccumulator(_width(head[0]))
    per_source: dict[int, TokenSums] | None = None
    for piece in stream:
        accumulator.add(piece)
        if isinstance(piece, TokenSums) and piece.sources is not None:  # a mixture's: kept per source too
            per_source = merge_sources(per_source, piece.sources)
    mean = accumulator.finish()
    if per_source is None:
        return mean
    return replace(mean, sources={s: p.mean() for s, p in per_source.items() if p.token_count})
