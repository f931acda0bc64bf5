"""Hugging Face datasets (the ``hf`` extra): folders saved by ``save_to_disk``, and `Dataset` objects or rows."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DataError, StreamBatchError
from ...io.files import check_regular, short_path
from ...model.documents import Document, Partition
from ...model.validate import short
from ..blocks import Block, ReadOptions, read_options
from ..inputs import MAX_DOCUMENT_BYTES, is_format_error
from ..jsonl import rows_block
from ..text.chat import RENDER_SECONDS
from ..text.tokenizers import TokenizerSpec, require
from .tables import TABLE_ROWS, table_block, table_error, validated


def is_dataset_folder(path: Path) -> bool:
    """True for a folder written by ``datasets.Dataset.save_to_disk``."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


_DATASETS: dict[str, Any] = {}
_WHAT = "a saved Hugging Face dataset"


def load_dataset_folder(path: str) -> Any:
    """``datasets.load_from_disk`` for one split's folder (memory-mapped; cached per process)."""
    if path not in _DATASETS:
        datasets = require("datasets", "hf", "reading saved Hugging Face datasets")
        try:
            for entry in os.scandir(path):  # datasets opens them by name: a FIFO among them would block it
                if not entry.is_dir():
                    check_regular(entry.path)
            _DATASETS[path] = datasets.load_from_disk(path).with_format("arrow")
        except StreamBatchError:
            raise
        except Exception as err:  # whatever a damaged folder makes datasets raise
            raise table_error(path, _WHAT, err) from err
        if not hasattr(_DATASETS[path], "num_rows") or isinstance(_DATASETS[path].num_rows, dict):
            del _DATASETS[path]
            raise DataError(f"{short_path(path)}: a DatasetDict; pass one split's folder (e.g. {short_path(path)}/train)")
    return _DATASETS[path]


def dataset_rows_blocks(path: str, name: str, start: int, stop: int, opts: ReadOptions) -> Iterator[Block]:
    """Rows [start, stop) of a saved Hugging Face dataset folder."""
    dataset = load_dataset_folder(path)
    for lo in range(start, stop, TABLE_ROWS):
        try:
            table = validated(dataset[lo : min(stop, lo + TABLE_ROWS)], path, _WHAT)  # before anything reads it
        except Exception as err:
            if is_format_error(err):
                raise table_error(path, _WHAT, err) from err
            raise
        yield table_block(table, path, name, lo, opts)


def iter_hf(
    dataset: Any,
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
    batch_size: int = TABLE_ROWS,
    prompt_field: str | None = None,
    completion_field: str | None = None,
    chat_template: Any = None,
    skip_untrained_documents: bool = False,
    labels_shifted: bool = False,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    chat_render_seconds: float = RENDER_SECONDS,
) -> Iterator[Document]:
    """One document per row of a Hugging Face ``Dataset`` or ``IterableDataset`` (or any iterable of dicts).

    Rows hold token ids (``tokens``/``input_ids``) or text (``text``, or *column*)
    tokenized by *tokenizer* in batches; ``id`` and ``partition`` columns are used
    when present (ids default to the row number).  Loss masks come from ``labels``,
    ``loss_mask`` or ``assistant_masks`` columns, from *prompt_field*/*completion_field*
    text pairs, or from ``messages`` rendered by *chat_template*; *labels_shifted*, *max_document_bytes* and
    *chat_render_seconds* as in `read_options`.
    """
    opts = read_options(
        tokenizer=tokenizer,
        partition=partition,
        column=column,
        prompt_field=prompt_field,
        completion_field=completion_field,
        chat_template=chat_template,
        skip_untrained_documents=skip_untrained_documents,
        labels_shifted=labels_shifted,
        max_document_bytes=max_document_bytes,
        chat_render_seconds=chat_render_seconds,
    )
    if hasattr(dataset, "with_format"):
        return _iter_hf_tables(dataset.with_format("arrow").iter(batch_size=batch_size), opts)
    if isinstance(dataset, (str, bytes, Mapping)) or not isinstance(dataset, Iterable):
        raise ConfigError(f"dataset={short(dataset)} is not a dataset or an iterable of rows")
    return _iter_hf_rows(dataset, opts, batch_size)


def _iter_hf_tables(tables: Iterable[Any], opts: ReadOptions) -> Iterator[Document]:
    first = 0
    for table in tables:
        block = table_block(validated(table, "dataset", _WHAT), "", None, first, opts)
        yield from block.with_masks(opts.skip_untrained_documents).documents()
        first += table.num_rows


def _iter_hf_rows(rows: Iterable[Any], opts: ReadOptions, batch_size: int) -> Iterator[Document]:
    batch: list[tuple[str, str, Any]] = []
    for index, row in enumerate(rows):
        batch.append((f"row {index}", str(index), row))
        if len(batch) == batch_size:
            yield from rows_block(batch, opts).with_masks(opts.skip_untrained_documents).documents()
            batch = []
    if batch:
        yield from rows_block(batch, opts).with_masks(opts.skip_untrained_documents).documents()
