"""Type stub of the C extension built from ``_fisher_yates.c``: the chapter's shuffle, in place."""

from _typeshed import WriteableBuffer

def shuffle(buffer: WriteableBuffer, seed: int, fill: bool = True, /) -> int:
    """Fill *buffer* (1-D, C-contiguous uint32 or 64-bit ints) with range(len) (unless not *fill*),
    shuffle it in place; return the draws."""
