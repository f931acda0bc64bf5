"""streambatch: causal windows that never cross a document, shuffled, batched, token-averaged.

The stages, each a plain function, chained lazily::

    docs    = sb.iter_jsonl("train.jsonl")                       # read: Iterator[Document]
    store   = sb.DocumentStore.from_documents(docs)              # or sb.open_store(path)
    windows = sb.windows(store, context_length=64, stride=64)    # Windows (integers, no tokens)
    windows = sb.shuffle(windows, seed=7)                        # the chapter's exact order
    # or: windows = sb.mix([windows_a, windows_b], [0.7, 0.3], seed=7), several sources at exact weights
    chunks  = sb.chunk(windows, batch_size=32)                   # lazy views, the last one short
    chunks  = sb.share(chunks, worker=k, workers=n)              # a DataLoader worker's share
    batches = sb.materialize(chunks)                             # MiniBatch: the only token copy
    mean    = sb.token_mean(sums)                                # fold raw sums, divide once

`Epoch` composes exactly these stages; `Run` schedules epochs and makes its
position the checkpoint (``state_dict`` / ``load_state_dict``).

>>> import streambatch as sb
>>> epoch = sb.Epoch([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2, batch_size=2, seed=7)
>>> [b.shape for b in epoch]
[(2, 2), (1, 2)]
"""

from .batch.minibatch import MiniBatch
from .batch.reduce import TokenContribution, TokenMean, TokenMeanAccumulator, TokenSums, token_mean
from .epoch import Epoch
from .errors import AccumulationError, ConfigError, DataError, StateError, StreamBatchError
from .io.manifest import open_corpus, write_corpus
from .io.store import open_store, write_store
from .items.mix.mixture import mix
from .items.pack.rows import pack
from .items.windows.windows import Windows, windows
from .model.corpus import Corpus
from .model.documents import Document, Partition
from .model.store import DocumentStore
from .order.plan import plan_file
from .order.shuffle import shuffle
from .prepare import prepare_store
from .read.formats import iter_text
from .read.jsonl import iter_jsonl
from .read.open import open_source
from .run import Run
from .stages.chunk import Chunks, chunk
from .stages.materialize import materialize
from .stages.share import share, split_rows

__version__ = "0.5.0"

__all__ = [
    "AccumulationError",
    "Chunks",
    "ConfigError",
    "Corpus",
    "DataError",
    "Document",
    "DocumentStore",
    "Epoch",
    "MiniBatch",
    "Partition",
    "Run",
    "StateError",
    "StreamBatchError",
    "TokenContribution",
    "TokenMean",
    "TokenMeanAccumulator",
    "TokenSums",
    "Windows",
    "__version__",
    "chunk",
    "iter_jsonl",
    "iter_text",
    "materialize",
    "mix",
    "open_corpus",
    "open_source",
    "open_store",
    "pack",
    "plan_file",
    "prepare_store",
    "share",
    "shuffle",
    "split_rows",
    "token_mean",
    "windows",
    "write_corpus",
    "write_store",
]
