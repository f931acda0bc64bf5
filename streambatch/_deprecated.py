"""Names that left ``streambatch.__all__`` in 0.3: still reachable as ``streambatch.NAME`` for one release, with a warning.

Each now lives in its own module (where the warning points); ``shard`` is the
old name of `streambatch.share` (a "shard" is a store of a corpus).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

MOVED = {
    "AuditResult": "streambatch.tools.audit",
    "Batches": "streambatch.stages.materialize",
    "ByteTokenizer": "streambatch.read.tokenizers",
    "CallableTokenizer": "streambatch.read.tokenizers",
    "DuplicateIdError": "streambatch.errors",
    "HFTokenizer": "streambatch.read.tokenizers",
    "MissingDependencyError": "streambatch.errors",
    "OutOfRangeError": "streambatch.errors",
    "PartitionError": "streambatch.errors",
    "RowIndexError": "streambatch.errors",
    "Source": "streambatch.model.source",
    "StoreError": "streambatch.errors",
    "StoreWriter": "streambatch.io.store",
    "TokenSource": "streambatch.model.source",
    "Tokenizer": "streambatch.read.tokenizers",
    "WindowConfig": "streambatch.items.windows.window_index",
    "WindowIndex": "streambatch.items.windows.window_index",
    "WindowProvenance": "streambatch.stages.batch",
    "as_tokenizer": "streambatch.read.tokenizers",
    "audit_batches": "streambatch.tools.audit",
    "audit_epoch": "streambatch.tools.audit",
    "batch_count": "streambatch.stages.chunk",
    "batch_widths": "streambatch.stages.chunk",
    "byte_detokenize": "streambatch.read.byte_tokens",
    "byte_tokenize": "streambatch.read.byte_tokens",
    "chunked": "streambatch.stages.chunk",
    "derive_seed": "streambatch.stages.splitmix",
    "epoch_html": "streambatch.tools.figure",
    "epoch_svg": "streambatch.tools.figure",
    "inspect_source": "streambatch.tools.inspect",
    "iter_arrow": "streambatch.read.formats",
    "iter_bin": "streambatch.read.formats",
    "iter_files": "streambatch.prepare",
    "iter_hf": "streambatch.read.formats",
    "iter_npy": "streambatch.read.formats",
    "iter_parquet": "streambatch.read.formats",
    "iter_records": "streambatch.read.jsonl",
    "materialize_one": "streambatch.stages.materialize",
    "plan_path": "streambatch.stages.plan",
    "read_jsonl": "streambatch.read.jsonl",
    "read_records": "streambatch.read.jsonl",
    "row_share": "streambatch.stages.chunk",
    "shard": "streambatch.stages.share",
    "shuffled_order": "streambatch.stages.shuffle",
    "window_counts": "streambatch.items.windows.window_index",
    "window_starts": "streambatch.items.windows.window_index",
    "window_tails": "streambatch.items.windows.window_index",
}


def module_getattr(namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: a moved name warns once per use and is fetched from its module."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = MOVED.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(
            f"streambatch.{name} is deprecated: import it from {module} (streambatch.__all__ keeps the stages, "
            "the model, the façades, the reducer and the errors)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)

    return __getattr__
