"""The JSON record of one batch, as the ``epoch`` command writes it (one line per batch).

A window batch's record: ``epoch``, ``index``, ``shape``, ``token_count``, each
row's provenance, and the ``inputs``/``targets`` rows.  A packed batch's record
(``--pack``) adds ``pack``, ``pad_positions``, ``segment_ids``, ``position_ids``
and ``loss_mask``, and each of its ``rows`` lists its segments; ``token_count``
counts real targets only.

A record is made in pieces (`record_pieces`) of at most about a megabyte, so
writing one never holds more than the batch itself and a piece: the arrays are
turned into text a slice at a time, never into one Python list of every token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..batch.minibatch import MiniBatch

_PIECE = 1 << 16  # numbers turned into text at a time: about a megabyte of JSON
ARRAY_FIELDS = ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")
"""The record's per-position arrays, in record order (a window record holds the first two, and ``loss_mask`` when
its store has a loss mask)."""


def record_arrays(batch: MiniBatch) -> dict[str, Any]:
    """The per-position arrays the record of *batch* holds (numpy ``(w, T)``), by field name."""
    if batch.packed:
        names: tuple[str, ...] = ARRAY_FIELDS
    elif batch.loss_mask is not None:  # a masked window batch: True at the targets that train
        names = (*ARRAY_FIELDS[:2], "loss_mask")
    else:
        names = ARRAY_FIELDS[:2]
    return {name: getattr(batch, name) for name in names}


def batch_record(batch: MiniBatch, *, arrays: bool = True) -> dict[str, Any]:
    """One batch as the JSON object ``streambatch epoch`` writes (a corpus row names its shard, a mixture row its source).

    A packed batch (``--pack``) has the same ``epoch``, ``index``, ``shape``,
    ``token_count`` (its real targets: the denominator, padding never counted),
    ``rows``, ``inputs`` and ``targets``, plus ``pack: true`` and
    ``pad_positions``; each entry of ``rows`` is ``{"row": its number in the
    packing, "segments": [...]}``, a segment naming what a window row names
    (document, document_index, start, partition, shard) and its ``length`` in
    targets (a mixture's row also names its ``source``, and its ``row`` is its
    number in that source's packing); ``segment_ids`` (-1 at padding),
    ``position_ids`` and ``loss_mask`` follow the targets.  Padding positions hold the pad id in
    inputs and targets, with ``loss_mask`` false.  A window batch of a store with a
    loss mask carries ``loss_mask`` after its targets (true at the targets that
    train); its ``token_count`` counts those.
    """
    record = _packed_record(batch) if batch.packed else _window_record(batch)
    if arrays:
        record.update((name, values.tolist()) for name, values in record_arrays(batch).items())
    return record


def _window_record(batch: MiniBatch) -> dict[str, Any]:
    mixed = batch.source_names
    sharded = mixed is not None or batch.space.store.flat().sharded
    return {
        "epoch": batch.epoch,
        "index": batch.index,
        "shape": list(batch.shape),
        "token_count": batch.token_count,
        "rows": [
            {
                "document": p.document_id,
                "document_index": p.document_index,
                "start": p.start,
                "partition": p.partition.value,
                **({"shard": p.shard} if sharded else {}),
                **({"source": mixed[r]} if mixed is not None else {}),
            }
            for r, p in enumerate(batch.provenance)
        ],
    }


def _packed_record(batch: MiniBatch) -> dict[str, Any]:
    sharded = any(space.store.flat().sharded for space in batch.spaces)
    rows: list[dict[str, Any]] = [{"row": number, "segments": []} for number in batch.row_numbers.tolist()]
    names = batch.source_names
    if names is not None:  # a mixture of packed rows: each row names its source
        for row, name in zip(rows, names, strict=True):
            row["source"] = name
    segments: Any = batch.provenance  # SegmentProvenance: a packed batch's
    for p in segments:
        rows[p.row]["segments"].append(
            {
                "document": p.document_id,
                "document_index": p.document_index,
                "start": p.start,
                "length": p.length,
                "partition": p.partition.value,
                **({"shard": p.shard} if sharded else {}),
            }
        )
    return {
        "epoch": batch.epoch,
        "index": batch.index,
        "shape": list(batch.shape),
        "token_count": batch.target_count,
        "pack": True,
        "pad_positions": batch.pad_count,
        "rows": rows,
    }


def record_pieces(batch: MiniBatch) -> Iterator[bytes]:
    """The record of *batch* as one line of JSON (the ``jsonl`` format), in pieces: an array `_PIECE` numbers at a time.

    >>> import streambatch as sb
    >>> epoch = sb.Epoch([sb.Document("a", "train", range(6))], context_length=2, batch_size=2, seed=None)
    >>> batch = next(iter(epoch))
    >>> json.loads(b"".join(record_pieces(batch))) == batch_record(batch)
    True
    """
    yield json.dumps(batch_record(batch, arrays=False), separators=(",", ":"))[:-1].encode()
    for name, values in record_arrays(batch).items():
        array = np.asarray(values)
        if array.size <= _PIECE:  # the usual batch: one piece per array
            yield f',"{name}":{json.dumps(array.tolist(), separators=(",", ":"))}'.encode()
            continue
        yield f',"{name}":['.encode()
        for r, row in enumerate(array):
            yield b"[" if r == 0 else b",["
            for at in range(0, row.size, _PIECE):
                text = json.dumps(row[at : at + _PIECE].tolist(), separators=(",", ":"))[1:-1]
                yield (text if at == 0 else "," + text).encode()
            yield b"]"
        yield b"]"
    yield b"}\n"


def batch_line(batch: MiniBatch) -> bytes:
    """The record of *batch* as one line of JSON (the ``jsonl`` format): `record_pieces` joined."""
    return b"".join(record_pieces(batch))
