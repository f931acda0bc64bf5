"""Tests for `streambatch.run`: a schedule of epochs whose position is the checkpoint."""

from __future__ import annotations

import copy
import inspect
import itertools
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
import streambatch.items.windows.windows as windows_module
from streambatch.errors import OutOfRangeError
from streambatch.order.splitmix import derive_seed
from streambatch.run import STATE_KEYS
from tests.strategies import configs, documents, seeds

DOCS = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]


def _docs(count: int = 12, seed: int = 5) -> list[sb.Document]:
    rng = np.random.default_rng(seed)
    return [sb.Document(f"d{i}", "train", rng.integers(0, 50, rng.integers(3, 20))) for i in range(count)]


def _key(batch: sb.MiniBatch) -> tuple[int, int, list[list[int]], list[int]]:
    return batch.epoch, batch.index, batch.inputs.tolist(), batch.window_numbers.tolist()


def _run(docs: Any = None, **kwargs: Any) -> sb.Run:
    arguments: dict[str, Any] = {"context_length": 3, "batch_size": 4, "seed": 9, "epochs": 3, **kwargs}
    return sb.Run(_docs() if docs is None else docs, **arguments)


# -- the schedule ------------------------------------------------------------------------


def test_epoch_zero_is_the_chapters_order() -> None:
    """Epoch 0 of run seed 7 is Epoch(seed=7) (the chapter's order); epoch e is derive_seed(7, e)'s order."""
    run = sb.Run(DOCS, context_length=2, batch_size=3, seed=7, epochs=3)
    batches = list(run)
    assert [(b.epoch, b.index) for b in batches] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert ["train-b@1", "train-a@1", "train-b@0", "train-a@0", "train-a@2"] == [
        str(p) for b in batches[:2] for p in b.provenance
    ]
    for e in range(3):
        expected = sb.Epoch(DOCS, context_length=2, batch_size=3, seed=derive_seed(7, e))
        assert [b.inputs.tolist() for b in expected] == [b.inputs.tolist() for b in batches if b.epoch == e]


def test_derive_seed_keeps_its_values_and_rejects_bad_input() -> None:
    """The derived seeds are the ones runs have always used; out-of-range seeds and epochs raise."""
    assert (7, 7191089600892374487, 309689372594955804) == tuple(derive_seed(7, e) for e in range(3))
    assert 4048727598324417001 == derive_seed(2**64 - 1, 3)
    for seed, epoch, message in [
        (2**64, 1, r"seed=18446744073709551616 must be an int in \[0, 2\*\*64\)"),
        (2**64, 0, r"seed=18446744073709551616"),
        (-1, 1, r"seed=-1"),
        (7, -1, r"epoch=-1 must be a non-negative int"),
        (7, 1.0, r"epoch=1.0 must be a non-negative int"),
        (7.0, 1, r"seed=7.0"),
    ]:
        with pytest.raises(sb.ConfigError, match=message):
            derive_seed(seed, epoch)  # type: ignore[arg-type]


@given(documents(), configs, seeds, st.integers(1, 3))
def test_every_epoch_covers_every_window_once(
    docs: list[sb.Document], config: dict[str, int], seed: int | None, epochs: int
) -> None:
    """Each epoch of a run is every window exactly once, in the order of its derived seed."""
    run = sb.Run(docs, seed=seed, epochs=epochs, **config)
    by_epoch: dict[int, list[int]] = {}
    for batch in run:
        by_epoch.setdefault(batch.epoch, []).extend(batch.window_numbers.tolist())
    if run.window_count == 0:
        assert {} == by_epoch
        return
    assert {e: list(range(run.window_count)) for e in range(epochs)} == {e: sorted(w) for e, w in by_epoch.items()}
    for e in range(epochs):
        order = sb.Epoch(docs, seed=None if seed is None else derive_seed(seed, e), **config).window_order()
        assert order.tolist() == by_epoch[e]


def test_endless_run_and_empty_corpus() -> None:
    """epochs=None runs on across epochs; a corpus without windows yields nothing, even endlessly."""
    run = _run(epochs=None)
    taken = list(itertools.islice(run, 3 * run.batches_per_epoch + 1))
    assert [b.epoch for b in taken][-1] == 3
    assert run.position == (3, 1)
    assert run.remaining is None
    assert [] == list(sb.Run([sb.Document("s", "train", [1, 2])], context_length=2, batch_size=2, seed=1))


def test_only_the_current_epochs_plan_is_kept() -> None:
    """Switching epochs replaces the plan; the run holds one Windows enumeration."""
    run = _run()
    first = run.epoch(0)
    assert run.epoch(0) is first
    second = run.epoch(1)
    assert second is not first
    assert second.items is first.items
    assert run._current == (1, second)


def test_minibatch_constructor_stays_compatible() -> None:
    """MiniBatch's positional constructor still works; epoch is a new last argument defaulting to 0."""
    batch = sb.Epoch(DOCS, context_length=2, batch_size=3, seed=7)[0]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD  # the optional columns are keyword-only
    names = [n for n, p in inspect.signature(sb.MiniBatch).parameters.items() if p.kind is positional]
    assert "epoch" == names[-1]
    twin = sb.MiniBatch(*(getattr(batch, name) for name in names[:-1]))
    assert 0 == twin.epoch == batch.epoch
    assert twin == batch
    twin.epoch = 1
    assert twin != batch
    assert "MiniBatch(epoch=1, index=0, shape=(3, 2))" == repr(twin)


# -- the checkpoint ----------------------------------------------------------------------


@st.composite
def interruptions(draw: st.DrawFn) -> tuple[list[sb.Document], dict[str, int], int | None, int, int]:
    """A corpus, a configuration, a seed, an epoch count and an interruption point (0, last, boundary, any)."""
    docs = draw(documents())
    config = draw(configs)
    seed = draw(seeds)
    epochs = draw(st.integers(1, 3))
    run = sb.Run(docs, seed=seed, epochs=epochs, **config)
    total = epochs * run.batches_per_epoch
    boundaries = [e * run.batches_per_epoch for e in range(1, epochs)]
    where = draw(st.sampled_from([0, max(total - 1, 0), total, *boundaries]) | st.integers(0, total))
    return docs, config, seed, epochs, where


@given(interruptions())
def test_save_and_resume_equals_the_uninterrupted_run(
    case: tuple[list[sb.Document], dict[str, int], int | None, int, int],
) -> None:
    """Stop after any number of batches, save (through JSON), resume in a new run: the same batches, none twice."""
    docs, config, seed, epochs, where = case
    expected = [_key(b) for b in sb.Run(docs, seed=seed, epochs=epochs, **config)]
    run = sb.Run(docs, seed=seed, epochs=epochs, **config)
    first = [_key(b) for b in itertools.islice(run, where)]
    saved = json.loads(json.dumps(run.state_dict()))
    resumed = sb.Run(docs, seed=seed, epochs=epochs, **config)
    resumed.load_state_dict(saved)
    assert expected == first + [_key(b) for b in resumed]


def test_state_is_small_versioned_json() -> None:
    """The state names the format, version, seed, position, configuration and corpus fingerprint."""
    run = _run()
    next(iter(run))
    state = run.state_dict()
    assert set(STATE_KEYS) == set(state)
    assert ("streambatch.state", 2, "run", 9, 0, 1) == tuple(
        state[k] for k in ("format", "version", "kind", "seed", "epoch", "batch")
    )
    assert (3, 1, 4, "train") == (state["context_length"], state["stride"], state["batch_size"], state["partition"])
    assert state["fingerprint"].startswith("blake2b-256:")
    assert len(json.dumps(state)) < 400


def test_end_of_an_epoch_is_the_next_epochs_start() -> None:
    """After an epoch's last batch the state says (epoch + 1, 0); batch == batches_per_epoch is accepted."""
    run = _run()
    for _ in range(run.batches_per_epoch):
        last = next(iter(run))
    assert (1, 0) == (run.state_dict()["epoch"], run.state_dict()["batch"])
    assert run.state_dict() == run.state_dict_after(last)
    run.set_position(0, run.batches_per_epoch)
    assert (1, 0) == run.position


def test_resume_indexes_instead_of_replaying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a state near the end gathers exactly the batches yielded afterwards, no others."""
    run = _run(epochs=2)
    target = run.state_dict_after(run.batch(1, run.batches_per_epoch - 2))
    calls: list[int] = []
    real = windows_module.iter_window_batches

    def counted(windows: sb.Windows, size: int, batches: range) -> Any:
        for batch in real(windows, size, batches):  # the windows' one batch loop: every road ends in it
            calls.append(batch.index)
            yield batch

    monkeypatch.setattr(windows_module, "iter_window_batches", counted)
    resumed = _run(epochs=2)
    resumed.load_state_dict(target)
    assert [] == calls
    assert [(1, run.batches_per_epoch - 1)] == [(b.epoch, b.index) for b in resumed]
    assert [run.batches_per_epoch - 1] == calls


def test_the_batch_in_flight_comes_again() -> None:
    """At-least-once for the batch in flight: a batch handed out after the last saved state is handed out again."""
    run = _run()
    batches = iter(run)
    for _ in range(5):
        done = next(batches)
    saved = run.state_dict()  # saved once batch 4 was done
    in_flight = next(batches)  # then the process dies while working on it
    resumed = _run()
    resumed.load_state_dict(saved)
    again = next(iter(resumed))
    assert (done.epoch, done.index + 1) == (in_flight.epoch, in_flight.index)
    assert _key(in_flight) == _key(again)


def test_elastic_over_ranks() -> None:
    """A state saved by 3 ranks resumes on 2: together they cover every window of each epoch exactly once."""
    run = _run(epochs=2)
    k = run.batches_per_epoch + 2  # across an epoch boundary
    seen: Counter[tuple[int, int]] = Counter()
    states = []
    for rank in range(3):
        share = _run(epochs=2)
        batches = share.iter_batches(rank=rank, world_size=3)
        for batch in itertools.islice(batches, k):
            seen.update((batch.epoch, w) for w in batch.window_numbers.tolist())
        states.append(share.state_dict())
    assert states[0] == states[1] == states[2]
    for rank in range(2):
        share = _run(epochs=2)
        share.load_state_dict(states[0])
        for batch in share.iter_batches(rank=rank, world_size=2):
            seen.update((batch.epoch, w) for w in batch.window_numbers.tolist())
    assert {(e, w): 1 for e in range(2) for w in range(run.window_count)} == dict(seen)


# -- refusal -----------------------------------------------------------------------------


def _state(**changes: Any) -> dict[str, Any]:
    state = _run().state_dict()
    state.update(changes)
    return state


REFUSED: list[tuple[str, Any, str]] = [
    ("seed", _state(seed=8), r"state seed=8 but this run has seed=9"),
    ("sequential", _state(seed=None), r"state seed=None but this run has seed=9"),
    ("context-length", _state(context_length=4), r"state context_length=4 but this run has context_length=3"),
    ("stride", _state(stride=2), r"state stride=2 but this run has stride=1"),
    ("batch-size", _state(batch_size=5), r"state batch_size=5 but this run has batch_size=4"),
    ("partition", _state(partition="validation"), r"state partition='validation' but this run has partition='train'"),
    ("corpus", _run(_docs(seed=6)).state_dict(), r"state fingerprint='blake2b-256:[0-9a-f]+' but this run has"),
    ("version", _state(version=3), r"state version=3 but this streambatch reads version 2"),
    ("format", _state(format="other"), r"state format='other' is not 'streambatch.state'"),
    ("not-a-dict", [1, 2], r"state=\[1, 2\] is not a dict"),
    ("missing", {k: v for k, v in _state().items() if k != "seed"}, r"state: Object missing required field `seed`"),
    ("unknown", _state(extra=1), r"state: Object contains unknown field `extra`"),
    ("epoch-negative", _state(epoch=-1), r"state: Expected `int` >= 0 - at `\$.epoch`"),
    ("epoch-float", _state(epoch=1.0), r"state: Expected `int`, got `float` - at `\$.epoch`"),
    ("batch-range", _state(batch=99), r"state batch=99 must be an int in \[0, \d+\]"),
    ("batch-bool", _state(batch=True), r"state: Expected `int`, got `bool` - at `\$.batch`"),
    ("T-type", _state(context_length="3"), r"state: Expected `int`, got `str` - at `\$.context_length`"),
    ("seed-range", _state(seed=2**64), r"state seed=18446744073709551616 must be an int in \[0, 2\*\*64\) or None"),
    ("fingerprint-type", _state(fingerprint=None), r"state: Expected `str`, got `null` - at `\$.fingerprint`"),
]


@pytest.mark.parametrize(("state", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_foreign_or_malformed_state_is_refused(state: Any, message: str) -> None:
    """Refused with a StateError naming the mismatch; the run keeps its position and iterates on unchanged."""
    run = _run()
    batches = iter(run)
    next(batches)
    before = run.state_dict()
    with pytest.raises(sb.StateError, match=message):
        run.load_state_dict(copy.deepcopy(state))
    assert before == run.state_dict()
    assert _key(run.batch(0, 1)) == _key(next(batches))
    assert issubclass(sb.StateError, sb.StreamBatchError)


def test_bad_positions_and_batches_are_refused() -> None:
    """set_position and state_after check their arguments."""
    run = _run()
    with pytest.raises(OutOfRangeError, match=r"batch=99 must be an int in \["):
        run.set_position(0, 99)
    with pytest.raises(OutOfRangeError, match=r"epoch=-1 must be a non-negative int"):
        run.set_position(-1, 0)
    with pytest.raises(OutOfRangeError, match=r"is not a batch of this run"):
        run.state_dict_after(object())
    with pytest.raises(sb.ConfigError, match=r"epochs=-1 must be a non-negative int"):
        _run(epochs=-1)
    with pytest.raises(sb.ConfigError, match=r"rank=3 must be an int in \[0, world_size=2\)"):
        run.iter_batches(rank=3, world_size=2)
    with pytest.raises(sb.ConfigError, match=r"epoch='x' is not a streambatch.Epoch"):
        sb.Run.from_epoch("x")  # type: ignore[arg-type]


# -- the corpus fingerprint --------------------------------------------------------------


def content_fingerprint(store: sb.DocumentStore) -> str:
    return store.content_fingerprint()


def test_content_fingerprint_follows_the_content() -> None:
    """Same content, same hash (uint16 or uint32); another token, id or partition changes it."""
    tokens, offsets = [0, 10, 11, 12, 1, 0, 20, 21, 1], [0, 5, 9]
    base = content_fingerprint(sb.DocumentStore.from_arrays(tokens, offsets))
    assert base == content_fingerprint(sb.DocumentStore.from_arrays(np.array(tokens, dtype=np.uint16), offsets))
    assert base == content_fingerprint(sb.DocumentStore.from_documents(sb.DocumentStore.from_arrays(tokens, offsets)))
    assert base != content_fingerprint(sb.DocumentStore.from_arrays([*tokens[:-1], 2], offsets))
    assert base != content_fingerprint(sb.DocumentStore.from_arrays(tokens, offsets, ids=["a", "b"]))
    assert base != content_fingerprint(sb.DocumentStore.from_arrays(tokens, offsets, partition="test"))
    assert base != content_fingerprint(sb.DocumentStore.from_arrays(tokens, [0, 4, 9]))
    mixed = sb.DocumentStore.from_arrays([1, 2, 3, 4, 5, 6], [0, 2, 4, 6], partition=["train", "test", "train"])
    gaps = mixed.select("train")  # documents 0 and 2: a view with a gap
    assert content_fingerprint(gaps) == content_fingerprint(sb.DocumentStore.from_arrays([1, 2, 5, 6], [0, 2, 4], ids=["0", "2"]))


def test_a_store_on_disk_uses_its_own_fingerprint(tmp_path: Any) -> None:
    """A run over a store on disk records the store's header fingerprint."""
    store = sb.write_store(tmp_path / "s", _docs())
    run = sb.Run(store, context_length=3, batch_size=4, seed=9)
    assert store.fingerprint == run.state_dict()["fingerprint"]
