"""What the ordering stages need of a sequence of items: a seeded order and a plan to hold it.

`shuffle`, `plan_file` and the plan checks order any item kind that implements
`Orderable` (the windows of ``sb.windows`` and packed rows both do, through
`streambatch.items.protocol.PlannedItems`); they never ask which kind they hold,
so this folder sits below the kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt


class ShuffleOrder(NamedTuple):
    """A seeded order: the seed and the SplitMix64 state after its Fisher–Yates shuffle."""

    seed: int
    state_after: int


@dataclass(frozen=True)
class ItemWords:
    """What messages call one item kind: one small value per kind (``items.words``), never a constant per message.

    The façade messages (``seed_taken``, ``not_packed``, ``keeps_all``, ``passed``) are said of items passed to
    `streambatch.Epoch` or `streambatch.Run`; ``kind``, ``call`` and ``empty`` of a mixture's parts.
    """

    item: str = "item"  # one item ("window", "packed row")
    items: str = "items"  # several, in an index message ("windows", "rows")
    kind: str = "items"  # the kind, with the call that makes it ("windows (sb.windows)")
    call: str = ""  # the call that makes them whole, in the natural order
    empty: str = "items"  # what a mixture part without any is said to have none of
    passed: tuple[str, str, str] = ("the windows passed", "have", "are")  # what they are called, and their verbs
    seed_taken: str = "the windows passed are already shuffled with seed {seed}"  # given another seed
    not_packed: str = "the source passed is windows; pass the source itself, or sb.pack(source, ...)"  # given pack=True
    keeps_all: str = (  # given skip_untrained=True
        "the windows passed keep every window; pass the source itself, or build them with skip_untrained=True"
    )
    orders_itself: str | None = None  # a kind whose order is its own (a mixture): why sb.shuffle refuses it


_Self = TypeVar("_Self")


class Orderable(Protocol):
    """A whole sequence of numbered items that a seeded plan can order (every member the order stages use)."""

    @property
    def words(self) -> ItemWords:
        """What messages call the items ("window", "packed row")."""
        ...

    def __len__(self) -> int: ...

    @property
    def space(self) -> Any:
        """What every view of the sequence shares (its plan entries' dtype: ``space.plan_dtype(count)``)."""
        ...

    @property
    def is_sequential(self) -> bool:
        """True when no plan backs the items (natural order)."""
        ...

    @property
    def is_whole(self) -> bool:
        """True for every item of the space in the natural order (what a plan file orders)."""
        ...

    @property
    def whole_count(self) -> int:
        """Items of the whole space."""
        ...

    @property
    def plan(self) -> npt.NDArray[Any] | None:
        """The plan behind the items (None in the natural order)."""
        ...

    @property
    def untrained(self) -> Any:
        """The report of ``skip_untrained`` (its kept ``entries`` and ``dropped`` count), or None."""
        ...

    def plan_values(self) -> npt.NDArray[Any]:
        """The plan entries of the items, fresh in the natural order (a view of the plan otherwise)."""
        ...

    def with_plan(self: _Self, plan: npt.NDArray[Any], order: ShuffleOrder | None) -> _Self:
        """The same items in the order of *plan*."""
        ...

    def unordered(self: _Self) -> _Self:
        """Every (kept) item in the natural order."""
        ...

    def numbers(self) -> npt.NDArray[np.int64]:
        """Each item's number (its place in the natural order)."""
        ...

    def plan_key_fields(self) -> dict[str, Any]:
        """What names a plan file of the items, besides the seed."""
        ...

    def fill_plan(self, values: npt.NDArray[Any]) -> None:
        """Every item's plan entry, in the natural order, into *values*."""
        ...

    def plan_entries(self, block: npt.NDArray[np.integer], total: int) -> npt.NDArray[np.int64]:
        """Each plan entry's item number, -1 where it names no item."""
        ...


OrderedT = TypeVar("OrderedT", bound=Orderable)
