"""``.npy`` token arrays: one document, or split by ``X.offsets.npy`` (``len + 1`` offsets from 0) beside it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DataError
from ..io.files import short_path
from ..model.documents import Document, Partition
from ..model.validate import check_offsets
from . import inputs as _inputs
from .blocks import BLOCK_TOKENS, Block, ReadOptions, documents, flat_block, partition_codes, read_options


def offsets_path(path: str) -> str:
    """The offsets file that splits ``X.npy`` into documents: ``X.offsets.npy``."""
    return path[:-4] + ".offsets.npy"


def _load_npy(path: str, what: str) -> npt.NDArray[Any]:
    _inputs.check_input(path)  # the tokens or an X.offsets.npy beside them: a FIFO is refused, never opened
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:
        if _inputs.is_format_error(err):
            raise DataError(
                f"{short_path(path)}: not a .npy array ({err}); check the file, or leave it out (--skip-bad)"
            ) from err
        raise
    if not isinstance(array, np.ndarray):
        raise DataError(f"{short_path(path)}: an .npz archive, not a .npy array; save each array with numpy.save")
    if array.ndim != 1 or array.dtype.kind not in "ui":
        raise DataError(f"{short_path(path)}: a {array.dtype} array of shape {array.shape}; {what} must be a 1-D integer array")
    return np.asarray(array)


def npy_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """A ``.npy`` token array: one document (id *name*), or one per ``X.offsets.npy`` span (id ``name:k``)."""
    tokens = _load_npy(path, "a token file")
    index = offsets_path(path)
    if not os.path.exists(index):
        yield flat_block(tokens, np.array([tokens.size]), [name], partition_codes(1, opts.partition), [short_path(path)], opts)
        return
    offsets = np.asarray(_load_npy(index, "an offsets file"), dtype=np.int64)
    try:
        check_offsets(offsets, int(tokens.size), "offsets")
    except DataError as err:
        raise DataError(f"{short_path(index)}: {err}") from err
    count, k, shown = offsets.size - 1, 0, short_path(path)
    while k < count:
        stop = max(k + 1, int(np.searchsorted(offsets, offsets[k] + BLOCK_TOKENS, side="right")) - 1)
        stop = min(stop, count)
        lengths = np.diff(offsets[k : stop + 1])
        ids = [f"{name}:{j}" for j in range(k, stop)]
        wheres = [f"{shown} document {j}" for j in range(k, stop)]
        yield flat_block(
            np.asarray(tokens[offsets[k] : offsets[stop]]), lengths, ids, partition_codes(stop - k, opts.partition), wheres, opts
        )
        k = stop


def iter_npy(path: str | os.PathLike[str], *, partition: Partition | str = Partition.TRAIN) -> Iterator[Document]:
    """A ``.npy`` token array as one document, or split by ``X.offsets.npy`` (``len + 1`` offsets from 0), lazily.

    >>> import numpy as np, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> np.save(folder / "t.npy", np.arange(5, dtype=np.uint16)); np.save(folder / "t.offsets.npy", np.array([0, 2, 5]))
    >>> [(d.id, d.tokens.tolist()) for d in iter_npy(folder / "t.npy")]
    [('t.npy:0', [0, 1]), ('t.npy:1', [2, 3, 4])]
    """
    name = os.fspath(path)
    _inputs.check_input(name)  # a FIFO or device is refused, never opened
    return documents(npy_blocks(name, Path(name).name, read_options(partition=partition)))
