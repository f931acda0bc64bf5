"""Tests for the item protocol (`streambatch.items.protocol`): what the stages and façades read of every kind.

Windows, packed rows and mixtures of either are `Items` at run time (``isinstance``), have every member of
`EpochItems` (mypy checks the same in `streambatch.config`), word their messages through one `ItemWords`
value each, and an epoch's items are ``epoch.items`` (``epoch.windows`` warns, for one release).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import OutOfRangeError
from streambatch.items.mix.mixture import mix
from streambatch.items.protocol import EpochItems, Items, OrderableItems, orders_by_plan
from streambatch.order.protocol import ItemWords, Orderable

DOCS = [sb.Document(f"d{i}", "train", list(range(i, i + 9 + 3 * i))) for i in range(4)]
OTHER = [sb.Document(f"o{i}", "train", list(range(100 + i, 110 + 2 * i))) for i in range(3)]


def kinds() -> dict[str, Any]:
    """One whole sequence of every item kind."""
    windows = sb.windows(DOCS, context_length=3)
    rows = sb.pack(DOCS, context_length=4)
    return {
        "windows": windows,
        "rows": rows,
        "mixture": mix([windows, sb.windows(OTHER, context_length=3)], [1, 1], seed=3),
        "packed mixture": mix([rows, sb.pack(OTHER, context_length=4)], [2, 1], seed=3),
    }


def members(protocol: type) -> list[str]:
    """The members *protocol* declares (its own and its bases' up to `Items`), dunders of the sequence included."""
    names = {"__len__", "__getitem__"}
    for cls in protocol.__mro__:
        if cls in (Items, EpochItems):
            names |= {n for n in vars(cls) if not n.startswith("_")}
    return sorted(names)


@pytest.mark.parametrize("name", ["windows", "rows", "mixture", "packed mixture"])
def test_every_kind_is_items_and_has_every_member_the_facades_read(name: str) -> None:
    """``isinstance(x, Items)`` for a whole sequence, a slice, a shuffled one and a chunk of it; each member of
    `EpochItems` is on the kind (looked up without running it)."""
    whole = kinds()[name]
    chunk = next(iter(sb.chunk(whole, 2)))
    views = [whole, whole[1:3], chunk]
    if not name.endswith("mixture"):
        views.append(sb.shuffle(whole, 5))
    for items in views:
        assert isinstance(items, Items), type(items)
    assert len(members(EpochItems)) >= 25
    for member in members(EpochItems):
        assert inspect.getattr_static(type(whole), member, None) is not None, (name, member)
    assert isinstance(whole.words, ItemWords)
    assert whole.packed is name.endswith(("rows", "packed mixture"))


@pytest.mark.parametrize("name", ["windows", "rows", "mixture", "packed mixture"])
def test_a_plan_orders_windows_and_rows_and_never_a_mixture(name: str) -> None:
    """`orders_by_plan` (what lets `Epoch.order` hand its items to shuffle and plan_file, typed) holds for windows
    and packed rows, which have every member of `Orderable`, and not for a mixture, which sb.shuffle refuses."""
    whole = kinds()[name]
    ordered = not name.endswith("mixture")
    assert orders_by_plan(whole) is ordered
    wanted = {n for cls in OrderableItems.__mro__ if cls is Orderable for n in vars(cls) if not n.startswith("_")}
    assert len(wanted) >= 14
    assert all(inspect.getattr_static(type(whole), n, None) is not None for n in wanted) is ordered
    if ordered:
        assert list(sb.Epoch(whole, batch_size=3, seed=4).order) == list(sb.shuffle(whole, 4))
    else:
        with pytest.raises(sb.ConfigError, match="a mixture orders itself"):
            sb.shuffle(whole, 4)
        assert sb.Epoch(whole, batch_size=3, seed=None).order is whole  # its own order, no plan made


def test_what_is_not_items_is_refused() -> None:
    """A plain list, a string and a store are not items."""
    for other in ([1, 2, 3], "abc", sb.DocumentStore.from_documents(DOCS)):
        assert not isinstance(other, Items)


def test_each_kind_words_its_own_messages() -> None:
    """The façade messages come from the kind's one `ItemWords` value: another seed, pack=True, skip_untrained."""
    found = kinds()
    shuffled = sb.shuffle(found["windows"], 5)
    with pytest.raises(sb.ConfigError) as err:
        sb.Epoch(shuffled, batch_size=2, seed=6)
    assert str(err.value) == f"seed=6 but {shuffled.words.seed_taken.format(seed=5)}"
    with pytest.raises(sb.ConfigError, match="pack=True but the mixture passed blends windows"):
        sb.Epoch(found["mixture"], batch_size=2, pack=True)
    with pytest.raises(sb.ConfigError) as err:
        sb.Epoch(found["rows"], batch_size=2, seed=1, skip_untrained=True)
    assert str(err.value) == f"skip_untrained=True but {found['rows'].words.keeps_all}"
    assert {k.words.item for k in found.values()} == {"window", "packed row", "item"}
    few = found["rows"][:2]
    with pytest.raises(OutOfRangeError, match=f"out of range for {len(few)} rows"):
        few[7]


def test_epoch_items_is_typed_and_windows_is_its_deprecated_alias() -> None:
    """``epoch.items`` is what the epoch reads; ``epoch.windows`` and ``run.windows`` give the same object with a
    DeprecationWarning naming the new name."""
    epoch = sb.Epoch(DOCS, context_length=3, batch_size=2, seed=4)
    run = sb.Run(DOCS, context_length=3, batch_size=2, seed=4, epochs=2)
    assert isinstance(epoch.items, Items)
    assert len(epoch.items) == epoch.item_count
    with pytest.warns(DeprecationWarning, match=r"Epoch\.windows is deprecated; use Epoch\.items"):
        assert epoch.windows is epoch.items
    with pytest.warns(DeprecationWarning, match=r"Run\.windows is deprecated; use Run\.items"):
        assert run.windows is run.items
    assert run.items.fingerprint == epoch.items.fingerprint
