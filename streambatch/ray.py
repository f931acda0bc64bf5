"""Ray Data in and out (the ``ray`` extra): a corpus as a `ray.data.Dataset`, and a Dataset written as a corpus.

- `read_corpus` (source) -> a Dataset of one row per document (``id``,
  ``partition``, ``tokens``, ``loss_mask``), read by blocks of documents in Ray
  tasks, each of which opens the source itself (a store, a corpus folder or
  manifest, local or ``s3://``/``gs://``);
- `Tokenize`: a callable class for ``map_batches`` that turns text rows into
  those rows, through the same reader as ``prepare`` (so the same ids, tokens and
  masks); its tokenizer loads once per actor;
- `CorpusSink` (folder): for ``ds.write_datasink``; each write task writes one
  store ``part-NNNNN`` atomically, and the manifest ``corpus.json`` is written
  only in ``on_write_complete``, so a failed write leaves no manifest.

::

    import ray, streambatch as sb
    from streambatch.ray import CorpusSink, Tokenize

    ray.data.DataContext.get_current().execution_options.preserve_order = True  # documents in input order
    ds = ray.data.read_json("docs.jsonl")  # rows with "id" and "text"
    ds = ds.map_batches(Tokenize, fn_constructor_kwargs={"tokenizer": "tokenizer.json"}, batch_format="pyarrow", concurrency=2)
    ds.write_datasink(CorpusSink("corpus"))
    epoch = sb.Epoch(sb.open_corpus("corpus"), context_length=1024, batch_size=32, seed=7)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .errors import ConfigError, StoreError
from .io.atomic import partial_prefix, remove_stale_temporaries
from .io.manifest import CORPUS_MANIFEST, write_corpus
from .io.mixture_file import MixtureSource
from .io.remote.location import is_remote
from .io.store import StoreWriter
from .model.documents import PARTITIONS
from .model.source import TokenSource
from .model.store import DocumentStore
from .parts.corpus import part_name
from .parts.on_ray import ray_module
from .read.blocks import Block, ReadKeywords, read_options
from .read.columns.tables import table_block
from .read.open import open_source
from .read.text.tokenizers import require

if TYPE_CHECKING:
    from typing_extensions import Unpack

ray = ray_module("streambatch.ray")  # the extra: a MissingDependencyError naming it, at import
Datasource: Any = ray.data.Datasource
Datasink: Any = ray.data.Datasink
BLOCK_DOCUMENTS = 4096
_PARTITION_NAMES = [p.value for p in PARTITIONS]


def _arrow() -> Any:
    return require("pyarrow", "arrow", "streambatch.ray")


def block_table(block: Block) -> Any:
    """A `Block` as the rows of a Dataset: ``id``, ``partition``, ``tokens`` (list<uint32>), ``loss_mask`` (list<bool>|null)."""
    pa = _arrow()
    offsets = np.concatenate([[0], np.cumsum(block.lengths)]).astype(np.int64)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(block.tokens.astype(np.uint32)))
    if block.loss_mask is None:
        mask = pa.nulls(len(block), pa.large_list(pa.bool_()))
    else:
        mask = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(block.loss_mask.astype(np.bool_)))
    partitions = [_PARTITION_NAMES[int(c)] for c in block.codes]
    return pa.table({"id": pa.array(block.ids, pa.string()), "partition": partitions, "tokens": tokens, "loss_mask": mask})


class Tokenize:
    """``ds.map_batches(Tokenize, fn_constructor_kwargs={...}, batch_format="pyarrow")``: text rows -> document rows.

    The keywords are `streambatch.prepare_store`'s reading keywords (*tokenizer*,
    *eos_id*, *bos_id*, *column*, *prompt_field*/*completion_field*,
    *chat_template*, *partition*, *skip_untrained_documents*); a batch is read as
    ``prepare`` reads a table (`streambatch.read.columns.tables.table_block`), so
    the ids, tokens and masks are prepare's.  Rows need an ``id`` column: Ray Data
    does not say which file and line a row came from.
    """

    def __init__(self, **read: Unpack[ReadKeywords]) -> None:
        self.options = read_options(**read)  # the tokenizer, loaded once per actor

    def __call__(self, batch: Any) -> Any:
        pa = _arrow()
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_pydict(dict(batch))
        if "id" not in table.column_names:
            raise ConfigError(
                f"Tokenize: the rows have no id column (columns: {', '.join(table.column_names)}); give each row an id "
                "(ds.add_column or the source's own), since a Ray batch does not say which file and line it came from"
            )
        block = table_block(table, "", None, 0, self.options).with_masks(self.options.skip_untrained_documents)
        return block_table(block)


def read_corpus(source: Any, *, documents_per_block: int = BLOCK_DOCUMENTS) -> Any:
    """A `ray.data.Dataset` of *source*'s documents, in order: one row each (``id``, ``partition``, ``tokens``, ``loss_mask``).

    *source* is a path or address `streambatch.open_source` opens (a store, a corpus
    folder or manifest, Megatron/datatrove files), or an opened store or corpus.
    Read tasks take blocks of *documents_per_block* documents; each opens the source once per process.
    """
    if isinstance(documents_per_block, bool) or not isinstance(documents_per_block, int) or documents_per_block < 1:
        raise ConfigError(f"documents_per_block={documents_per_block!r} must be a positive int")
    return ray.data.read_datasource(_CorpusSource(source, documents_per_block))


_OPENED: dict[str, TokenSource] = {}


def _opened(source: TokenSource | str | os.PathLike[str]) -> TokenSource:
    """The store or corpus *source* names, opened once per process."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    name = os.fspath(source)
    if name not in _OPENED:
        opened = open_source(name, verify=False)
        if isinstance(opened, MixtureSource):
            raise ConfigError(f"{name}: a mixture file blends sources per epoch; read one of its sources, or a corpus")
        _OPENED[name] = opened.store
    return _OPENED[name]


def _shards(opened: TokenSource) -> list[tuple[int, DocumentStore]]:
    """``(first document, store)`` of each shard of a corpus (a store: itself)."""
    starts = opened.flat().document_bases[:-1].tolist()
    return [(int(base), shard) for base, shard in zip(starts, opened.shards, strict=True)]


class _CorpusSource(Datasource):  # type: ignore[misc]
    def __init__(self, source: Any, per_block: int) -> None:
        self.source = source if not isinstance(source, os.PathLike) else os.fspath(source)
        opened = _opened(self.source)
        self.ranges = [
            (base + lo, base + min(lo + per_block, len(shard)))
            for base, shard in _shards(opened)
            for lo in range(0, len(shard), per_block)
        ]  # never across a shard
        self.bytes_per_document = 4 * opened.token_count // max(len(opened), 1) + 64

    def estimate_inmemory_data_size(self) -> int:
        return int(sum(hi - lo for lo, hi in self.ranges) * self.bytes_per_document)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[Any]:
        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        count = max(1, min(parallelism, len(self.ranges)))
        groups = [self.ranges[i * len(self.ranges) // count : (i + 1) * len(self.ranges) // count] for i in range(count)]
        tasks = []
        for group in groups:
            if not group:
                continue
            rows = sum(hi - lo for lo, hi in group)
            meta = BlockMetadata(num_rows=rows, size_bytes=rows * self.bytes_per_document, exec_stats=None, input_files=None)
            tasks.append(ReadTask(_reader(self.source, group), meta, per_task_row_limit=per_task_row_limit))
        return tasks


def _reader(source: Any, group: list[tuple[int, int]]) -> Any:
    def read() -> Iterator[Any]:
        opened = _opened(source)
        for lo, hi in group:
            yield _documents_table(opened, lo, hi)

    return read


def _documents_table(opened: TokenSource, lo: int, hi: int) -> Any:
    """Documents ``[lo, hi)`` (within one shard) as a table: their tokens copied in one slice (or one gather)."""
    base, store = next((b, s) for b, s in reversed(_shards(opened)) if b <= lo)
    starts, lengths = store.starts[lo - base : hi - base], store.lengths[lo - base : hi - base]
    first, last = int(starts[0]), int(starts[-1] + lengths[-1])
    if last - first == int(lengths.sum()) and np.array_equal(starts[1:], starts[:-1] + lengths[:-1]):
        positions: npt.NDArray[np.int64] | slice = slice(first, last)  # consecutive: one slice
    else:
        positions = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(int(lengths.sum()))
    tokens = np.asarray(store.tokens[positions])
    where = np.arange(first, last) if isinstance(positions, slice) else positions
    mask = store.mask_at(where) if store.has_loss_mask else None
    ids = [store.ids[i] for i in range(lo - base, hi - base)]
    codes = np.asarray(store.partition_codes[lo - base : hi - base])
    return block_table(Block(tokens, np.asarray(lengths, np.int64), ids, codes, [], loss_mask=mask))


class CorpusSink(Datasink):  # type: ignore[misc]
    """``ds.write_datasink(CorpusSink(output))``: each write task writes a store ``part-NNNNN`` (its task number) in the
    folder *output* (or uploads it to ``s3://``/``gs://``); ``on_write_complete`` writes ``corpus.json`` last.

    Rows are `read_corpus`'s (what `Tokenize` gives).  *tokenizer* (a `Tokenizer`, a
    tokenizer.json path or its ``describe()`` dict) is recorded in every part's header.
    """

    def __init__(self, output: str | os.PathLike[str], *, tokenizer: Any = None) -> None:
        self.output = os.fspath(output)
        described = tokenizer if tokenizer is None or isinstance(tokenizer, dict) else read_options(tokenizer=tokenizer).tokenizer
        self.tokenizer = described if described is None or isinstance(described, dict) else described.describe()

    def on_write_start(self, schema: Any = None) -> None:
        if is_remote(self.output):
            return
        target = Path(self.output)
        if (target / "header.json").exists() or (target.exists() and not target.is_dir()):
            raise StoreError(f"{self.output}: exists and is not a corpus folder; choose a new output path")
        target.mkdir(parents=True, exist_ok=True)
        (target / CORPUS_MANIFEST).unlink(missing_ok=True)  # no manifest stands while the parts change

    def on_write_failed(self, error: Exception) -> None:
        """A failed write (here or upstream, before any part was written) leaves no manifest: not even an old one."""
        if not is_remote(self.output):
            (Path(self.output) / CORPUS_MANIFEST).unlink(missing_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        name = part_name(int(ctx.task_idx))
        remote = is_remote(self.output)
        folder = tempfile.mkdtemp(prefix="streambatch-sink-") if remote else self.output
        try:
            path = os.path.join(folder, name)
            with StoreWriter(path, tokenizer=self.tokenizer) as writer:
                count = 0
                for table in blocks:
                    count += _add_rows(writer, table)
                store = writer.commit()
            if remote:
                from .io.remote.upload import upload_store

                store = upload_store(path, f"{self.output.rstrip('/')}/{name}")
        finally:
            if remote:
                shutil.rmtree(folder, ignore_errors=True)
        return {"index": int(ctx.task_idx), "name": name, "fingerprint": store.fingerprint, "documents": count}

    def on_write_complete(self, write_result: Any) -> None:
        returns = getattr(write_result, "write_returns", write_result)
        written = sorted((r for r in returns if r is not None), key=lambda r: r["index"])
        if not written:
            raise StoreError(f"{self.output}: the dataset wrote no part; nothing to list in {CORPUS_MANIFEST}")
        if is_remote(self.output):
            from .io.remote.upload import write_remote_corpus

            base = self.output.rstrip("/")
            write_remote_corpus(f"{base}/{CORPUS_MANIFEST}", [f"{base}/{r['name']}" for r in written])
            return
        for kind in ("partial", "old"):  # what killed write tasks left
            for r in written:
                remove_stale_temporaries(self.output, partial_prefix(Path(self.output) / r["name"], kind))
        write_corpus(os.path.join(self.output, CORPUS_MANIFEST), [os.path.join(self.output, r["name"]) for r in written])


def _add_rows(writer: StoreWriter, table: Any) -> int:
    """Append a table of document rows (`block_table`'s columns) to *writer*; returns how many."""
    pa = _arrow()
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table)
    missing = [c for c in ("id", "tokens") if c not in table.column_names]
    if missing:
        raise ConfigError(
            f"CorpusSink: the rows have no {missing[0]!r} column (columns: {', '.join(table.column_names)}); "
            "map them with Tokenize first"
        )
    if not table.num_rows:
        return 0
    tokens = table.column("tokens").combine_chunks()
    lengths = tokens.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    flat = tokens.flatten().to_numpy(zero_copy_only=False)
    ids = table.column("id").to_pylist()
    codes: Any = "train"
    if "partition" in table.column_names:
        codes = np.array([_PARTITION_NAMES.index(p) for p in table.column("partition").to_pylist()], np.uint8)
    mask = None
    if "loss_mask" in table.column_names and table.column("loss_mask").null_count < table.num_rows:
        column = table.column("loss_mask").combine_chunks()
        mask = np.ones(flat.size, np.bool_)
        present = ~column.is_null().to_numpy(zero_copy_only=False)
        inside = np.repeat(present, lengths)  # the tokens of the rows that bring a mask, in order
        mask[inside] = column.flatten().to_numpy(zero_copy_only=False)
    writer.add_block(flat.astype(np.uint32), lengths, ids, codes, loss_mask=mask)
    return int(table.num_rows)
