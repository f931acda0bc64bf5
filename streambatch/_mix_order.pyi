"""Type stub of the C extension built from ``_mix_order.c``: Tijdeman's mixture order, exact."""

from _typeshed import ReadableBuffer, WriteableBuffer

def tijdeman(out: WriteableBuffer, checkpoints: WriteableBuffer, block: int, weights: ReadableBuffer, /) -> None:
    """Write the source id of each item into *out* (uint8) and per-source counts every *block* items into
    *checkpoints* (int64); *weights*: k positive ints of 16 little-endian bytes, sum below 2**116."""
