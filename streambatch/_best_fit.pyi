"""Type stub of the C extension built from ``_best_fit.c``: best-fit decreasing packing of integer sizes."""

from _typeshed import ReadableBuffer

def best_fit_decreasing(sizes: ReadableBuffer, capacity: int, /) -> tuple[bytearray, bytearray]:
    """Pack the non-zero uint32 *sizes* into bins of *capacity*; return (int64 offsets, uint32 items) as bytearrays."""
