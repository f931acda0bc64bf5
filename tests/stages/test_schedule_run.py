"""A batch-size schedule over a whole run: thresholds count the tokens consumed since the start of training.

The reference is one pass over the concatenated epochs (each in its own seeded order), written here without the
package's schedule code: before each batch, the tokens consumed so far (items x T) pick the last phase whose
threshold they reached; a batch never crosses an epoch's end (the final batch is short).  The run's batches, epoch
after epoch, must be exactly those, and its state's ``items`` the items consumed before each.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import StateError
from streambatch.order.splitmix import derive_seed
from streambatch.stages.materialize import materialize_one
from streambatch.stages.schedule import BatchSchedule, RunSteps

from ..strategies import documents


def reference(orders: list[Any], phases: list[tuple[int, int]], T: int) -> list[tuple[int, Any]]:
    """``(epoch, items)`` of every batch of one pass over the epochs' orders under global token thresholds."""
    out, consumed = [], 0
    for epoch, order in enumerate(orders):
        at = 0
        while at < len(order):
            size = [b for tokens, b in phases if consumed * T >= tokens][-1]
            width = min(size, len(order) - at)
            out.append((epoch, order.view(at, at + width)))
            at += width
            consumed += width
    return out


@st.composite
def schedules(draw: st.DrawFn, T: int, items: int, epochs: int) -> list[tuple[int, int]]:
    """Up to four phases whose thresholds fall anywhere in the run (and past it), some on epoch boundaries."""
    total_tokens = max(items * epochs * T, 1)
    count = draw(st.integers(0, 3))
    edges = [items * T * e for e in range(1, epochs + 1)]  # a threshold exactly at an epoch's start
    raw = draw(st.lists(st.one_of(st.integers(1, total_tokens + T), st.sampled_from(edges)), min_size=count, max_size=count))
    thresholds = sorted(set(raw))
    return [(0, draw(st.integers(1, 6)))] + [(t, draw(st.integers(1, 6))) for t in thresholds]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(docs=documents(max_docs=6), T=st.integers(1, 3), epochs=st.integers(1, 4), pack=st.booleans(), data=st.data())
def test_a_runs_batches_are_one_pass_over_its_epochs_under_global_thresholds(
    docs: list[sb.Document], T: int, epochs: int, pack: bool, data: Any
) -> None:
    items = sb.pack(docs, context_length=T) if pack else sb.windows(docs, context_length=T)
    if not len(items):
        return
    phases = data.draw(schedules(T, len(items), epochs))
    run = sb.Run(docs, context_length=T, batch_size=phases, seed=11, epochs=epochs, pack=pack)
    orders = [sb.shuffle(items, derive_seed(11, e)) for e in range(epochs)]
    expected = reference(orders, phases, T)
    got = list(run)
    assert [(b.epoch, b.width) for b in got] == [(e, len(v)) for e, v in expected]
    for batch, (_, view) in zip(got, expected, strict=True):
        whole = next(iter(sb.materialize([view])))
        assert np.array_equal(batch.inputs, whole.inputs)
        assert np.array_equal(batch.targets, whole.targets)
    # the step numbering, the per-epoch counts and the state's items agree with the same pass
    assert run.steps_stop() == len(expected)
    assert [run.batches_in(e) for e in range(epochs)] == [sum(1 for e2, _ in expected if e2 == e) for e in range(epochs)]
    consumed = [0, *itertools.accumulate(len(v) for _, v in expected)]
    for step in data.draw(st.lists(st.integers(0, len(expected)), max_size=5)):
        position = run.position_of(step) if step < len(expected) else (epochs, 0)
        assert step == len(expected) or run.step_of(*position) == step
        state = run.state_dict(position)
        if isinstance(run.batch_size, BatchSchedule):
            assert state["items"] == consumed[step]
        again = sb.Run(docs, context_length=T, batch_size=phases, seed=11, epochs=epochs, pack=pack)
        again.load_state_dict(state)
        rest = [(b.epoch, b.index, b.inputs.tobytes()) for b in again]
        assert rest == [(b.epoch, b.index, b.inputs.tobytes()) for b in got[step:]]
    # workers' strided shares of the global steps, across epoch boundaries
    share = list(run.iter_steps(1, step=2))
    assert [(b.epoch, b.index, b.inputs.tobytes()) for b in share] == [(b.epoch, b.index, b.inputs.tobytes()) for b in got[1::2]]


def test_the_schedule_goes_on_across_epochs_and_an_epoch_alone_starts_at_zero() -> None:
    docs = [sb.Document(f"d{i}", "train", np.arange(3 + 5 * i) % 41) for i in range(8)]  # 140 windows at T=3
    run = sb.Run(docs, context_length=3, batch_size="0:4 500:3 1000:5", seed=9, epochs=4)
    assert [run.batches_in(e) for e in range(4)] == [35, 45, 36, 28]
    assert run.epoch(1).batch_widths[6:8] == [4, 3]  # item 168 >= 500 / 3: the change inside epoch 1
    assert run.epoch(3).batch_widths == [5] * 28  # past every threshold: the last phase from the start
    alone = sb.Epoch(docs, context_length=3, batch_size="0:4 500:3 1000:5", seed=9)
    assert alone.batch_widths == run.epoch(0).batch_widths == [4] * 35  # an epoch alone starts at 0 consumed
    shifted = sb.Epoch(docs, context_length=3, batch_size=BatchSchedule.parse("0:4 500:3 1000:5").after(280), seed=9)
    assert shifted.batch_widths == run.epoch(2).batch_widths  # an explicit start: the run's epoch 2
    assert shifted.reseeded(3).batch_widths == shifted.batch_widths  # a reseed keeps the start
    assert run.step_of(2, 0) == 80
    assert run.position_of(80) == (2, 0)
    assert run.position_of(79) == (1, 44)
    state = run.state_dict((2, 18))
    assert state["items"] == 280 + 18 * 3
    with pytest.raises(StateError, match="items=280"):  # a state that counted the epoch alone (items 54) is refused
        run.load_state_dict({**state, "items": 280})
    assert run.position == (0, 0)


def test_run_steps_are_o_of_the_phases() -> None:
    """A 10^9-item epoch under a schedule whose last threshold falls in epoch 10^6: the layout holds a handful of
    marks, and any step's position is found at once."""
    T = 4096
    schedule = BatchSchedule.parse("0:768 250B:1536 4T:3072").bound(T)
    steps = RunSteps(schedule, 10**9)
    assert len(steps._marks) <= 5
    epoch = 4 * 10**12 // T // 10**9 + 3
    first = steps.first(epoch)
    assert steps.position(first + 7) == (epoch, 7)
    assert steps.count(epoch) == -(-(10**9) // 3072)
    assert steps.count(0) == steps._count_of(0)


def test_a_run_whose_epoch_zero_is_a_later_epoch_goes_on_from_it() -> None:
    """`Run.from_epoch(run.epoch(2))` (what `EpochDataset` and HF's `as_run` build): its epoch 0 is that epoch,
    and its epoch 1 the original run's epoch 3, the schedule going on from the epoch's own start."""
    docs = [sb.Document(f"d{i}", "train", np.arange(3 + 5 * i) % 41) for i in range(8)]
    run = sb.Run(docs, context_length=3, batch_size="0:4 500:3 1000:5", seed=9, epochs=4)
    later = sb.Run.from_epoch(run.epoch(1), epochs=2)
    assert [later.batches_in(e) for e in range(2)] == [run.batches_in(1), run.batches_in(2)]
    assert [b.width for b in later] == run.epoch(1).batch_widths + run.epoch(2).batch_widths
    assert later.state_dict((1, 0))["items"] == run.state_dict((2, 0))["items"] == 280


@pytest.mark.parametrize("kind", ["windows", "packed", "mixture"])
def test_a_schedules_phases_go_through_the_kinds_loop_as_batch_by_batch(kind: str) -> None:
    """`Batches.road` gathers each phase's run of equal widths on the kind's own loop: the same batches (tokens,
    provenance, numbers) as gathering each chunk alone, over the whole epoch and any stretch of it."""
    docs = [sb.Document(f"d{i}", "train", np.arange(3 + 5 * i) % 41) for i in range(8)]
    other = [sb.Document(f"o{i}", "train", np.arange(30 + i) % 17) for i in range(3)]

    def make(batch_size: object) -> sb.Run:
        if kind == "mixture":
            parts = [sb.windows(docs, context_length=3), sb.windows(other, context_length=3)]
            return sb.Run(sb.mix(parts, [2, 1], seed=4, length=90), batch_size=batch_size, seed=4, epochs=3)
        return sb.Run(docs, context_length=3, batch_size=batch_size, seed=4, epochs=3, pack=kind == "packed")

    n = make(2).item_count  # a change inside every epoch: tokens (items x T) at half of each
    run = make([(0, 2), (3 * (n // 2), 4), (3 * (n + n // 2), 3), (3 * (2 * n + n // 2), 5)])
    for e in range(3):
        chunks = run.epoch(e).chunks()
        alone = [materialize_one(c) for c in chunks]
        assert len({len(c) for c in chunks}) > 1  # several phases: not vacuous
        for lo, hi in [(0, len(chunks)), (1, len(chunks) - 1), (len(chunks) // 2, len(chunks))]:
            got = list(sb.materialize(chunks).road(range(lo, hi)))
            assert got == alone[lo:hi]
            assert [b.index for b in got] == list(range(lo, hi))
            assert list(sb.materialize(chunks[lo:hi])) == alone[lo:hi]
