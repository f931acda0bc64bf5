"""streambatch: causal windows that never cross a document, shuffled, batched, token-averaged.

>>> import streambatch as sb
>>> epoch = sb.Epoch([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2, batch_size=2)
>>> [b.shape for b in epoch]
[(2, 2), (1, 2)]
"""

from .accumulate import TokenContribution, TokenMean, TokenMeanAccumulator, token_mean
from .chunk import batch_count, batch_widths, chunked
from .documents import Document, DocumentStore, Partition, read_jsonl, read_records
from .epoch import Epoch, derive_seed
from .errors import (
    AccumulationError,
    ConfigError,
    DataError,
    DuplicateIdError,
    OutOfRangeError,
    PartitionError,
    StoreError,
    StreamBatchError,
)
from .materialize import MiniBatch, RowIndexError, WindowProvenance
from .prepare import prepare_store
from .shuffle import shuffled_order
from .store import StoreWriter, open_store, write_store
from .tokenize import byte_detokenize, byte_tokenize
from .windows import WindowConfig, WindowIndex, window_counts, window_starts, window_tails

__version__ = "0.1.0"

__all__ = [
    "AccumulationError",
    "ConfigError",
    "DataError",
    "Document",
    "DocumentStore",
    "DuplicateIdError",
    "Epoch",
    "MiniBatch",
    "OutOfRangeError",
    "Partition",
    "PartitionError",
    "RowIndexError",
    "StoreError",
    "StoreWriter",
    "StreamBatchError",
    "TokenContribution",
    "TokenMean",
    "TokenMeanAccumulator",
    "WindowConfig",
    "WindowIndex",
    "WindowProvenance",
    "__version__",
    "batch_count",
    "batch_widths",
    "byte_detokenize",
    "byte_tokenize",
    "chunked",
    "derive_seed",
    "open_store",
    "prepare_store",
    "read_jsonl",
    "read_records",
    "shuffled_order",
    "token_mean",
    "window_counts",
    "window_starts",
    "window_tails",
    "write_store",
]
