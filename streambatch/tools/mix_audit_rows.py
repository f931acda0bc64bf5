"""What ``audit`` proves of a mixture of packed rows beyond a mixture's own claims (`streambatch.tools.mix_report`).

`check_packed_rows`: every row of a packed mixture's batch holds exactly what its
own source's packing puts there, read apart from the batch's gather (the packed
mode's numpy rule, `streambatch.items.pack.rows.gather_rows`, per source): tokens,
segment and position ids, the loss mask (False at every padding position and, under
a loss mask, at every masked target), the batch's ``target_count`` counts the mask
and ``cu_seqlens`` the real positions.
`check_source_targets`: inside each source epoch every row of the source comes
once (the order check of `mix_report`), so the epoch's real targets are all of
its source's targets; a whole source epoch's counted targets must sum to the source's
(every counted target once per source epoch, under ``skip_untrained`` too).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..batch.minibatch import MiniBatch, present
from ..items.pack.rows import gather_rows

__all__ = ["check_packed_rows", "check_source_targets"]


def check_packed_rows(packed: MiniBatch, failures: dict[str, str]) -> npt.NDArray[np.int64]:
    """Check every row against its source's packing (failures by name); return each row's real targets."""
    batch: Any = packed  # a packed mixture's batch: every packed column and sources are set
    mask = batch.loss_mask
    for s in present(batch.sources):
        rows = batch.sources == s
        numbers = batch.positions[rows].astype(np.int64)
        want = gather_rows(batch.spaces[s], numbers)
        got = (batch.inputs[rows], batch.targets[rows], batch.segment_ids[rows], batch.position_ids[rows], mask[rows])
        expected = (want.inputs, want.targets, want.segment_ids, want.position_ids, _masked(batch.spaces[s], numbers, want))
        if not all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)):
            failures.setdefault("tokens", f"batch {batch.index}: rows of source {s} are not their packed rows")
    real = batch.segment_ids != -1
    if mask[~real].any():
        failures.setdefault("padding", f"batch {batch.index}: a padding position is not masked out")
    if batch.target_count != int(np.count_nonzero(mask)):
        failures.setdefault("padding", f"batch {batch.index}: target_count {batch.target_count} counts padding")
    lengths = np.diff(batch.cu_seqlens.astype(np.int64))
    if int(lengths[~batch.sequence_is_pad].sum()) != int(np.count_nonzero(real)) or int(lengths.sum()) != mask.size:
        failures.setdefault("padding", f"batch {batch.index}: cu_seqlens do not cover the rows, real targets apart")
    found: npt.NDArray[np.int64] = np.count_nonzero(mask, axis=1).astype(np.int64)
    return found


def _masked(space: Any, numbers: npt.NDArray[np.int64], want: Any) -> npt.NDArray[np.bool_]:
    """The loss mask rows *numbers* of *space* must carry: their real positions, and at each the store's own mask bit
    (read here from the packing's segments, apart from the gather's)."""
    mask = np.array(want.loss_mask, dtype=np.bool_)
    store = space.store
    if not store.has_loss_mask:
        return mask
    seg = space.packing.segments(numbers)
    r, c = np.nonzero(mask)
    k = seg.offsets[r] + want.segment_ids[r, c]
    mask[r, c] = store.mask_at(store.starts[seg.documents[k]] + seg.starts[k] + 1 + want.position_ids[r, c])
    return mask


def check_source_targets(
    mixture: Any, sources: npt.NDArray[np.uint8], targets: npt.NDArray[Any], failures: dict[str, str]
) -> None:
    """Each whole source epoch holds every target of its source once: its rows' real targets sum to the packing's."""
    for s, part in enumerate(mixture.parts):
        got = targets[sources == s].astype(np.int64)
        size, total = len(part), part.counted_targets()  # every counted target of the source (mask bits alone)
        for e in range(got.size // size):
            held = int(got[e * size : (e + 1) * size].sum())
            if held != total:
                failures.setdefault("targets", f"source {s} epoch {e} holds {held} counted targets, its packing {total}")
