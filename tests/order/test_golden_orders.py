"""Golden digests of the orders (issue 43): the first 10^6 items of the window order, the packed order and a
mixture's order for fixed seeds, pinned to the versions of the plan formats.

Any change of order must be deliberate: bump the plan format's version (`streambatch.order.plan.VERSION`,
`streambatch.items.pack.pack_file.VERSION`, `streambatch.items.mix.plan_file.VERSION`) and record the new digests
below under it (`python -m tests.test_golden_orders` prints them).  A changed digest under an unchanged version
fails, and so does a version with no recorded digests.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch.items.mix import plan_file as mix_plan_file
from streambatch.items.pack import pack_file
from streambatch.order import plan

ITEMS = 10**6
VERSIONS = (plan.VERSION, pack_file.VERSION, mix_plan_file.VERSION)
GOLDEN: dict[tuple[int, int, int], dict[str, str]] = {
    (2, 1, 1): {
        "window": "d53853e9be09e69d7d9bfb2adb726bf4",
        "packed": "186eb7b45af1d675dda8c170d9d02ac7",
        "mixture": "55dca3482b56e31083959ff053a346af",
    },
}


def _documents(seed: int, count: int, vocab: int = 50_000) -> list[sb.Document]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, count)
    tokens = rng.integers(0, vocab, int(lengths.sum())).astype(np.uint32)
    ends = np.cumsum(lengths)
    return [sb.Document(f"d{seed}-{i}", "train", tokens[e - n : e]) for i, (e, n) in enumerate(zip(ends, lengths, strict=True))]


def _digest(*arrays: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return digest.hexdigest()


def orders() -> dict[str, str]:
    """The three digests, computed from the public stages."""
    docs = _documents(1, 7_000)
    windows = sb.shuffle(sb.windows(docs, context_length=1, stride=1), seed=7)
    assert len(windows) >= ITEMS
    found = {"window": _digest(windows.plan_values()[:ITEMS])}
    rows = sb.pack(_documents(2, 16_000), context_length=2)
    assert len(rows) >= ITEMS
    shuffled = sb.shuffle(rows, seed=11)
    picked = shuffled.plan_values()[:ITEMS]
    found["packed"] = _digest(picked, *rows.packing.segments(picked[:50_000]))  # the order, and the rows' contents
    parts = [sb.windows(_documents(3 + s, 1_500), context_length=4, stride=3) for s in range(3)]
    mixture = sb.mix(parts, [0.5, 0.3, 0.2], seed=13, length=ITEMS)
    sources, numbers = mixture.space.numbers(0, ITEMS)
    found["mixture"] = _digest(sources, numbers)
    return found


def test_the_orders_are_the_recorded_ones() -> None:
    if VERSIONS not in GOLDEN:
        pytest.fail(f"no golden digests for plan format versions {VERSIONS}; record them (python -m tests.test_golden_orders)")
    assert orders() == GOLDEN[VERSIONS]


if __name__ == "__main__":
    print(VERSIONS, orders())
