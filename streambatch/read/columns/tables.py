"""Rows of Arrow tables (Parquet, Arrow IPC, Hugging Face datasets) as blocks: a token-list or text column.

Shared by `streambatch.read.columns.parquet`, `.arrow` and `.hf`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DataError
from ...io.files import short_path
from ...model.documents import Partition
from ...model.mask import check_loss_mask, labels_mask
from ...model.validate import check_id
from ..blocks import Block, ReadOptions, flat_block, partition_codes, text_block
from ..inputs import is_format_error
from ..jsonl import TEXT_COLUMNS, TOKEN_KEYS, rows_block
from ..text.labels import MASK_KEYS, agreed, mask_of_labels
from ..text.tokenizers import require

TABLE_COLUMNS = (*TOKEN_KEYS, *TEXT_COLUMNS)  # tried in this order when no column is named
TABLE_ROWS = 4096  # Parquet/Arrow/datasets rows per block


def table_block(table: Any, path: str, name: str | None, first_row: int, opts: ReadOptions) -> Block:
    """Rows of a pyarrow Table: a token-list or text column, with optional ``id`` and ``partition`` columns.

    Ids default to ``name:row`` (the row number alone without *name*); errors name ``path row N``.
    """
    pa = require("pyarrow", "arrow", "reading Parquet/Arrow tables")
    names = list(table.column_names)
    if _text_rows(names, opts):  # prompt/completion pairs or chats: read as rows, the way JSONL rows are
        return _rows_block(table, names, path, name, first_row, opts)
    column = opts.column or next((c for c in TABLE_COLUMNS if c in names), None)
    if column is None or column not in names:
        wanted = repr(column) if column else " or ".join(TABLE_COLUMNS)
        raise DataError(f"{short_path(path)}: no column {wanted} (columns: {', '.join(names)}); pass --column NAME (column=)")
    rows = range(first_row, first_row + table.num_rows)
    shown = short_path(path) if path else ""
    wheres = [f"{shown} row {r}" if shown else f"row {r}" for r in rows]
    ids = _table_ids(table, names, name, rows, wheres)
    codes = _tablepartition_codes(table, names, wheres, opts.partition)
    values = plain_values(table.column(column), pa).combine_chunks()
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
        tokens = flat.to_numpy(zero_copy_only=False)
        mask = _mask_column(table, names, tokens, lengths, wheres, pa, opts.labels_shifted)
        return flat_block(tokens, lengths, ids, codes, wheres, opts, mask)
    raise DataError(
        f"{short_path(path)}: column {column!r} has type {kind}; it must hold token ids (a list of integers) or text (string)"
    )


def _text_rows(names: list[str], opts: ReadOptions) -> bool:
    """Whether the table holds prompt/completion or chat rows for the options (and no token column)."""
    if any(k in names for k in TOKEN_KEYS):
        return False
    chat = opts.chat_template is not None and "messages" in names
    return chat or (opts.prompt_field is not None and opts.prompt_field in names)


def _rows_block(table: Any, names: list[str], path: str, name: str | None, first_row: int, opts: ReadOptions) -> Block:
    """The table's rows as dicts of the fields a text row uses, through `rows_block`."""

    fields = [f for f in ("id", "partition", "messages", opts.prompt_field, opts.completion_field) if f and f in names]
    rows = table.select(fields).to_pylist()
    shown = short_path(path) if path else ""
    listed = []
    for offset, row in enumerate(rows):
        number = first_row + offset
        if isinstance(row.get("id"), int) and not isinstance(row.get("id"), bool):
            row["id"] = str(row["id"])
        listed.append((f"{shown} row {number}" if shown else f"row {number}", f"{name}:{number}" if name else str(number), row))
    return rows_block(listed, opts)


def _mask_column(
    table: Any, names: list[str], flat_tokens: Any, lengths: Any, wheres: list[str], pa: Any, shifted: bool
) -> npt.NDArray[np.bool_] | None:
    """The flat loss mask of a token table's ``labels``/``loss_mask``/``assistant_masks`` columns (several must agree;
    labels as `streambatch.read.text.labels` reads them), or None."""
    keys = [k for k in MASK_KEYS if k in names]
    if not keys:
        return None
    masks = {}
    for key in keys:
        values = table.column(key).combine_chunks()
        if values.null_count or not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
            bad = int(np.argmax(values.is_null().to_numpy(zero_copy_only=False))) if values.null_count else 0
            raise DataError(f"{wheres[bad]}: {key} must be a list per row (of ints for labels, 0/1 or bools for masks)")
        sizes = values.value_lengths().to_numpy(zero_copy_only=False)
        if not np.array_equal(sizes, lengths):
            at = int(np.argmax(sizes != lengths))
            raise DataError(
                f"{wheres[at]}: {key} has {int(sizes[at])} entries for {int(lengths[at])} tokens; align it with the tokens"
            )
        flat = values.flatten().to_numpy(zero_copy_only=False)
        where = wheres[0] if wheres else key
        if key == "labels":
            labels_mask(flat, flat.size, where)  # ints, one per token
            masks[key] = mask_of_labels(flat, flat_tokens, lengths, lambda k: wheres[k], shifted)
        else:
            masks[key] = check_loss_mask(flat, flat.size, f"{where}: {key}")
    return agreed(masks, lengths, lambda k: wheres[k])


def plain_values(values: Any, pa: Any) -> Any:
    """A column's values in their plain type: dictionary-encoded text (Parquet's default for repeated values) decoded.

    Also string views (pyarrow 16+), read as large strings.
    """
    kind = values.type
    if pa.types.is_dictionary(kind):
        values, kind = values.cast(kind.value_type), kind.value_type
    if getattr(pa.types, "is_string_view", lambda _: False)(kind):
        values = values.cast(pa.large_string())
    return values


def _table_ids(table: Any, names: list[str], name: str | None, rows: range, wheres: list[str]) -> list[str]:
    if "id" not in names:
        return [f"{name}:{r}" if name is not None else str(r) for r in rows]
    ids = []
    for value, where in zip(table.column("id").to_pylist(), wheres, strict=True):
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        ids.append(check_id(value, where))
    return ids


def _tablepartition_codes(table: Any, names: list[str], wheres: list[str], partition: Partition) -> npt.NDArray[np.uint8]:
    if "partition" not in names:
        return partition_codes(len(wheres), partition)
    values = table.column("partition").to_pylist()
    return np.fromiter(
        (Partition.parse(v, w).code for v, w in zip(values, wheres, strict=True)), dtype=np.uint8, count=len(values)
    )


def validated(table: Any, path: str, what: str) -> Any:
    """*table* (a pyarrow Table or RecordBatch) once fully validated (offsets, lengths, UTF-8), before anything reads it.

    A damaged file can hold offsets that point outside its buffers: reading them
    without this check crashes the process.  Failures are `DataError`s naming *path*.
    """
    try:
        table.validate(full=True)
    except Exception as err:
        if is_format_error(err):
            raise table_error(path, what, err) from err
        raise
    return table


def table_error(path: str, what: str, err: BaseException) -> DataError:
    """A failure of pyarrow/datasets to read *path* as a `DataError` (so --skip-bad can leave it out)."""
    return DataError(
        f"{short_path(path)}: cannot read as {what} ({type(err).__name__}: {err}); check the file, or leave it out (--skip-bad)"
    )
