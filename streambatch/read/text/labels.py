"""Hugging Face ``labels`` read as Hugging Face means them, and the rule when a row carries more than one mask.

``labels`` are aligned with ``input_ids`` (HF's convention: the model shifts):
``-100`` is not trained, and any other label must equal the input id at the same
position, else the row is refused naming the first disagreeing position.  Labels
already shifted by one (``labels[i] == input_ids[i + 1]``, a common layout) are
recognised and refused with the fix; with ``labels_shifted`` they are read that
way: ``labels[i]`` is the target at position ``i + 1``, so the last label must be
``-100``.  A row with ``labels`` and a ``loss_mask`` (or ``assistant_masks``)
must have them agree at every target (position 0 is never one); the mask is then
that one mask (`agreed`).

>>> mask_of_labels(np.array([-100, 6, 7]), np.array([5, 6, 7]), np.array([3]), str, False).tolist()
[False, True, True]
>>> mask_of_labels(np.array([6, 7, -100]), np.array([5, 6, 7]), np.array([3]), str, True).tolist()
[False, True, True]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DataError
from ...model.mask import check_loss_mask, labels_mask

BoolArray = npt.NDArray[np.bool_]
MASK_KEYS = ("labels", "loss_mask", "assistant_masks")  # the precedence, when several agree: labels first
_FIX = "pass --labels-shifted (labels_shifted=True) to read them so, or write labels aligned with input_ids"


def row_mask(row: Mapping[str, Any], tokens: npt.NDArray[np.integer], where: str, shifted: bool) -> BoolArray | None:
    """The loss mask a token row carries (``labels``, ``loss_mask``, ``assistant_masks``; several must agree), or None.

    >>> row_mask({"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, np.array([1, 2, 3]), "row 0", False).tolist()
    [False, True, True]
    """
    present = [k for k in MASK_KEYS if row.get(k) is not None]
    if not present:
        return None
    lengths = np.array([tokens.size], dtype=np.int64)
    masks = {}
    for key in present:
        if key == "labels":
            labels_mask(row[key], tokens.size, where)  # a flat int sequence, one per input id
            masks[key] = mask_of_labels(np.asarray(row[key]), tokens, lengths, lambda _: where, shifted)
        else:
            masks[key] = check_loss_mask(row[key], tokens.size, f"{where}: {key}")
    return agreed(masks, lengths, lambda _: where)


def mask_of_labels(
    labels: npt.NDArray[np.integer], tokens: npt.NDArray[np.integer], lengths: npt.NDArray[np.integer],
    label: Callable[[int], str], shifted: bool,
) -> BoolArray:  # fmt: skip
    """The flat loss mask of documents' flat *labels* (one per token, already of the right count), checked against
    their flat *tokens*; errors name document *k* by ``label(k)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    values = np.asarray(labels, dtype=np.int64)
    ids = np.asarray(tokens, dtype=np.int64)
    trained = values != -100
    if not shifted:
        bad = trained & (values != ids)
        if bad.any():
            at = int(np.argmax(bad))
            doc = int(np.searchsorted(ends, at, side="right"))
            lo, hi = int(starts[doc]), int(ends[doc])
            pos = at - lo
            if _looks_shifted(values[lo:hi], ids[lo:hi]):
                raise DataError(
                    f"{label(doc)}: labels look shifted by one (labels[i] == input_ids[i + 1], e.g. labels[{pos}]="
                    f"{int(values[at])} == input_ids[{pos + 1}]); Hugging Face's labels are aligned with input_ids; {_FIX}"
                )
            raise DataError(
                f"{label(doc)}: labels[{pos}]={int(values[at])} but input_ids[{pos}]={int(ids[at])}; a label that is not "
                "-100 must equal the input id at the same position (Hugging Face's convention: the model shifts); fix "
                "the labels, or give loss_mask instead"
            )
        aligned: BoolArray = trained.copy()
        aligned[starts[lengths > 0]] = False
        return aligned
    last = np.zeros(values.size, dtype=np.bool_)
    last[ends[lengths > 0] - 1] = True
    following = np.append(ids[1:], -1)
    bad = trained & (last | (values != following))
    if bad.any():
        at = int(np.argmax(bad))
        doc = int(np.searchsorted(ends, at, side="right"))
        pos = at - int(starts[doc])
        why = (
            "the last label has no next input id (it must be -100)" if last[at] else f"input_ids[{pos + 1}]={int(following[at])}"
        )
        raise DataError(
            f"{label(doc)}: labels[{pos}]={int(values[at])} read as shifted (--labels-shifted), but {why}; shifted labels "
            "hold at i the input id at i + 1, or -100; drop --labels-shifted if they are aligned with input_ids"
        )
    mask = np.zeros(values.size, dtype=np.bool_)
    mask[1:] = trained[:-1]
    mask[starts[lengths > 0]] = False
    return mask


def _looks_shifted(values: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]) -> bool:
    """Whether one document's labels all agree with the next input id (the last one -100)."""
    trained = values != -100
    if not trained.any() or trained[-1]:
        return False
    return bool(np.all(values[:-1][trained[:-1]] == ids[1:][trained[:-1]]))


def agreed(masks: Mapping[str, BoolArray], lengths: npt.NDArray[np.integer], label: Callable[[int], str]) -> BoolArray:
    """The one loss mask of documents that carry several (by key, in `MASK_KEYS` order): they must agree at every
    target, else the first disagreement is refused by document and position.

    >>> agreed({"labels": np.array([0, 1, 1], bool), "loss_mask": np.array([1, 1, 1], bool)}, np.array([3]), str).tolist()
    [False, True, True]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = (ends - lengths)[lengths > 0]
    keys = [k for k in MASK_KEYS if k in masks]
    first: BoolArray = masks[keys[0]].copy()
    first[starts] = False
    for key in keys[1:]:
        other = masks[key].copy()
        other[starts] = False
        if not np.array_equal(first, other):
            at = int(np.argmax(first != other))
            doc = int(np.searchsorted(ends, at, side="right"))
            pos = at - int(ends[doc] - lengths[doc])
            raise DataError(
                f"{label(doc)}: {keys[0]} and {key} disagree at position {pos} ({keys[0]} "
                f"{'trains' if first[at] else 'does not train'} it, {key} "
                f"{'does' if other[at] else 'does not'}); give one mask, or make them agree"
            )
    return first
