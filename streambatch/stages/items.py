"""The one seam between the ordering stages and the rest: a sequence of training items.

`chunk`, `share`, `split_rows` and `materialize` take any `Items`: the windows of
`sb.windows` (the chapter's mode), packed rows, or a mixture's items.  An
`Items` is sized and sliceable, and its `view` is what a chunk is: a contiguous
run of items tagged with its global batch index.  Gathering a view into a batch
is the item type's own `materialize_view`; `Windows` keeps its fast path in
`streambatch.stages.materialize`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Items(Protocol):
    """What the chunk, share and materialize stages need of a sequence of items."""

    def __len__(self) -> int: ...

    def __getitem__(self, item: Any) -> Any: ...

    @property
    def batch_index(self) -> int | None:
        """The global batch this view is (None for a whole sequence)."""
        ...

    def view(self, lo: int, hi: int, *, batch_index: int | None = None) -> Items:
        """Items ``[lo, hi)`` as one chunk, tagged with *batch_index*."""
        ...
