"""Tests for `streambatch.order.shuffle`: both paths of the ``shuffle`` kernel (C and numpy) equal the plain loop bit for bit."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import sysconfig
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch.order.shuffle as shuffle
from streambatch import ConfigError, _kernels
from streambatch.order.shuffle import apply_swaps, shuffled_order, swap_targets
from streambatch.order.splitmix import splitmix64_draws, state_after
from tests import spec

_fisher_yates = _kernels.built("shuffle")  # None without a compiler at install time (see test_c_extension_is_built)
needs_c = pytest.mark.skipif(_fisher_yates is None, reason="streambatch._fisher_yates is not built")
BACKENDS = [pytest.param("c", marks=needs_c), "python"]
SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
# 0, 1, 2, small, and the C loop's look-ahead edges (it draws 32 steps ahead)
EDGE_COUNTS = st.sampled_from([0, 1, 2, 3, 4, 31, 32, 33, 34, 63, 64, 65, 97])
COUNTS = st.one_of(EDGE_COUNTS, st.integers(min_value=0, max_value=300))


@contextlib.contextmanager
def backend_of(name: str, chunk: int | None = None) -> Iterator[None]:
    """`shuffled_order` runs on path *name* (and the numpy path in blocks of *chunk* steps) inside."""
    saved = shuffle._CHUNK
    shuffle._CHUNK = chunk or shuffle._CHUNK
    try:
        with _kernels.use("shuffle", name):
            yield
    finally:
        shuffle._CHUNK = saved


def test_chapter_seed_7_order() -> None:
    """Seed 7 on five windows gives the chapter's order b@1, a@1, b@0, a@0, a@2 (numbers 4, 1, 3, 0, 2)."""
    order, state = shuffled_order(5, seed=7)
    assert order.tolist() == [4, 1, 3, 0, 2]
    assert spec.fisher_yates(5, 7) == ([4, 1, 3, 0, 2], state)


def test_draws_match_scalar_generator() -> None:
    """Vectorized draws equal SplitMix64 stepped one draw at a time."""
    rng = spec.SplitMix64(123456789)
    expected = [rng.next_u64() for _ in range(100)]
    assert expected == splitmix64_draws(123456789, 1, 100).tolist()
    assert expected[40:] == splitmix64_draws(123456789, 41, 60).tolist()


@pytest.mark.parametrize("count", [0, 1])
def test_tiny_epochs_keep_the_seed_as_state(count: int) -> None:
    """0 or 1 windows draw nothing: the state after is the seed itself (the chapter's empty epoch, seed 9)."""
    order, state = shuffled_order(count, seed=9)
    assert list(range(count)) == order.tolist()
    assert state == 9


@given(st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=2**64 - 1))
def test_equals_plain_loop(count: int, seed: int) -> None:
    """Every size and seed: same order and same final state as the chapter's loop."""
    order, state = shuffled_order(count, seed)
    expected, expected_state = spec.fisher_yates(count, seed)
    assert expected == order.tolist()
    assert expected_state == state


@pytest.mark.parametrize("count", [1_000, 4_097, 30_000])
@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1])
def test_equals_plain_loop_large(count: int, seed: int) -> None:
    """Larger sizes too (several chunks of draws are not needed for equality, but groups get long)."""
    order, state = shuffled_order(count, seed)
    expected, expected_state = spec.fisher_yates(count, seed)
    assert expected == order.tolist()
    assert expected_state == state


def test_chunked_draws_cross_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """With tiny draw chunks the result is unchanged: chunking is invisible."""
    import streambatch.order.shuffle as shuffle

    monkeypatch.setattr(shuffle, "_CHUNK", 7)
    monkeypatch.setattr(shuffle, "_BLOCK", 3)
    assert spec.fisher_yates(200, 99)[0] == shuffle.shuffled_order(200, 99)[0].tolist()


@given(
    st.integers(min_value=3, max_value=200),
    st.data(),
)
def test_forced_rejections_match_plain_loop(count: int, data: st.DataObject) -> None:
    """A seed built so that some step's draw is below its threshold redraws exactly like the loop."""
    upper = data.draw(st.integers(min_value=1, max_value=count - 1), label="step")
    bound = upper + 1
    threshold = ((1 << 64) - bound) % bound
    if threshold == 0:  # powers of two never reject
        bound, upper = 3, 2
        threshold = 1
    draw_number = count - upper  # no rejection before this step uses it
    value = data.draw(st.integers(min_value=0, max_value=threshold - 1), label="rejected draw")
    seed = spec.seed_with_draw(draw_number, value)
    expected, expected_state = spec.fisher_yates(count, seed)
    order, state = shuffled_order(count, seed)
    assert expected == order.tolist()
    assert expected_state == state
    assert state == state_after(seed, count)  # count - 1 accepted draws + 1 rejected


def test_rejection_consumes_one_extra_draw() -> None:
    """A rejected draw is skipped: the shuffle consumes count draws instead of count - 1."""
    count = 10
    seed = spec.seed_with_draw(count - 2, 0)  # step 2 (bound 3, threshold 1) gets draw 0
    order, state = shuffled_order(count, seed)
    assert spec.fisher_yates(count, seed) == (order.tolist(), state)
    _, draws = swap_targets(count, seed)
    assert draws == count  # one more than without the rejection


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=300))
def test_apply_swaps_equals_loop(raw: list[int]) -> None:
    """Any swap chain with H[i] <= i resolves like the sequential swaps."""
    targets = np.array([value % (i + 1) for i, value in enumerate(raw)], dtype=np.uint32)
    values = list(range(len(raw)))
    for i in range(len(raw) - 1, 0, -1):
        j = int(targets[i])
        values[i], values[j] = values[j], values[i]
    assert values == apply_swaps(targets).tolist()


def test_order_dtype_is_four_bytes_per_window() -> None:
    """Window counts that fit in uint32 get a uint32 order: 4 bytes per window."""
    order, _ = shuffled_order(1000, 1)
    assert np.uint32 == order.dtype
    assert order.nbytes == 4000


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True, "7", None])
def test_bad_seeds_are_rejected(seed: object) -> None:
    """Seeds outside [0, 2**64) or not integers raise ConfigError naming the seed."""
    with pytest.raises(ConfigError, match=r"seed=.* must be an int in \[0, 2\*\*64\)"):
        shuffled_order(5, seed)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- backends


def test_backend_names_the_built_extension() -> None:
    """The shuffle kernel runs C exactly when the extension imports, else the numpy fallback."""
    assert ("c" if _fisher_yates is not None else "python") == _kernels.backend("shuffle")


def test_c_extension_is_built() -> None:
    """Where a C compiler is present, `pip install -e .` must have built the extension (optional=True hides failures)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if _fisher_yates is None and shutil.which(compiler):
        pytest.fail(
            f"{compiler} is present but streambatch._fisher_yates is not built: run `pip install -e .` again and read its log"
        )
    if _fisher_yates is None:
        pytest.skip(f"no C compiler ({compiler}): the numpy backend is used")


@pytest.mark.slow
def test_missing_extension_falls_back_to_numpy() -> None:
    """Without the extension the module still imports, the switch says "python", and it shuffles exactly."""
    code = (
        "import sys; sys.modules['streambatch._fisher_yates'] = None\n"  # makes the import fail
        "import streambatch.order.shuffle as s\n"
        "from streambatch import _kernels\n"
        "print(_kernels.backend('shuffle'), s.shuffled_order(5, 7)[0].tolist())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]
    )
    assert "python [4, 1, 3, 0, 2]" == result.stdout.strip()


def test_c_backend_without_extension_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switching the shuffle to "c" where the extension is missing says how to get it, and switches nothing."""
    monkeypatch.setitem(_kernels._MODULES, "_fisher_yates", None)  # as a build without a C compiler imports it
    before = _kernels.backend("shuffle")
    with pytest.raises(ConfigError, match=r"_fisher_yates is not built.*or use 'python'"), _kernels.use("shuffle", "c"):
        pass
    assert before == _kernels.backend("shuffle")


@pytest.mark.parametrize("backend", BACKENDS)
@given(count=COUNTS, seed=SEEDS)
def test_backend_equals_plain_loop(backend: str, count: int, seed: int) -> None:
    """Each backend: the spec loop's order and state, bit for bit, at 0, 1, 2, small and look-ahead edge counts."""
    with backend_of(backend):
        order, state = shuffled_order(count, seed)
    assert (spec.fisher_yates(count, seed)) == (order.tolist(), state)
    assert np.uint32 == order.dtype


@given(count=st.integers(min_value=0, max_value=120), seed=SEEDS, chunk=st.sampled_from([1, 2, 3, 7, 32, 64]))
def test_numpy_backend_block_edges(count: int, seed: int, chunk: int) -> None:
    """The numpy backend in tiny blocks: block edges anywhere, still the spec loop."""
    with backend_of("python", chunk):
        order, state = shuffled_order(count, seed)
    assert spec.fisher_yates(count, seed) == (order.tolist(), state)


@pytest.mark.parametrize("backend", BACKENDS)
@given(count=st.integers(min_value=3, max_value=200), seed_data=st.data(), chunk=st.sampled_from([None, 5, 64]))
def test_backend_forced_small_draws(backend: str, count: int, seed_data: st.DataObject, chunk: int | None) -> None:
    """A seed that forces some step's draw to a small value: rejected (below the threshold) or accepted, like the loop."""
    upper = seed_data.draw(st.integers(min_value=1, max_value=count - 1), label="step")
    bound = upper + 1
    threshold = ((1 << 64) - bound) % bound  # 0 for powers of two: nothing is rejected there
    value = seed_data.draw(st.integers(min_value=0, max_value=bound + 64), label="draw")
    seed = spec.seed_with_draw(count - upper, value)  # draw number count - upper is step upper's first
    with backend_of(backend, chunk):
        order, state = shuffled_order(count, seed)
    assert spec.fisher_yates(count, seed) == (order.tolist(), state)
    assert state_after(seed, count - 1 + (value < threshold)) == state


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("count", "upper"), [(3, 2), (10, 2), (10, 5), (10, 9), (33, 5), (33, 32), (34, 33), (35, 34), (100, 99)]
)
def test_backend_rejection_consumes_one_extra_draw(backend: str, count: int, upper: int) -> None:
    """A rejection at the first step, inside the C loop's look-ahead or after it, and at step 2: one more draw."""
    seed = spec.seed_with_draw(count - upper, 0)  # draw 0 is below every non-zero threshold
    with backend_of(backend):
        order, state = shuffled_order(count, seed)
    assert spec.fisher_yates(count, seed) == (order.tolist(), state)
    assert state_after(seed, count) == state


@pytest.mark.parametrize("count", [5_000, 70_001])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_on_larger_counts(backend: str, count: int) -> None:
    """Larger counts: both backends equal the spec loop (numpy in many blocks)."""
    with backend_of(backend, 4096):
        order, state = shuffled_order(count, 2**64 - 3)
    assert spec.fisher_yates(count, 2**64 - 3) == (order.tolist(), state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scratch_memory_does_not_grow_with_count(backend: str) -> None:
    """Beyond *out*, scratch stays bounded: the C loop allocates nothing, numpy at most ~200 bytes per block step.

    tracemalloc counts every thread's allocations, so a thread an earlier test left winding down can only add to
    a reading: each count's peak is the least of three runs (seen once in the whole suite: a stray reading).
    """
    peaks = []
    for count in (20_000, 400_000):
        out = np.empty(count, dtype=np.uint32)
        runs = []
        with backend_of(backend, 2048):
            for _ in range(3):
                tracemalloc.start()
                try:
                    shuffled_order(count, 11, out=out)
                    runs.append(tracemalloc.get_traced_memory()[1])
                finally:
                    tracemalloc.stop()
        peaks.append(min(runs))
    assert max(peaks) < (4096 if backend == "c" else 200 * 2048)


@needs_c
@given(count=COUNTS, seed=SEEDS)
def test_c_int64_variant_equals_plain_loop(count: int, seed: int) -> None:
    """The extension's 64-bit variant (used from 2**32 windows on) on small counts: same order and draws."""
    assert _fisher_yates is not None
    for dtype in (np.int64, np.uint64):
        values = np.full(count, -1).astype(dtype)
        draws = _fisher_yates.shuffle(values, seed)
        assert spec.fisher_yates(count, seed) == (values.tolist(), state_after(seed, draws))


@given(count=COUNTS, seed=SEEDS, chunk=st.sampled_from([3, 64]))
def test_numpy_int64_variant_equals_plain_loop(count: int, seed: int, chunk: int) -> None:
    """The numpy backend on an int64 order (from 2**32 windows on) on small counts."""
    values = np.full(count, -1, dtype=np.int64)
    with backend_of("python", chunk):
        draws = shuffle._shuffle_blocked(values, seed)
    assert spec.fisher_yates(count, seed) == (values.tolist(), state_after(seed, draws))


@needs_c
@pytest.mark.parametrize(
    ("buffer", "error"),
    [
        (np.zeros(4, dtype=np.float64), TypeError),
        (np.zeros(4, dtype=np.int32), TypeError),
        (np.zeros((2, 2), dtype=np.uint32), TypeError),
        (bytearray(16), TypeError),
        (np.zeros(8, dtype=np.uint32)[::2], (BufferError, ValueError)),
        (np.frombuffer(bytes(16), dtype=np.uint32), (BufferError, ValueError)),
    ],
    ids=["float64", "int32", "2-D", "bytes", "strided", "read-only"],
)
def test_c_refuses_other_buffers(buffer: object, error: type[Exception]) -> None:
    """The extension only takes writable, contiguous, 1-D uint32 or 64-bit integer buffers."""
    assert _fisher_yates is not None
    with pytest.raises(error):
        _fisher_yates.shuffle(buffer, 7)  # type: ignore[arg-type]


@needs_c
@pytest.mark.parametrize("seed", [-1, 2**64])
def test_c_refuses_seeds_outside_64_bits(seed: int) -> None:
    """The extension itself refuses seeds outside [0, 2**64) instead of wrapping them."""
    assert _fisher_yates is not None
    with pytest.raises(OverflowError):
        _fisher_yates.shuffle(np.zeros(3, dtype=np.uint32), seed)


# --------------------------------------------------------------------------- out=


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_receives_the_order(backend: str) -> None:
    """With out=, the order is written into it and it is returned: no other output array."""
    out = np.full(1000, 7, dtype=np.uint32)
    with backend_of(backend):
        order, state = shuffled_order(1000, 42, out=out)
    assert order is out
    assert spec.fisher_yates(1000, 42) == (out.tolist(), state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_memmap_plan_file(backend: str, tmp_path: Path) -> None:
    """A writable memmap of a plan file receives the order; reopened, the file holds it."""
    path = tmp_path / "plan.u32"
    plan = np.memmap(path, dtype=np.uint32, mode="w+", shape=(3001,))
    with backend_of(backend):
        order, state = shuffled_order(3001, 5, out=plan)
    assert order is plan
    plan.flush()
    del plan, order
    assert spec.fisher_yates(3001, 5) == (np.fromfile(path, dtype=np.uint32).tolist(), state)


@pytest.mark.parametrize(
    ("out", "problem"),
    [
        (np.zeros(5, dtype=np.int64), r"dtype=int64"),
        (np.zeros(5, dtype=np.uint64), r"dtype=uint64"),
        (np.zeros(4, dtype=np.uint32), r"shape=\(4,\)"),
        (np.zeros(6, dtype=np.uint32), r"shape=\(6,\)"),
        (np.zeros((5, 1), dtype=np.uint32), r"shape=\(5, 1\)"),
        (np.zeros(10, dtype=np.uint32)[::2], r"not C-contiguous"),
        (np.frombuffer(bytes(20), dtype=np.uint32), r"read-only"),
        ([0, 0, 0, 0, 0], r"not a numpy array"),
    ],
    ids=["int64", "uint64", "short", "long", "2-D", "strided", "read-only", "list"],
)
def test_out_must_fit_the_order(out: object, problem: str) -> None:
    """An out= of another dtype, length, layout or a read-only one is a ConfigError saying what to pass; nothing is written."""
    with pytest.raises(ConfigError, match=rf"out=\w+ \({problem}\) cannot hold the order of count=5 items; pass a writable"):
        shuffled_order(5, 7, out=out)  # type: ignore[arg-type]


def test_out_read_only_memmap_is_rejected(tmp_path: Path) -> None:
    """A memmap opened read-only cannot receive the plan."""
    path = tmp_path / "plan.u32"
    np.zeros(5, dtype=np.uint32).tofile(path)
    with pytest.raises(ConfigError, match=r"read-only"):
        shuffled_order(5, 7, out=np.memmap(path, dtype=np.uint32, mode="r"))


@pytest.mark.parametrize("count", [-1, 2.0, "5"])
def test_bad_counts_are_rejected(count: object) -> None:
    """Counts that are not non-negative ints raise ConfigError naming the count."""
    with pytest.raises(ConfigError, match=r"count=.* must be a non-negative int; pass"):
        shuffled_order(count, 7)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=120), SEEDS, st.sampled_from([np.uint32, np.int64]))
def test_permute_applies_the_spec_order_to_any_values(backend: str, values: list[int], seed: int, dtype: type) -> None:
    """permute runs Fisher–Yates on the values in place: values[i] = old[order[i]], the spec's order and state."""
    order, state = spec.fisher_yates(len(values), seed)
    array = np.array(values, dtype=dtype)
    with backend_of(backend, chunk=7):
        assert state == shuffle.permute(array, seed)
    assert [values[i] for i in order] == array.tolist()


@pytest.mark.parametrize(
    "bad", [[1, 2], np.arange(4, dtype=np.uint16), np.arange(6, dtype=np.uint32)[::2], np.zeros((2, 2), dtype=np.uint32)]
)
def test_permute_refuses_what_it_cannot_permute_in_place(bad: object) -> None:
    """Lists, other dtypes, strided or 2-D arrays are refused, unchanged."""
    with pytest.raises(ConfigError):
        shuffle.permute(bad, 7)  # type: ignore[arg-type]
