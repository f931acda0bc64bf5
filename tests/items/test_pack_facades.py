"""Packed mode through the façades: Epoch(pack=True), Run(pack=True), plan files and resumable state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch.errors import StateError, StoreError
from streambatch.order.plan import plan_key


def _docs(count: int = 30, T: int = 6) -> list[sb.Document]:
    rng = np.random.default_rng(8)
    return [sb.Document(f"d{i}", "train", rng.integers(0, 999, int(rng.integers(0, 4 * T)))) for i in range(count)]


def test_epoch_pack_is_the_stages_chained_by_hand() -> None:
    """Epoch(pack=True) yields exactly materialize(chunk(shuffle(pack(...), seed), B))."""
    docs = _docs()
    epoch = sb.Epoch(docs, context_length=6, batch_size=4, seed=9, pack=True)
    by_hand = list(sb.materialize(sb.chunk(sb.shuffle(sb.pack(docs, context_length=6), 9), 4)))
    assert epoch.pack
    assert list(epoch) == by_hand
    assert epoch.item_count == len(epoch.items) == epoch.items.report.rows
    assert sum(b.target_count for b in epoch) == epoch.items.report.targets
    assert epoch.batch(1) == by_hand[1]
    assert epoch.reseeded(9) == epoch
    assert list(sb.Epoch(epoch.items, batch_size=4, seed=9)) == by_hand  # Rows as the source: packed mode


def test_window_mode_is_unchanged() -> None:
    """Without pack=True batches are plain MiniBatches and the run state has no mode key."""
    docs = _docs()
    batch = next(iter(sb.Epoch(docs, context_length=6, batch_size=4, seed=9)))
    assert type(batch) is sb.MiniBatch
    assert batch.token_count == batch.targets.size
    assert "mode" not in sb.Run(docs, context_length=6, batch_size=4, seed=9).state_dict()


def test_run_resumes_and_refuses_the_other_mode() -> None:
    """A packed run's state resumes a packed run; window and packed states refuse each other."""
    docs = _docs()
    run = sb.Run(docs, context_length=6, batch_size=4, seed=9, pack=True, epochs=2)
    handed = list(run)
    assert [(b.epoch, b.index) for b in handed][:2] == [(0, 0), (0, 1)]
    assert all(b.epoch in (0, 1) for b in handed)
    again = sb.Run(docs, context_length=6, batch_size=4, seed=9, pack=True, epochs=2)
    state = json.loads(json.dumps(again.state_dict((1, 2))))
    assert state["mode"] == "pack"
    resumed = sb.Run(docs, context_length=6, batch_size=4, seed=9, pack=True, epochs=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert rest == handed[run.batches_per_epoch + 2 :]
    assert handed[0] != handed[run.batches_per_epoch]  # epoch 1 has its own order
    window = sb.Run(docs, context_length=6, stride=6, batch_size=4, seed=9, epochs=2)
    with pytest.raises(StateError, match="mode='pack'"):
        window.load_state_dict(state)
    with pytest.raises(StateError, match="mode='window'"):
        resumed.load_state_dict(window.state_dict())
    assert resumed.position == (2, 0)  # a refused state changed nothing


def test_packed_plan_file_is_shared(tmp_path: Path) -> None:
    """plan_dir: one file per (corpus, T, algorithm, seed), mapped by every epoch; the same order as shuffle."""
    docs = _docs()
    first = sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True, plan_dir=tmp_path)
    second = sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True, plan_dir=tmp_path)
    assert first.order.plan_path == second.order.plan_path
    assert first.order.plan_path is not None
    assert list(first.order) == list(sb.shuffle(sb.pack(docs, context_length=6), 3))
    assert list(first) == list(sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True))
    key = plan_key(sb.pack(docs, context_length=6), 3)
    assert (key["mode"], key["algorithm"], key["rows"], key["context_length"]) == (
        "pack",
        "best-fit-decreasing/1",
        len(first.items),
        6,
    )
    windows_plan = sb.Epoch(docs, context_length=6, stride=6, batch_size=4, seed=3, plan_dir=tmp_path).order.plan_path
    assert windows_plan != first.order.plan_path
    Path(first.order.plan_path).write_bytes(Path(first.order.plan_path).read_bytes()[:-4])  # truncated
    with pytest.raises(StoreError, match="truncated"):
        list(sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True, plan_dir=tmp_path))


def test_packing_file_is_computed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan_dir keeps the packing too: computed by the first caller, then mapped; damaged files are refused."""
    from streambatch.items.pack import pack_file

    docs = _docs()
    calls: list[int] = []
    real = pack_file.pack_lengths

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_file, "pack_lengths", counting)
    first = sb.pack(docs, context_length=6, plan_dir=tmp_path)
    second = sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True, plan_dir=tmp_path)
    assert len(calls) == 1
    fresh = sb.pack(docs, context_length=6)
    assert first.report == second.items.report == fresh.report
    assert first.packing.offsets.tolist() == fresh.packing.offsets.tolist()
    assert first.packing.tails.tolist() == fresh.packing.tails.tolist()
    assert list(second) == list(sb.Epoch(docs, context_length=6, batch_size=4, seed=3, pack=True))
    sb.pack(docs, context_length=5, plan_dir=tmp_path)  # another T: another file
    assert len(calls) == 2
    assert len(list(tmp_path.glob("*.packing"))) == 2
    path = pack_file.packing_path(pack_file.packing_key(first.store, 6, "train"), tmp_path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(StoreError, match="truncated"):
        sb.pack(docs, context_length=6, plan_dir=tmp_path)
