"""The catalogue of bad inputs: every public entry point answers with a clear StreamBatchError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
from streambatch import _kernels
from streambatch.errors import DuplicateIdError, StoreError
from streambatch.io.store import StoreWriter
from streambatch.items.windows.window_index import window_counts
from streambatch.order.shuffle import shuffled_order
from streambatch.read.jsonl import read_records
from streambatch.stages.chunk import batch_widths, chunked

DOC = sb.Document("a", "train", [1, 2, 3, 4])

CASES: list[tuple[str, Callable[[], Any], type[sb.StreamBatchError], str]] = [
    ("window-counts-T", lambda: window_counts([5], 0), sb.ConfigError, r"context_length=0 must be a positive int; pass"),
    ("window-counts-stride", lambda: window_counts([5], 2, stride=0), sb.ConfigError, r"stride=0 must be a positive int"),
    ("widths-B", lambda: batch_widths(5, 0), sb.ConfigError, r"batch_size=0 must be a positive int; pass the number"),
    ("chunked-B", lambda: chunked(np.arange(3), -2), sb.ConfigError, r"batch_size=-2 must be a positive int"),
    ("shuffle-count", lambda: shuffled_order(-1, 7), sb.ConfigError, r"count=-1 must be a non-negative int"),
    (
        "shuffle-seed",
        lambda: shuffled_order(3, 2**64),
        sb.ConfigError,
        r"seed=18446744073709551616 must be an int in \[0, 2\*\*64\)",
    ),
    (
        "epoch-source",
        lambda: sb.Epoch("docs.jsonl", context_length=2, batch_size=2, seed=None),
        sb.ConfigError,
        r"source='docs.jsonl'",
    ),
    (
        "epoch-one-doc",
        lambda: sb.Epoch(DOC, context_length=2, batch_size=2, seed=None),
        sb.ConfigError,
        r"single document; pass a list",
    ),
    (
        "epoch-not-doc",
        lambda: sb.Epoch([{"id": "a"}], context_length=2, batch_size=2, seed=None),
        sb.DataError,
        r"got dict; pass streambatch.Document",
    ),
    (
        "epoch-rank",
        lambda: sb.Epoch([DOC], context_length=2, batch_size=2, seed=None).iter_batches(rank=3, world_size=2),
        sb.ConfigError,
        r"rank=3",
    ),
    (
        "epoch-world",
        lambda: sb.Epoch([DOC], context_length=2, batch_size=2, seed=None).iter_batches(world_size=0),
        sb.ConfigError,
        r"world_size=0",
    ),
    (
        "batch-index",
        lambda: sb.Epoch([DOC], context_length=2, batch_size=2, seed=None).batch(5),
        IndexError,
        r"batch index=5 is out of range",
    ),
    (
        "arrays-ids",
        lambda: sb.DocumentStore.from_arrays([1, 2], [0, 1, 2], ids=["x"]),
        sb.DataError,
        r"ids has 1 entries but offsets describe 2",
    ),
    (
        "arrays-dup",
        lambda: sb.DocumentStore.from_arrays([1, 2], [0, 1, 2], ids=["x", "x"]),
        DuplicateIdError,
        r"first at document index 0",
    ),
    ("arrays-tokens", lambda: sb.DocumentStore.from_arrays([1.5], [0, 1]), sb.DataError, r"tokens: token\[0\]=1.5"),
    ("records-type", lambda: read_records([["a"]]), sb.DataError, r"record 0: got list"),
    (
        "records-partition",
        lambda: read_records([{"id": "a", "partition": "dev", "tokens": []}]),
        sb.DataError,
        r"partition='dev'",
    ),
    ("accumulator-width", lambda: sb.TokenMeanAccumulator(0), sb.AccumulationError, r"gradient_width=0 must be a positive int"),
    ("token-mean-empty", lambda: sb.token_mean([]), sb.AccumulationError, r"pieces is empty"),
    ("store-missing", lambda: sb.open_store("/nonexistent/store"), StoreError, r"not a streambatch store"),
    ("writer-dtype", lambda: StoreWriter("/tmp/never", dtype=np.float32), StoreError, r"dtype=float32 is not supported"),
]


@pytest.mark.parametrize(("call", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_catalogue(call: Callable[[], Any], error: type[Exception], message: str) -> None:
    """Each bad input raises its documented error with name=value, the rule and the fix."""
    with pytest.raises(error, match=message) as caught:
        call()  # raised by the call itself, never later at the first next()
    assert isinstance(caught.value, sb.StreamBatchError)


def test_writer_with_bad_dtype_leaves_nothing(tmp_path: Path) -> None:
    """A writer refused at construction creates no directory at all."""
    with pytest.raises(StoreError):
        StoreWriter(tmp_path / "s", dtype=np.int8)
    assert [] == list(tmp_path.iterdir())


def test_selected_view_has_no_flat_offsets() -> None:
    """offsets exist for contiguous stores; a partition view with gaps says to use starts/lengths."""
    store = sb.DocumentStore.from_arrays([1, 2, 3], [0, 1, 2, 3], partition=["train", "test", "train"])
    assert [0, 1, 2, 3] == store.offsets.tolist()
    with pytest.raises(sb.DataError, match="not contiguous"):
        _ = store.select("train").offsets


def test_swapped_store_arguments_say_the_order(tmp_path: Path) -> None:
    """write_store(path, docs) and prepare_store(inputs, output) swapped: a ConfigError naming the order."""
    docs = [sb.Document("a", "train", [1, 2, 3])]
    with pytest.raises(sb.ConfigError, match=r"write_store\(path, documents\)"):
        sb.write_store(docs, tmp_path / "s")  # type: ignore[arg-type]
    (tmp_path / "in.txt").write_text("hi")
    with pytest.raises(sb.ConfigError, match=r"prepare_store\(inputs, output\)"):
        sb.prepare_store(tmp_path / "s", [tmp_path / "in.txt"])  # type: ignore[arg-type]


def test_cli_messages_have_one_prefix_and_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    """Usage errors print one 'streambatch: error:' prefix; --version prints the version, then the kernels' line."""
    from streambatch.cli import main

    assert main(["epoch", "x.jsonl", "-T", "2", "-B", "3", "--seed", "1", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("streambatch") == 2  # the prefix and "see streambatch --help"
    assert err.startswith("streambatch: error: unrecognized arguments: --bogus")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"streambatch {sb.__version__}\n{_kernels.describe()}\n"


@pytest.mark.parametrize(
    "call",
    [
        lambda w, c: w[1:1.5],
        lambda w, c: w[::0],
        lambda w, c: c[1.5],
        lambda w, c: c[::0],
        lambda w, c: sb.token_mean(None),
        lambda w, c: sb.materialize(None),
        lambda w, c: sb.open_corpus([5]),
        lambda w, c: sb.open_corpus(5),
    ],
    ids=[
        "float-slice",
        "zero-step",
        "float-batch",
        "chunk-zero-step",
        "token-mean-none",
        "materialize-none",
        "corpus-int",
        "corpus-5",
    ],
)
def test_odd_arguments_are_stream_batch_errors(call: Callable[[Any, Any], Any]) -> None:
    """Odd types and slices are StreamBatchErrors (never TypeError or ValueError from deep inside)."""
    windows = sb.windows([sb.Document("a", "train", range(9))], context_length=2)
    with pytest.raises(sb.StreamBatchError):
        call(windows, sb.chunk(windows, 2))


def test_a_damaged_plan_position_is_a_data_error() -> None:
    """A plan entry beyond the tokens (a damaged plan file) is a DataError at the gather, not an IndexError."""
    store = sb.DocumentStore.from_arrays(np.arange(10, dtype=np.uint16), [0, 10])
    windows = sb.windows(store, context_length=2)
    damaged = windows.with_plan(np.array([0, 1, 2, 3, 4, 5, 6, 2**32 - 1], dtype=np.uint32), None)
    with pytest.raises(sb.DataError, match="outside the store's 10 tokens"):
        list(sb.materialize(sb.chunk(damaged, 4)))
