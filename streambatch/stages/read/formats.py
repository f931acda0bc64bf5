"""Stage 1, read, for the formats corpora come in; each reader is lazy and yields `Document`s.

By suffix, in any case (`format_of`):

- ``.jsonl``/``.ndjson``: a document per line, ``tokens``/``input_ids`` as given, or text tokenized;
- any other name (``.txt``...): text, a document per file or per non-blank line;
- ``.parquet``, ``.arrow``/``.feather`` (``arrow`` extra): a document per row, from a token-list or text column;
- ``.npy``: a token array, one document, or split by ``X.offsets.npy`` beside it;
- ``.bin`` (nanoGPT): flat uint16 tokens, split after each separator id;
- a folder saved by ``datasets`` (``hf`` extra): a document per row, like Parquet.

JSONL and text may be compressed: ``.gz`` (stdlib) or ``.zst`` (``zstd`` extra).
Underneath, every format produces `Block`s (consecutive documents packed as flat
tokens + lengths), which is what `streambatch.prepare_store` writes; `documents`
unpacks them.

>>> import numpy as np, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "train.bin"
>>> np.array([5, 6, 0, 7, 0, 8], dtype=np.uint16).tofile(path)
>>> [(d.id, d.tokens.tolist()) for d in iter_bin(path, separator=0)]
[('train.bin:0', [5, 6, 0]), ('train.bin:1', [7, 0]), ('train.bin:2', [8])]
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._checks import is_integer
from ...errors import ConfigError, DataError, StreamBatchError
from ...model.documents import PARTITIONS, Document, Partition
from ...model.validate import TOKEN_LIMIT, check_id, check_offsets, short
from . import inputs as _inputs
from .jsonl import TOKEN_KEYS, jsonl_rows, record_document
from .tokenizers import (
    AUTO,
    ByteTokenizer,
    SpecialId,
    Tokenizer,
    TokenizerSpec,
    as_tokenizer,
    check_vocabulary,
    encode_texts,
    require,
)

TEXT_COLUMNS = ("text",)
TABLE_COLUMNS = (*TOKEN_KEYS, *TEXT_COLUMNS)  # tried in this order when no column is named
BLOCK_TOKENS = 1 << 22  # .npy/.bin documents are packed about 4 Mi tokens at a time
TABLE_ROWS = 4096  # Parquet/Arrow/datasets rows per block


@dataclass(frozen=True, eq=False)
class Block:
    """Consecutive documents packed: flat *tokens*, one length, id, partition code and *where* per document.

    *tokenized* counts the documents the tokenizer made (the others came as token ids).
    """

    tokens: npt.NDArray[Any]
    lengths: npt.NDArray[np.int64]
    ids: list[str]
    codes: npt.NDArray[np.uint8]
    wheres: list[str]
    tokenized: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def label(self, index: int) -> str:
        """How errors name document *index*: ``where (document id=...)``."""
        where, name = self.wheres[index], self.ids[index]
        return f"{where} (document id={name!r})" if where else f"document id={name!r}"

    def documents(self) -> Iterator[Document]:
        """The block's documents, one `Document` each."""
        ends = np.cumsum(self.lengths).tolist()
        start = 0
        for i, end in enumerate(ends):
            yield Document(self.ids[i], PARTITIONS[int(self.codes[i])], self.tokens[start:end], where=self.wheres[i])
            start = end


@dataclass(frozen=True)
class ReadOptions:
    """How files become documents (the options of `iter_files` and `prepare_store`)."""

    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)
    per_line: bool = False
    partition: Partition = Partition.TRAIN
    column: str | None = None
    bin_separator: int | None = None
    bin_dtype: str = "uint16"
    vocab_size: int | None = None  # token inputs must fit this (the tokenizer's, when one is given)


def read_options(
    tokenizer: TokenizerSpec = None,
    *,
    eos_id: SpecialId = AUTO,
    bos_id: SpecialId = AUTO,
    per_line: bool = False,
    partition: Partition | str = Partition.TRAIN,
    column: str | None = None,
    bin_separator: int | None = None,
    bin_dtype: str = "uint16",
) -> ReadOptions:
    """Check the reading options once; an explicit *tokenizer* also bounds token inputs by its vocabulary."""
    tok = as_tokenizer(tokenizer, eos_id=eos_id, bos_id=bos_id)
    if bin_dtype not in ("uint16", "uint32"):
        raise ConfigError(f"bin_dtype={bin_dtype!r} must be 'uint16' or 'uint32'")
    if bin_separator is not None and not (is_integer(bin_separator) and 0 <= bin_separator <= np.iinfo(bin_dtype).max):
        raise ConfigError(f"bin_separator={bin_separator!r} must be a token id that fits {bin_dtype}")
    separator = tok.eos_id if bin_separator is None else int(bin_separator)  # checked against the dtype when a .bin is read
    if column is not None and (not isinstance(column, str) or not column):
        raise ConfigError(f"column={column!r} must be a non-empty column name")
    vocab = tok.vocab_size if tokenizer is not None else None
    return ReadOptions(tok, bool(per_line), Partition.parse(partition), column, separator, bin_dtype, vocab)


def format_of(name: str) -> str:
    """The format of a file, from its suffix in any case: jsonl, text, parquet, arrow, npy, offsets, bin, or unsupported.

    >>> [format_of(n) for n in ["a.ndjson", "B.JSONL.GZ", "c.txt.zst", "d.parquet", "e.offsets.npy", "f.bin", "g.npy.gz"]]
    ['jsonl', 'jsonl', 'text', 'parquet', 'offsets', 'bin', 'unsupported']
    """
    base = _inputs.base_name(name)
    compressed = base != name.lower()
    if base.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    for suffixes, kind in (((".parquet",), "parquet"), ((".arrow", ".feather"), "arrow"), ((".offsets.npy",), "offsets"),
                           ((".npy",), "npy"), ((".bin",), "bin")):  # fmt: skip
        if base.endswith(suffixes):
            return "unsupported" if compressed else kind
    return "text"


# --- blocks from tokens and texts -------------------------------------------------------------------


def _codes(count: int, partition: Partition) -> npt.NDArray[np.uint8]:
    return np.full(count, partition.code, dtype=np.uint8)


def text_block(texts: Sequence[str], ids: list[str], wheres: list[str], codes: npt.NDArray[np.uint8], opts: ReadOptions) -> Block:
    """Tokenize *texts* (one document each) with bos/eos; ids are checked."""
    tokens, lengths = encode_texts(opts.tokenizer, texts, lambda k: f"{wheres[k]} (document id={ids[k]!r})")
    return Block(tokens, lengths, ids, codes, wheres, tokenized=len(ids))


def flat_block(
    tokens: npt.NDArray[Any],
    lengths: npt.NDArray[Any],
    ids: list[str],
    codes: npt.NDArray[np.uint8],
    wheres: list[str],
    opts: ReadOptions,
) -> Block:
    """Token inputs already flat: check the dtype, the range [0, 2**32) and the declared vocabulary."""
    lengths = np.asarray(lengths, dtype=np.int64)
    block = Block(tokens, lengths, ids, codes, wheres)
    if tokens.dtype.kind not in "ui":
        raise DataError(f"{block.label(0)}: tokens have dtype {tokens.dtype}; token ids must be integers")
    if not (tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4) and tokens.size:
        bad = (tokens < 0) | (tokens >= TOKEN_LIMIT)
        if bad.any():
            at = int(np.argmax(bad))
            ends = np.cumsum(lengths)
            doc = int(np.searchsorted(ends, at, side="right"))
            raise DataError(
                f"{block.label(doc)}: token[{at - int(ends[doc] - lengths[doc])}]={int(tokens[at])} is outside [0, 2**32); "
                "token ids must fit in uint32"
            )
        block = Block(tokens.astype(np.uint32), lengths, ids, codes, wheres)
    check_vocabulary(block.tokens, lengths, block.label, opts.vocab_size, opts.tokenizer.name)
    return block


def rows_block(rows: Sequence[tuple[str, str, Any]], opts: ReadOptions) -> Block:
    """Rows ``(where, default id, row)``: tokens/input_ids rows as they are, text rows tokenized, in order."""
    column = opts.column or TEXT_COLUMNS[0]
    ids: list[str] = []
    wheres: list[str] = []
    codes = bytearray()
    arrays: list[npt.NDArray[Any]] = []
    texts: list[str] = []
    text_at: list[int] = []
    for where, default_id, row in rows:
        if isinstance(row, Mapping) and not any(k in row for k in TOKEN_KEYS) and column in row:
            text = row[column]
            if not isinstance(text, str):
                raise DataError(f"{where}: {column}={short(text)} is not a string; text rows hold text to tokenize")
            label = f"{where} (document id={row.get('id', default_id)!r})"
            doc_id = check_id(row.get("id", default_id), label)
            codes.append(Partition.parse(row.get("partition", opts.partition), label).code)
            text_at.append(len(arrays))
            texts.append(text)
            arrays.append(np.zeros(0, np.uint32))  # replaced below
        else:
            if isinstance(row, Mapping) and not any(k in row for k in TOKEN_KEYS):
                raise DataError(
                    f"{where}: missing key(s) tokens; each row needs tokens (or input_ids), or {column!r} text to tokenize"
                )
            doc = record_document(row, where, default_id, opts.partition)
            doc_id = doc.id
            codes.append(doc.partition.code)
            arrays.append(doc.tokens)
        ids.append(doc_id)
        wheres.append(where)
    if texts:
        made = text_block(
            texts, [ids[i] for i in text_at], [wheres[i] for i in text_at], _codes(len(texts), opts.partition), opts
        )
        for i, piece in zip(text_at, np.split(made.tokens, np.cumsum(made.lengths)[:-1]), strict=True):
            arrays[i] = piece
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
    block = flat_block(tokens, lengths, ids, np.frombuffer(bytes(codes), np.uint8).copy(), wheres, opts)
    return Block(block.tokens, block.lengths, ids, block.codes, wheres, tokenized=len(texts))


# --- text and JSONL --------------------------------------------------------------------------------


def text_file_block(path: str, name: str, opts: ReadOptions) -> Block:
    """A whole text file as one document (id *name*)."""
    text = _inputs.decode(_inputs.read_bytes(path), path)
    return text_block([text], [name], [path], _codes(1, opts.partition), opts)


def text_lines_block(chunk: _inputs.LineChunk, path: str, name: str, opts: ReadOptions) -> Block:
    """Each non-blank line of a chunk as a document (id ``name:line``)."""
    text = _inputs.decode(chunk.data, path, chunk.offset)
    units = [(n, line) for n, line in _inputs.split_lines(text, chunk.first_line) if line.strip()]
    ids = [f"{name}:{n}" for n, _ in units]
    wheres = [f"{path}:{n}" for n, _ in units]
    return text_block([line for _, line in units], ids, wheres, _codes(len(units), opts.partition), opts)


def jsonl_block(chunk: _inputs.LineChunk, path: str, name: str, opts: ReadOptions) -> Block:
    """Each non-blank line of a JSONL chunk as a document (default id ``name:line``)."""
    return rows_block([(w, f"{name}:{n}", row) for w, n, row in jsonl_rows(chunk, path)], opts)


# --- Parquet, Arrow, datasets ----------------------------------------------------------------------


def table_block(table: Any, path: str, name: str | None, first_row: int, opts: ReadOptions) -> Block:
    """Rows of a pyarrow Table: a token-list or text column, with optional ``id`` and ``partition`` columns.

    Ids default to ``name:row`` (the row number alone without *name*); errors name ``path row N``.
    """
    pa = require("pyarrow", "arrow", "reading Parquet/Arrow tables")
    names = list(table.column_names)
    column = opts.column or next((c for c in TABLE_COLUMNS if c in names), None)
    if column is None or column not in names:
        wanted = repr(column) if column else " or ".join(TABLE_COLUMNS)
        raise DataError(f"{path}: no column {wanted} (columns: {', '.join(names)}); pass --column NAME (column=)")
    rows = range(first_row, first_row + table.num_rows)
    wheres = [f"{path} row {r}" if path else f"row {r}" for r in rows]
    ids = _table_ids(table, names, name, rows, wheres)
    codes = _table_codes(table, names, wheres, opts.partition)
    values = table.column(column).combine_chunks()
    kind = values.type
    if values.null_count:
        at = int(np.argmax(values.is_null().to_numpy(zero_copy_only=False)))
        raise DataError(f"{wheres[at]}: {column} is null; every row needs token ids or text")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return text_block(values.to_pylist(), ids, wheres, codes, opts)
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) and pa.types.is_integer(
        kind.value_type
    ):
        flat = values.flatten()
        if flat.null_count:
            lengths = values.value_lengths().to_numpy(zero_copy_only=False)
            at = int(np.argmax(flat.is_null().to_numpy(zero_copy_only=False)))
            doc = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
            raise DataError(f"{wheres[doc]}: {column} holds a null token id; token ids must be integers")
        lengths = values.value_lengths().to_numpy(zero_copy_only=False)
        return flat_block(flat.to_numpy(zero_copy_only=False), lengths, ids, codes, wheres, opts)
    raise DataError(f"{path}: column {column!r} has type {kind}; it must hold token ids (a list of integers) or text (string)")


def _table_ids(table: Any, names: list[str], name: str | None, rows: range, wheres: list[str]) -> list[str]:
    if "id" not in names:
        return [f"{name}:{r}" if name is not None else str(r) for r in rows]
    ids = []
    for value, where in zip(table.column("id").to_pylist(), wheres, strict=True):
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        ids.append(check_id(value, where))
    return ids


def _table_codes(table: Any, names: list[str], wheres: list[str], partition: Partition) -> npt.NDArray[np.uint8]:
    if "partition" not in names:
        return _codes(len(wheres), partition)
    values = table.column("partition").to_pylist()
    return np.fromiter(
        (Partition.parse(v, w).code for v, w in zip(values, wheres, strict=True)), dtype=np.uint8, count=len(values)
    )


def table_error(path: str, what: str, err: BaseException) -> DataError:
    """A failure of pyarrow/datasets to read *path* as a `DataError` (so --skip-bad can leave it out)."""
    return DataError(f"{path}: cannot read as {what} ({type(err).__name__}: {err}); check the file, or leave it out (--skip-bad)")


def _foreign(err: BaseException) -> bool:
    # what pyarrow, datasets and numpy raise for a file they cannot read (pyarrow's own classes subclass these)
    if isinstance(err, StreamBatchError):
        return False
    return isinstance(err, (OSError, ValueError, EOFError, TypeError, KeyError, IndexError, NotImplementedError))


def parquet_row_groups(path: str) -> list[int]:
    """The number of rows of each row group of a Parquet file."""
    pq = require("pyarrow.parquet", "arrow", "reading Parquet files")
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as err:
        if _foreign(err):
            raise table_error(path, "Parquet", err) from err
        raise
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def parquet_blocks(path: str, name: str, group: int, first_row: int, opts: ReadOptions) -> Iterator[Block]:
    """The rows of one row group of a Parquet file, `TABLE_ROWS` at a time."""
    pa = require("pyarrow", "arrow", "reading Parquet files")
    pq = require("pyarrow.parquet", "arrow", "reading Parquet files")
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=TABLE_ROWS, row_groups=[group])
        for batch in batches:
            yield table_block(pa.Table.from_batches([batch]), path, name, first_row, opts)
            first_row += batch.num_rows
    except Exception as err:
        if _foreign(err):
            raise table_error(path, "Parquet", err) from err
        raise


def arrow_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """The rows of an Arrow IPC file (file or stream format; ``.arrow``, ``.feather``)."""
    pa = require("pyarrow", "arrow", "reading Arrow files")
    try:
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterable[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            batches = pa.ipc.open_stream(source)
        first_row = 0
        for batch in batches:
            yield table_block(pa.Table.from_batches([batch]), path, name, first_row, opts)
            first_row += batch.num_rows
    except Exception as err:
        if _foreign(err):
            raise table_error(path, "Arrow IPC", err) from err
        raise


def is_dataset_folder(path: Path) -> bool:
    """True for a folder written by ``datasets.Dataset.save_to_disk``."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


_DATASETS: dict[str, Any] = {}


def load_dataset_folder(path: str) -> Any:
    """``datasets.load_from_disk`` for one split's folder (memory-mapped; cached per process)."""
    if path not in _DATASETS:
        datasets = require("datasets", "hf", "reading saved Hugging Face datasets")
        try:
            _DATASETS[path] = datasets.load_from_disk(path).with_format("arrow")
        except Exception as err:
            raise table_error(path, "a saved Hugging Face dataset", err) from err
        if not hasattr(_DATASETS[path], "num_rows") or isinstance(_DATASETS[path].num_rows, dict):
            del _DATASETS[path]
            raise DataError(f"{path}: a DatasetDict; pass one split's folder (e.g. {path}/train)")
    return _DATASETS[path]


def dataset_rows_blocks(path: str, name: str, start: int, stop: int, opts: ReadOptions) -> Iterator[Block]:
    """Rows [start, stop) of a saved Hugging Face dataset folder."""
    dataset = load_dataset_folder(path)
    for lo in range(start, stop, TABLE_ROWS):
        yield table_block(dataset[lo : min(stop, lo + TABLE_ROWS)], path, name, lo, opts)


# --- .npy and nanoGPT .bin ------------------------------------------------------------------------


def offsets_path(path: str) -> str:
    """The offsets file that splits ``X.npy`` into documents: ``X.offsets.npy``."""
    return path[:-4] + ".offsets.npy"


def _load_npy(path: str, what: str) -> npt.NDArray[Any]:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        if _foreign(err):
            raise DataError(f"{path}: not a .npy array ({err}); check the file, or leave it out (--skip-bad)") from err
        raise
    if not isinstance(array, np.ndarray):
        raise DataError(f"{path}: an .npz archive, not a .npy array; save each array with numpy.save")
    if array.ndim != 1 or array.dtype.kind not in "ui":
        raise DataError(f"{path}: a {array.dtype} array of shape {array.shape}; {what} must be a 1-D integer array")
    return np.asarray(array)


def npy_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """A ``.npy`` token array: one document (id *name*), or one per ``X.offsets.npy`` span (id ``name:k``)."""
    tokens = _load_npy(path, "a token file")
    index = offsets_path(path)
    if not os.path.exists(index):
        yield flat_block(tokens, np.array([tokens.size]), [name], _codes(1, opts.partition), [path], opts)
        return
    offsets = np.asarray(_load_npy(index, "an offsets file"), dtype=np.int64)
    try:
        check_offsets(offsets, int(tokens.size), "offsets")
    except DataError as err:
        raise DataError(f"{index}: {err}") from err
    count, k = offsets.size - 1, 0
    while k < count:
        stop = max(k + 1, int(np.searchsorted(offsets, offsets[k] + BLOCK_TOKENS, side="right")) - 1)
        stop = min(stop, count)
        lengths = np.diff(offsets[k : stop + 1])
        ids = [f"{name}:{j}" for j in range(k, stop)]
        wheres = [f"{path} document {j}" for j in range(k, stop)]
        yield flat_block(
            np.asarray(tokens[offsets[k] : offsets[stop]]), lengths, ids, _codes(stop - k, opts.partition), wheres, opts
        )
        k = stop


def check_bin_separator(path: str, opts: ReadOptions) -> None:
    """Raise `ConfigError` unless .bin files can be split: a separator is set and fits the dtype."""
    if opts.bin_separator is None:
        raise ConfigError(
            f"{path}: .bin files are split at a separator token, and none is set; pass --bin-separator ID "
            "(e.g. 50256 for GPT-2's <|endoftext|>) or --eos-id"
        )
    if opts.bin_separator > np.iinfo(opts.bin_dtype).max:
        raise ConfigError(
            f"{path}: the separator (the eos id, {opts.bin_separator}) does not fit {opts.bin_dtype}; "
            "pass --bin-separator ID or --bin-dtype uint32"
        )


def bin_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """A flat nanoGPT-style token file, split after every separator id (it ends its document).

    The documents' concatenation is the file; ids are ``name:k``.
    """
    check_bin_separator(path, opts)
    dtype = np.dtype(opts.bin_dtype).newbyteorder("<")
    try:
        size = os.path.getsize(path)
        if size % dtype.itemsize:
            raise DataError(
                f"{path}: {size} bytes is not a whole number of {opts.bin_dtype} tokens; pass --bin-dtype or check the file"
            )
        data = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except OSError as err:
        raise _inputs.read_error(path, err) from err
    start, doc, total = 0, 0, int(data.size)
    for lo in range(0, total, BLOCK_TOKENS):
        ends = np.flatnonzero(data[lo : lo + BLOCK_TOKENS] == opts.bin_separator) + (lo + 1)
        if ends.size:
            yield _bin_block(data, path, name, start, doc, ends, opts)
            start, doc = int(ends[-1]), doc + int(ends.size)
    if start < total:
        yield _bin_block(data, path, name, start, doc, np.array([total]), opts)


def _bin_block(data: Any, path: str, name: str, start: int, doc: int, ends: npt.NDArray[Any], opts: ReadOptions) -> Block:
    lengths = np.diff(ends, prepend=start)
    ids = [f"{name}:{k}" for k in range(doc, doc + ends.size)]
    wheres = [f"{path} document {k}" for k in range(doc, doc + ends.size)]
    return flat_block(np.asarray(data[start : int(ends[-1])]), lengths, ids, _codes(ends.size, opts.partition), wheres, opts)


# --- selecting input files ------------------------------------------------------------------------


@dataclass(frozen=True)
class InputFile:
    """One selected input: its *path*, its document id *name*, the *relative* path globs match, its *kind*."""

    path: Path
    name: str
    relative: str
    kind: str


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/n"`` (or ``(i, n)``) as ``(i, n)`` with ``0 <= i < n``; None stays None.

    >>> parse_shard("2/8")
    (2, 8)
    """
    if shard is None:
        return None
    parts: Any = shard.split("/") if isinstance(shard, str) else shard
    try:
        index, count = (int(p) for p in parts) if isinstance(shard, str) else parts
    except (TypeError, ValueError):
        index = count = None
    if not (is_integer(index) and is_integer(count) and 0 <= int(index) < int(count)):  # type: ignore[arg-type]
        raise ConfigError(f"shard={shard!r} must be i/n with 0 <= i < n (e.g. 0/4); pass this machine's share of n")
    return int(index), int(count)  # type: ignore[arg-type]


def select_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    shard: str | tuple[int, int] | None = None,
) -> list[InputFile]:
    """The input files, in order: inputs as given, each folder's files sorted by relative path (hidden
    entries skipped; a folder saved by ``datasets`` is one input; ``X.offsets.npy`` goes with ``X.npy``).

    *include*/*exclude* globs (`fnmatch`, case-sensitive, ``*`` also crosses ``/``)
    match each file's path relative to its input folder (a file given directly:
    its name); a file is kept if it matches some include (when any) and no
    exclude.  *shard* ``"i/n"`` then keeps files ``[i*F//n, (i+1)*F//n)`` of the F
    left: contiguous runs, so the shards in order are the whole.  A file's
    ``name`` (its documents' id) is its path relative to its input folder,
    prefixed with the folder's name when several inputs are given; a file given
    directly keeps the path as given.
    """
    if isinstance(inputs, (str, os.PathLike)):
        raise ConfigError(f"inputs={os.fspath(inputs)!r} is one path; pass a list of files and folders")
    several = len(inputs) > 1
    files: list[InputFile] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            prefix = f"{path.name or path.resolve().name}/" if several else ""
            files.extend(sorted(_walk(path, prefix, os.fspath(raw)), key=lambda f: f.relative))
        elif path.is_file():
            files.append(InputFile(path, os.fspath(raw), path.name, format_of(path.name)))
        else:
            raise DataError(f"input {os.fspath(raw)!r} does not exist; pass files or folders")
    kept = [
        f
        for f in files
        if (not include or any(fnmatch.fnmatchcase(f.relative, g) for g in include))
        and not any(fnmatch.fnmatchcase(f.relative, g) for g in exclude)
    ]
    part = parse_shard(shard)
    if part is None:
        return kept
    index, count = part
    return kept[index * len(kept) // count : (index + 1) * len(kept) // count]


def _walk(folder: Path, prefix: str, given: str) -> Iterator[InputFile]:
    if is_dataset_folder(folder):
        yield InputFile(folder, prefix.rstrip("/") or given, folder.name, "dataset")
        return
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        for d in sorted(dirs):
            if not d.startswith(".") and is_dataset_folder(here / d):
                relative = (here / d).relative_to(folder).as_posix()
                yield InputFile(here / d, prefix + relative, relative, "dataset")
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not is_dataset_folder(here / d))
        present = set(names)
        for name in sorted(names):
            if name.startswith("."):
                continue
            kind = format_of(name)
            if kind == "offsets" and name[: -len(".offsets.npy")] + ".npy" in present:
                continue  # read with its token file
            relative = (here / name).relative_to(folder).as_posix()
            yield InputFile(here / name, prefix + relative, relative, kind)


# --- the public readers ----------------------------------------------------------------------------


def documents(blocks: Iterable[Block]) -> Iterator[Document]:
    """Unpack blocks into documents, lazily."""
    for block in blocks:
        yield from block.documents()


def _options(tokenizer: TokenizerSpec, partition: Partition | str, **more: Any) -> ReadOptions:
    return read_options(tokenizer, partition=partition, **more)


def iter_text(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: TokenizerSpec = None,
    per_line: bool = False,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """Tokenize UTF-8 text files (``.gz``/``.zst`` too) or folders of them into documents, lazily.

    One document per file (id: the path relative to its folder), or with
    *per_line* one per non-blank line (id ``path:line``; lines end at ``\\n``).
    *tokenizer*: a `Tokenizer`, a tokenizer.json path, or any ``str -> ids``
    callable; the byte-level tokenizer by default.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    opts = _options(tokenizer, partition, per_line=per_line)
    files = select_inputs(items)
    return _iter_text(files, opts)


def _iter_text(files: Any, opts: ReadOptions) -> Iterator[Document]:
    for file in files:
        if not opts.per_line:
            yield from text_file_block(str(file.path), file.name, opts).documents()
            continue
        for chunk in _inputs.line_chunks(file.path, _inputs.LINE_CHUNK_BYTES):
            yield from text_lines_block(chunk, str(file.path), file.name, opts).documents()


def iter_parquet(
    path: str | os.PathLike[str],
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """One document per row of a Parquet file (the ``arrow`` extra), lazily.

    *column* holds token ids (a list of integers) or text (a string, tokenized by
    *tokenizer*); by default the first of ``tokens``, ``input_ids``, ``text``.  An
    ``id`` column gives ids (else ``file:row``), a ``partition`` column partitions
    (else *partition*).
    """
    name = os.fspath(path)
    opts = _options(tokenizer, partition, column=column)
    return _iter_parquet(name, opts)


def _iter_parquet(name: str, opts: ReadOptions) -> Iterator[Document]:
    first = 0
    for group, rows in enumerate(parquet_row_groups(name)):
        yield from documents(parquet_blocks(name, Path(name).name, group, first, opts))
        first += rows


def iter_arrow(
    path: str | os.PathLike[str],
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """One document per row of an Arrow IPC file (``.arrow``/``.feather``), like `iter_parquet`."""
    name = os.fspath(path)
    return documents(arrow_blocks(name, Path(name).name, _options(tokenizer, partition, column=column)))


def iter_npy(path: str | os.PathLike[str], *, partition: Partition | str = Partition.TRAIN) -> Iterator[Document]:
    """A ``.npy`` token array as one document, or split by ``X.offsets.npy`` (``len + 1`` offsets from 0), lazily.

    >>> import numpy as np, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> np.save(folder / "t.npy", np.arange(5, dtype=np.uint16)); np.save(folder / "t.offsets.npy", np.array([0, 2, 5]))
    >>> [(d.id, d.tokens.tolist()) for d in iter_npy(folder / "t.npy")]
    [('t.npy:0', [0, 1]), ('t.npy:1', [2, 3, 4])]
    """
    name = os.fspath(path)
    return documents(npy_blocks(name, Path(name).name, _options(None, partition)))


def iter_bin(
    path: str | os.PathLike[str], *, separator: int, dtype: str = "uint16", partition: Partition | str = Partition.TRAIN
) -> Iterator[Document]:
    """A nanoGPT-style flat token file (little-endian *dtype*), split after each *separator* id, lazily.

    Each document ends with its separator (the last one may not), so the
    documents' concatenation is the file.
    """
    name = os.fspath(path)
    opts = _options(None, partition, bin_separator=separator, bin_dtype=dtype)
    return documents(bin_blocks(name, Path(name).name, opts))


def iter_hf(
    dataset: Any,
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
    batch_size: int = TABLE_ROWS,
) -> Iterator[Document]:
    """One document per row of a Hugging Face ``Dataset`` or ``IterableDataset`` (or any iterable of dicts).

    Rows hold token ids (``tokens``/``input_ids``) or text (``text``, or *column*)
    tokenized by *tokenizer* in batches; ``id`` and ``partition`` columns are used
    when present (ids default to the row number).
    """
    opts = _options(tokenizer, partition, column=column)
    if hasattr(dataset, "with_format"):
        return _iter_hf_tables(dataset.with_format("arrow").iter(batch_size=batch_size), opts)
    if isinstance(dataset, (str, bytes, Mapping)) or not isinstance(dataset, Iterable):
        raise ConfigError(f"dataset={short(dataset)} is not a dataset or an iterable of rows")
    return _iter_hf_rows(dataset, opts, batch_size)


def _iter_hf_tables(tables: Iterable[Any], opts: ReadOptions) -> Iterator[Document]:
    first = 0
    for table in tables:
        yield from table_block(table, "", None, first, opts).documents()
        first += table.num_rows


def _iter_hf_rows(rows: Iterable[Any], opts: ReadOptions, batch_size: int) -> Iterator[Document]:
    batch: list[tuple[str, str, Any]] = []
    for index, row in enumerate(rows):
        batch.append((f"row {index}", str(index), row))
        if len(batch) == batch_size:
            yield from rows_block(batch, opts).documents()
            batch = []
    if batch:
        yield from rows_block(batch, opts).documents()
