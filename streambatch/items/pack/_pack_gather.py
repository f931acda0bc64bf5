"""Gather packed rows: tokens, segment and position ids, loss mask, varlen boundaries and provenance.

Conventions (`gather_segments`):

- A row holds its segments left to right from position 0, then padding to ``T``.
- Padding: ``inputs`` and ``targets`` hold *pad_id* (default 0), ``loss_mask``
  is False, ``segment_ids`` is -1.  The target at padding is not a real token:
  it counts nowhere because ``loss_mask`` is False there (a torch loss with
  ``ignore_index=-100`` takes ``targets`` with ``-100`` written where the mask is False).
- Ids (``segment_ids``, ``position_ids``) have `id_dtype`: int16 when ``T < 2**15``
  (every id lies in ``[-1, T)``), else int32, as tokens are uint16 when the
  vocabulary fits.  `streambatch.torch.tensor_batch` gives them to torch as int32.
- ``segment_ids``: 0, 1, 2, ... by segment within each row.  Attention that
  keeps ``segment_ids[q] == segment_ids[k]`` (and causality) never crosses a
  piece; padding queries see only padding keys, so no softmax row is empty.
- ``position_ids``: 0 at each segment's first position, +1 along it; padding
  counts 0, 1, ... as if it were a segment of its own (valid for RoPE and
  position tables, and never read by a real position).
- ``cu_seqlens`` (int32) and ``max_seqlen``: FlashAttention's varlen form over
  the flattened ``(w * T)`` batch: every segment is a sequence and each row's
  padding, when it has any, is one more sequence right after the row's last
  segment, so ``cu_seqlens[-1] == w * T`` and ``inputs.reshape(-1)`` goes to the
  kernel as is.  ``sequence_is_pad`` marks the padding sequences.
"""

from __future__ import annotations

import resource
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, DataError
from ...model.flat import Flat

IntArray = npt.NDArray[np.int64]
IdArray = npt.NDArray[np.signedinteger[Any]]
_INT32_LIMIT = 1 << 31


def id_dtype(context_length: int) -> np.dtype[np.signedinteger[Any]]:
    """The dtype of a packed batch's segment and position ids: int16 when ``T < 2**15``, else int32.

    >>> id_dtype(2048), id_dtype(32768)
    (dtype('int16'), dtype('int32'))
    """
    return np.dtype(np.int16) if context_length < (1 << 15) else np.dtype(np.int32)


def batch_bytes(width: int, context_length: int, token_dtype: npt.DTypeLike) -> int:
    """Bytes of the arrays of one packed batch of *width* rows: inputs, targets, two id arrays, the mask.

    >>> batch_bytes(2, 4, np.uint16)  # 8 positions of 2 + 2 + 2 + 2 + 1 bytes
    72
    """
    T = int(context_length)
    return int(width) * T * (2 * np.dtype(token_dtype).itemsize + 2 * id_dtype(T).itemsize + 1)


def check_emittable(
    width: int, context_length: int, token_dtype: npt.DTypeLike, *, batch_size: int | None = None, memory: bool = True
) -> None:
    """Refuse, before any work, a packed batch of *width* rows of ``T`` positions that cannot be emitted.

    Its ``width * T`` positions must be fewer than ``2**31`` (``cu_seqlens`` is
    int32), and (with *memory*) its arrays (`batch_bytes`) must fit the
    process's address-space limit (``RLIMIT_AS``) when one is set.

    >>> check_emittable(1 << 11, 1 << 20, np.uint16, batch_size=4096)
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: a packed batch of 2048 rows of T=1048576 holds ...; pass batch_size <= 2047
    """
    T = int(context_length)
    rows = f"{width} row{'' if width == 1 else 's'} of T={T}"
    smaller = "a smaller T or batch_size" if batch_size is not None else "a smaller T"
    if int(width) * T >= _INT32_LIMIT:
        fix = f"pass batch_size <= {(_INT32_LIMIT - 1) // T}" if _INT32_LIMIT > T and batch_size is not None else "pass T < 2**31"
        raise ConfigError(f"a packed batch of {rows} holds {int(width) * T} positions, 2**31 or more (int32 cu_seqlens); {fix}")
    need = batch_bytes(width, T, token_dtype)
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if memory and limit != resource.RLIM_INFINITY and need >= limit:
        raise ConfigError(
            f"a packed batch of {rows} needs {need} bytes ({need / 2**30:.1f} GiB) of arrays, more than the "
            f"address-space limit of {limit} bytes ({limit / 2**30:.1f} GiB); pass {smaller}"
        )


class PackedArrays(NamedTuple):
    """One packed batch of ``w`` rows of ``T`` positions, as numpy arrays (see the module docstring)."""

    inputs: npt.NDArray[Any]  # (w, T), token dtype
    targets: npt.NDArray[Any]  # (w, T), token dtype
    segment_ids: IdArray  # (w, T), id_dtype(T)
    position_ids: IdArray  # (w, T), id_dtype(T)
    loss_mask: npt.NDArray[np.bool_]  # (w, T)
    target_count: int  # loss_mask.sum(): the token mean's denominator
    cu_seqlens: npt.NDArray[np.int32]  # (sequences + 1,)
    max_seqlen: int
    sequence_is_pad: npt.NDArray[np.bool_]  # (sequences,)
    segment_rows: IntArray  # per segment: its row in the batch
    segment_documents: IntArray  # per segment: document index
    segment_starts: IntArray  # per segment: start of the piece in its document
    segment_lengths: IntArray  # per segment: targets (positions occupied)


def _take_corpus(flat: Flat, index: npt.NDArray[Any], width: int, T: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Inputs and targets at global *index* positions of a corpus's flat space, read from each position's shard."""
    inputs = np.empty(index.size, dtype=flat.dtype)
    targets = np.empty(index.size, dtype=flat.dtype)
    for k, where, local in flat.split(index):
        tokens = flat.tokens[k]
        inputs[where], targets[where] = tokens[local], tokens[local + 1]
    return inputs.reshape(width, T), targets.reshape(width, T)


def gather_segments(
    tokens: npt.NDArray[Any] | Flat,
    document_starts: npt.ArrayLike,
    segment_offsets: npt.ArrayLike,
    documents: npt.ArrayLike,
    starts: npt.ArrayLike,
    lengths: npt.ArrayLike,
    context_length: int,
    *,
    pad_id: int = 0,
) -> PackedArrays:
    """Build a packed batch: row ``i`` holds segments ``segment_offsets[i]:segment_offsets[i + 1]`` in order.

    Segment ``j`` is the piece of document ``documents[j]`` starting at
    ``starts[j]`` with ``lengths[j]`` targets: its inputs are the flat tokens
    from ``document_starts[documents[j]] + starts[j]``, its targets the same
    shifted by one.  Every row needs at least one segment and at most ``T``
    positions.  One vectorized pass per output array; no loop per row or segment.

    >>> tokens = np.array([0, 10, 11, 12, 1, 0, 20, 1], dtype=np.uint16)
    >>> b = gather_segments(tokens, [0, 5], [0, 2, 3], [0, 1, 0], [0, 0, 2], [2, 2, 2], 4)
    >>> b.inputs.tolist(), b.targets.tolist()
    ([[0, 10, 0, 20], [11, 12, 0, 0]], [[10, 11, 20, 1], [12, 1, 0, 0]])
    >>> b.segment_ids.tolist(), b.position_ids.tolist(), b.target_count
    ([[0, 0, 1, 1], [0, 0, -1, -1]], [[0, 1, 0, 1], [0, 1, 0, 1]], 6)
    >>> b.cu_seqlens.tolist(), b.max_seqlen, b.sequence_is_pad.tolist()
    ([0, 2, 4, 6, 8], 2, [False, False, False, True])
    """
    T = int(context_length)
    corpus = tokens if isinstance(tokens, Flat) and not tokens.single else None  # shards: read one by one
    if isinstance(tokens, Flat):
        tokens = tokens.tokens[0] if corpus is None else np.zeros(0, dtype=tokens.dtype)
    flat_tokens = np.asarray(tokens).reshape(-1)
    token_total = corpus.size if corpus is not None else flat_tokens.size
    if flat_tokens.dtype.kind != "u" or flat_tokens.dtype.itemsize not in (2, 4):
        raise ConfigError(f"tokens have dtype {flat_tokens.dtype}; pass the flat uint16 or uint32 token array")
    if not 0 <= int(pad_id) <= int(np.iinfo(flat_tokens.dtype).max):
        raise ConfigError(f"pad_id={pad_id} does not fit the tokens' {flat_tokens.dtype}; pass a token id")
    seg_offsets = np.asarray(segment_offsets, dtype=np.int64)
    docs = np.asarray(documents, dtype=np.int64)
    begins = np.asarray(starts, dtype=np.int64)
    sizes = np.asarray(lengths, dtype=np.int64)
    width, count = seg_offsets.size - 1, docs.size
    check_emittable(width, T, flat_tokens.dtype)
    ids = id_dtype(T)
    if width <= 0:
        empty_ids = np.zeros((width, T), dtype=ids)
        nothing = np.zeros(0, dtype=np.int64)
        zeros = np.zeros((0, T), dtype=flat_tokens.dtype)
        return PackedArrays(
            zeros, zeros.copy(), empty_ids, empty_ids.copy(), np.zeros((0, T), dtype=bool), 0,
            np.zeros(1, dtype=np.int32), 0, np.zeros(0, dtype=bool), nothing, nothing, nothing, nothing,
        )  # fmt: skip
    counts = np.diff(seg_offsets)
    if seg_offsets[0] != 0 or seg_offsets[-1] != count or int(counts.min()) < 1:
        raise DataError("segment_offsets must start at 0, end at the segment count and give every row a segment")
    if int(sizes.min()) < 1:
        raise DataError(f"segment {int(np.argmin(sizes))} has {int(sizes.min())} targets; a segment has at least one")
    rows = np.repeat(np.arange(width, dtype=np.int64), counts)
    ends = np.cumsum(sizes)  # inclusive, over the whole batch
    before = ends - sizes
    occupied = ends[seg_offsets[1:] - 1] - before[seg_offsets[:-1]]
    if int(occupied.max()) > T:
        row = int(np.argmax(occupied))
        raise DataError(f"row {row} holds {int(occupied[row])} targets; a row holds at most T={T}")
    column = before - before[seg_offsets[:-1]][rows]
    out = rows * T + column  # flat position of each segment's first target
    source = np.asarray(document_starts, dtype=np.int64)[docs] + begins
    if int(source.min()) < 0 or int((source + sizes).max()) >= token_total:
        raise DataError(f"a segment reads outside the {token_total} tokens; the rows do not belong to these tokens")

    loss_mask = np.arange(T) < occupied[:, None]
    # index[p]: the flat token under input position p, built by a running sum of steps:
    # +1 along a segment, a jump at each segment's start, 0 over padding (it repeats the
    # row's last real index: a valid place to read, overwritten with pad_id below)
    index = loss_mask.astype(np.intp).reshape(-1)
    jumps = np.empty(count, dtype=np.int64)
    jumps[0] = source[0]
    jumps[1:] = source[1:] - (source[:-1] + sizes[:-1] - 1)
    index[out] = jumps
    np.cumsum(index, out=index)
    if corpus is not None:
        inputs, targets = _take_corpus(corpus, index, width, T)
    else:
        inputs = flat_tokens.take(index).reshape(width, T)
        targets = flat_tokens[1:].take(index).reshape(width, T)
    padded = occupied < T
    if padded.any():
        pad = ~loss_mask
        inputs[pad] = pad_id
        targets[pad] = pad_id

    # blocks: every segment, and each padded row's padding right after its segments
    pads_before: IntArray = np.cumsum(padded, dtype=np.int64) - padded
    blocks = count + int(np.count_nonzero(padded))
    block_len = np.empty(blocks, dtype=np.int64)
    block_id = np.empty(blocks, dtype=np.int32)
    is_pad = np.zeros(blocks, dtype=bool)
    seg_block = np.arange(count) + pads_before[rows]
    pad_block = seg_offsets[1:][padded] + pads_before[padded]
    block_len[seg_block] = sizes
    block_id[seg_block] = np.arange(count) - seg_offsets[:-1][rows]
    block_len[pad_block] = T - occupied[padded]
    block_id[pad_block] = -1
    is_pad[pad_block] = True
    segment_ids = np.repeat(block_id, block_len).reshape(width, T).astype(ids)
    cu_seqlens = np.zeros(blocks + 1, dtype=np.int32)
    np.cumsum(block_len, out=cu_seqlens[1:])
    steps = np.ones(width * T, dtype=np.int32)  # position ids: +1 along a block, back to 0 at its start
    steps[cu_seqlens[1:-1]] = 1 - block_len[:-1]
    steps[0] = 0
    position_ids = np.cumsum(steps, out=steps).reshape(width, T).astype(ids)
    return PackedArrays(
        inputs=inputs,
        targets=targets,
        segment_ids=segment_ids,
        position_ids=position_ids,
        loss_mask=loss_mask,
        target_count=int(ends[-1]),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(block_len.max()),
        sequence_is_pad=is_pad,
        segment_rows=rows,
        segment_documents=docs,
        segment_starts=begins,
        segment_lengths=sizes,
    )
