"""Type stub of the C extension built from ``_row_gather.c``: the packed mode's one-pass gather."""

from _typeshed import ReadableBuffer, WriteableBuffer

class Gatherer:
    """Read-only views of a source's tokens and a packing, made once per packing."""

    def __init__(
        self,
        tokens: ReadableBuffer,
        starts: ReadableBuffer,
        lengths: ReadableBuffer,
        full_docs: ReadableBuffer,
        full_ends: ReadableBuffer,
        offsets: ReadableBuffer,
        tails: ReadableBuffer,
        context_length: int,
        full_rows: int,
        pad_id: int,
        /,
    ) -> None: ...
    def gather(
        self,
        rows: ReadableBuffer,
        inputs: WriteableBuffer,
        targets: WriteableBuffer,
        segment_ids: WriteableBuffer,
        position_ids: WriteableBuffer,
        loss_mask: WriteableBuffer,
        kinds: ReadableBuffer = ...,
        sources: tuple[Gatherer, ...] = ...,
        /,
    ) -> tuple[bytearray, int, int]:
        """Fill the outputs for int64 *rows*; return (int32 cu_seqlens bytes, target_count, max_seqlen).

        A mixture passes *kinds* (uint8, one per row) and *sources*: row i is read by ``sources[kinds[i]]``.
        """
