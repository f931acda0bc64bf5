"""Mixtures weighted by what trains: ``mix(..., weight_by="targets")`` makes the weights shares of counted targets.

Tijdeman's rule gives each source a share of the *items*.  Items of different
sources hold different numbers of counted targets (a masked SFT window trains
only its answer), so equal item shares are not equal shares of what trains.
With ``weight_by="targets"`` each source ``s`` of ``N_s`` items holding ``T_s``
counted targets per source epoch (mean ``t_s = T_s / N_s`` per item) is given the
item weight ``v_s ∝ w_s / t_s``, exactly (`item_weights`), and the order is
Tijdeman's over those: the plan, the resume in O(1) and the checks are the same.

The bound (tested at every prefix on random mixtures of masked and unmasked
stores): after any ``n`` items, with ``c_s(n)`` items of source ``s`` and
``R_s(n)`` their counted targets, ``R(n) = Σ R_r(n)``,

    |R_s(n) − w_s R(n)| ≤ B_s + w_s Σ_r B_r,   B_s = (1 − 1/(2k−2)) t_s + D_s

where ``D_s`` is the drift of source ``s``'s own order: the largest
``|S_s(j) − j t_s|`` over its first ``j`` items in the mixture (``S_s(j)`` their
counted targets; below ``T_s``, and 0 at every whole source epoch).  The first
term is Tijdeman's item bound times the mean item, the second how unevenly a
source's shuffled items carry targets.  Over whole source epochs the targets are
exact: ``R_s = c_s t_s``.  When the exact integer weights exceed the C kernel's
limit, they are rounded to a common denominator of ``2**100`` (each item share
moves by less than ``2**-100``: ``n 2**-100`` more items, under ``2**-52`` for any
``n < 2**48``).

`source_targets` (each source's counted targets in a view) is what ``inspect``,
the ``epoch`` note and ``audit`` show, whatever the weighting.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import gcd
from typing import Any

from ...errors import ConfigError
from .order import KERNEL_LIMIT, check_weights, integer_weights
from .space import source_targets

__all__ = ["WEIGHT_BY", "item_weights", "source_targets"]

WEIGHT_BY = ("items", "targets")
_ROUND = 1 << 100


def item_weights(parts: Sequence[Any], weights: Any, weight_by: str, names: Any = None) -> tuple[int, ...]:
    """The exact integer item weights Tijdeman's order runs on: *weights* as they are (``"items"``), or as shares of
    counted targets (``"targets"``: each divided by its part's mean counted targets per item).

    >>> import streambatch as sb
    >>> sft = sb.windows([sb.Document("s", "train", range(9), loss_mask=[0] * 5 + [1] * 4)], context_length=2)
    >>> web = sb.windows([sb.Document("w", "train", range(9))], context_length=2)
    >>> item_weights([sft, web], [1, 1], "items", ["sft", "web"]), item_weights([sft, web], [1, 1], "targets", ["sft", "web"])
    ((1, 1), (2, 1))
    """
    if weight_by not in WEIGHT_BY:
        raise ConfigError(
            f"weight_by={weight_by!r} must be 'items' (weights are shares of items) or 'targets' (of counted targets)"
        )
    if weight_by == "items":
        return integer_weights(weights)
    ratios = check_weights(weights)
    if len(ratios) != len(parts):
        return integer_weights(weights)  # the caller refuses the count, naming both
    exact = []
    for s, (part, (numerator, denominator)) in enumerate(zip(parts, ratios, strict=True)):
        targets = int(part.counted_targets())
        if targets == 0:
            name = f"source {names[s]!r}" if isinstance(names, Sequence) and len(names) == len(parts) else f"parts[{s}]"
            raise ConfigError(
                f"{name} holds no counted target, so it can have no share of them; leave it out, or "
                "weight by items (weight_by='items')"
            )
        exact.append(Fraction(numerator * len(part), denominator * targets))
    ints = integer_weights(exact)
    if sum(ints) < KERNEL_LIMIT:
        return ints
    total = sum(exact)
    rounded = [max(1, round(value / total * _ROUND)) for value in exact]
    factor = gcd(*rounded)
    return tuple(value // factor for value in rounded)
