"""A tiny float64 causal LM for exactness tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class TinyLM(nn.Module):
    """Embedding -> one causal mixing layer -> logits; float64 so sums are compared tightly."""

    def __init__(self, vocab: int = 50, width: int = 8) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(vocab, width, dtype=torch.float64)
        self.mix = nn.Linear(width, width, dtype=torch.float64)
        self.out = nn.Linear(width, vocab, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + torch.tanh(self.mix(torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1).view(1, -1, 1)))
        return self.out(h)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def full_batch_reference(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """One full-batch computation with reduction='mean': the ground truth."""
    model.zero_grad(set_to_none=True)
    logits = model(inputs)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="mean")
    loss.backward()
    result = (float(loss.detach()), gradients(model))
    model.zero_grad(set_to_none=True)
    return result


def relative_error(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """Largest ``|a - e| / max(|e|, tiny)`` over paired tensors (for checking exactness)."""
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        scale = e.abs().clamp_min(1e-12)
        worst = max(worst, float(((a - e).abs() / scale).max()) if e.numel() else 0.0)
    return worst if math.isfinite(worst) else math.inf
