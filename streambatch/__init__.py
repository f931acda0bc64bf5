"""streambatch: causal windows that never cross a document, shuffled, batched, token-averaged.

The stages, each a plain function, chained lazily::

    docs    = sb.iter_jsonl("train.jsonl")                       # read: Iterator[Document]
    store   = sb.DocumentStore.from_documents(docs)              # or sb.open_store(path)
    windows = sb.windows(store, context_length=64, stride=64)    # Windows (integers, no tokens)
    windows = sb.shuffle(windows, seed=7)                        # the chapter's exact order
    chunks  = sb.chunk(windows, batch_size=32)                   # lazy views, the last one short
    chunks  = sb.shard(chunks, worker, workers)                  # a strided share
    batches = sb.materialize(chunks)                             # MiniBatch: the only token copy
    mean    = sb.token_mean(sums)                                # fold raw sums, divide once

`Epoch` composes exactly these stages; `Run` schedules epochs and makes its
position the checkpoint (``state_dict`` / ``load_state_dict``).

>>> import streambatch as sb
>>> epoch = sb.Epoch([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2, batch_size=2)
>>> [b.shape for b in epoch]
[(2, 2), (1, 2)]
"""

from .epoch import Epoch, derive_seed
from .errors import (
    AccumulationError,
    ConfigError,
    DataError,
    DuplicateIdError,
    MissingDependencyError,
    OutOfRangeError,
    PartitionError,
    RowIndexError,
    StateError,
    StoreError,
    StreamBatchError,
)
from .io.store import StoreWriter, open_store, write_store
from .model.corpus import Corpus, open_corpus, write_corpus
from .model.documents import Document, DocumentStore, Partition, TokenSource
from .prepare import iter_files, prepare_store
from .run import Run
from .stages.batch import MiniBatch, WindowProvenance
from .stages.chunk import Chunks, batch_count, batch_widths, chunk, chunked, row_share, shard, split_rows
from .stages.materialize import Batches, materialize, materialize_one
from .stages.plan import plan_file, plan_path
from .stages.read.byte_tokens import byte_detokenize, byte_tokenize
from .stages.read.formats import iter_arrow, iter_bin, iter_hf, iter_npy, iter_parquet, iter_text
from .stages.read.jsonl import iter_jsonl, iter_records, read_jsonl, read_records
from .stages.read.open import Source, open_source
from .stages.read.tokenizers import ByteTokenizer, CallableTokenizer, HFTokenizer, Tokenizer, as_tokenizer
from .stages.reduce import TokenContribution, TokenMean, TokenMeanAccumulator, TokenSums, token_mean
from .stages.shuffle import shuffle, shuffled_order
from .stages.windows import WindowConfig, WindowIndex, Windows, window_counts, window_starts, window_tails, windows
from .tools.audit import AuditResult, audit_batches, audit_epoch
from .tools.figure import epoch_html, epoch_svg
from .tools.inspect import inspect_source

__version__ = "0.2.0"

__all__ = [
    "AccumulationError",
    "AuditResult",
    "Batches",
    "ByteTokenizer",
    "CallableTokenizer",
    "Chunks",
    "ConfigError",
    "Corpus",
    "DataError",
    "Document",
    "DocumentStore",
    "DuplicateIdError",
    "Epoch",
    "HFTokenizer",
    "MiniBatch",
    "MissingDependencyError",
    "OutOfRangeError",
    "Partition",
    "PartitionError",
    "RowIndexError",
    "Run",
    "Source",
    "StateError",
    "StoreError",
    "StoreWriter",
    "StreamBatchError",
    "TokenContribution",
    "TokenMean",
    "TokenMeanAccumulator",
    "TokenSource",
    "TokenSums",
    "Tokenizer",
    "WindowConfig",
    "WindowIndex",
    "WindowProvenance",
    "Windows",
    "__version__",
    "as_tokenizer",
    "audit_batches",
    "audit_epoch",
    "batch_count",
    "batch_widths",
    "byte_detokenize",
    "byte_tokenize",
    "chunk",
    "chunked",
    "derive_seed",
    "epoch_html",
    "epoch_svg",
    "inspect_source",
    "iter_arrow",
    "iter_bin",
    "iter_files",
    "iter_hf",
    "iter_jsonl",
    "iter_npy",
    "iter_parquet",
    "iter_records",
    "iter_text",
    "materialize",
    "materialize_one",
    "open_corpus",
    "open_source",
    "open_store",
    "plan_file",
    "plan_path",
    "prepare_store",
    "read_jsonl",
    "read_records",
    "row_share",
    "shard",
    "shuffle",
    "shuffled_order",
    "split_rows",
    "token_mean",
    "window_counts",
    "window_starts",
    "window_tails",
    "windows",
    "write_corpus",
    "write_store",
]
