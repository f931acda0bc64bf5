"""Attention that respects documents in packed rows: a dense mask, a flex_attention BlockMask, varlen boundaries.

All three are built from a packed batch's ``segment_ids`` alone (``(w, T)``;
0, 1, 2, ... by segment within a row, -1 at padding): a query attends to a key
when both lie in the same segment of the same row and the key is not after the
query (causal).  No prediction ever draws on another document's tokens, or on
another piece of the same document.

Padding: a row's padding is treated as one more block of its own, exactly as the
varlen form (`cu_seqlens`, and the batch's own ``cu_seqlens``) treats it: a pad
query attends causally to the pad keys at or before it, never to a real token,
and no real query ever sees a pad key.  So every query has at least one key
(itself) and ``scaled_dot_product_attention`` never yields NaN; the outputs at
padding are finite and meaningless, and the loss mask drops them.

*batch* is a packed batch (anything with ``segment_ids``: the packed batches of
``sb.materialize``, `streambatch.items.pack.pack.PackedArrays`), or the segment ids
themselves as an array or tensor.

    >>> import numpy as np
    >>> ids = np.array([[0, 0, 1, -1]])
    >>> document_mask(ids)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    >>> cu_seqlens(ids).tolist()
    [0, 2, 3, 4]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import ConfigError

__all__ = ["block_mask", "cu_seqlens", "document_mask", "segment_tensor"]


def segment_tensor(batch: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """The batch's ``segment_ids`` as an int64 ``(w, T)`` tensor on *device* (default: where they are)."""
    ids = getattr(batch, "segment_ids", batch)
    tensor = ids if isinstance(ids, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(ids))
    if tensor.dim() != 2 or tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise ConfigError(
            f"segment ids of shape {list(tensor.shape)} and dtype {tensor.dtype}; "
            "pass a packed batch or its (w, T) integer segment_ids"
        )
    return tensor.to(device=device, dtype=torch.long)


def document_mask(batch: Any, *, device: torch.device | str | None = None) -> torch.Tensor:
    """A boolean ``(w, 1, T, T)`` mask for ``scaled_dot_product_attention``: True where query may attend to key.

    Causal and block-diagonal by segment (padding is a block of its own; see the
    module docstring).  It broadcasts over heads.  Memory: ``w * T * T`` bytes.
    """
    ids = segment_tensor(batch, device)
    T = ids.shape[1]
    same = ids[:, :, None] == ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril_()
    return (same & causal).unsqueeze(1)


def block_mask(batch: Any, *, device: torch.device | str = "cpu", block_size: int = 128) -> Any:
    """A ``flex_attention`` BlockMask with the same rule as `document_mask`, from the segment ids.

    Pass ``device="cuda"`` for the GPU (the segment ids are moved there); on the
    CPU, ``flex_attention`` runs eagerly (unfused) unless compiled.  Fully
    masked blocks are skipped by the kernel, so a row of many short segments
    costs far less than ``T * T``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    ids = segment_tensor(batch, device)
    width, T = ids.shape

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (ids[b, q] == ids[b, kv]) & (kv <= q)

    return create_block_mask(mask_mod, B=width, H=None, Q_LEN=T, KV_LEN=T, device=device, BLOCK_SIZE=block_size)


def cu_seqlens(batch: Any, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Varlen boundaries (int32) over the flattened ``(w * T)`` batch: every segment, and each row's padding, is a sequence.

    Equal to the batch's own ``cu_seqlens``; ``max_seqlen`` is ``cu.diff().max()``.
    The result ends at ``w * T``, so ``inputs.reshape(-1)`` goes to a varlen kernel as is.
    """
    ids = segment_tensor(batch, device)
    width, T = ids.shape
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    flat = torch.nonzero(starts.reshape(-1)).reshape(-1)
    end = torch.tensor([width * T], dtype=flat.dtype, device=flat.device)
    return torch.cat([flat, end]).to(torch.int32)
