"""A streambatch batch in Hugging Face's names: ``input_ids``, ``labels``, ``shift_labels``, ``position_ids``.

- ``shift_labels`` are streambatch's targets unchanged (``-100`` where a target
  does not count: a masked prompt, packed padding).  HF's causal-LM loss
  (``ForCausalLMLoss``) uses them as given and does not shift again, so the loss
  sees exactly the targets the plan counted, each segment's last one included.
- ``labels`` are HF's unshifted labels of the same targets: ``labels[..., 1:]``
  equals ``shift_labels[..., :-1]`` inside a segment, and each row's and each
  segment's first position is ``-100`` (HF's padding-free convention), so code
  that shifts ``labels`` itself never crosses a document.
- ``position_ids``: ``0 .. T-1`` in a window's row; packed rows' restart at 0
  in every segment.  HF
  reads a restart as a document boundary and builds a block-diagonal causal mask
  (SDPA, eager, flex) or varlen boundaries (flash attention), so attention never
  crosses a document.  ``use_cache=False`` rides along: HF looks for packed
  sequences only when no cache is built.

A share with no rows (a batch narrower than the world, or a micro-batch of a
short share) becomes one placeholder row whose targets are all ``-100``: its
loss and gradients are exactly zero, and the rank still runs the forward and
backward that DDP's all-reduce waits for.
"""

from __future__ import annotations

from typing import Any

import torch

from ..torch.tensors import IGNORE_INDEX, TensorBatch, tensor_batch

__all__ = ["hf_batch"]


def _tensors(batch: Any) -> TensorBatch:
    return batch if isinstance(batch, TensorBatch) else tensor_batch(batch)


def hf_batch(batch: Any) -> dict[str, Any]:
    """*batch* (a `streambatch.MiniBatch`, or its `streambatch.torch.TensorBatch`) as the keyword arguments of an HF model.

    >>> import streambatch as sb
    >>> docs = [sb.Document("a", "train", [5, 6, 7, 8], loss_mask=[False, False, True, True])]
    >>> out = hf_batch(sb.Epoch(docs, context_length=3, batch_size=1, seed=None).batch(0))
    >>> out["input_ids"].tolist(), out["shift_labels"].tolist(), out["labels"].tolist()
    ([[5, 6, 7]], [[-100, 7, 8]], [[-100, -100, 7]])
    """
    tensors = _tensors(batch)
    inputs, targets = tensors.inputs.long().contiguous(), tensors.targets.long().contiguous()
    if inputs.shape[0] == 0:  # no rows here: one row that counts nothing, so the forward and backward still run
        inputs = torch.zeros((1, inputs.shape[1]), dtype=torch.long)
        targets = torch.full_like(inputs, IGNORE_INDEX)
    width = int(inputs.shape[1])
    if tensors.position_ids is not None and tensors.width:
        positions = tensors.position_ids.long()  # packed: 0, 1, ... again in every segment
    else:
        positions = torch.arange(width, dtype=torch.long).expand(inputs.shape[0], width)  # a window: one sequence
    labels = torch.full_like(targets, IGNORE_INDEX)
    labels[:, 1:] = targets[:, :-1]
    labels[positions == 0] = IGNORE_INDEX  # a segment's first position holds no target of the one before it
    return {"input_ids": inputs, "labels": labels, "shift_labels": targets, "position_ids": positions, "use_cache": False}
