"""Document masking in `streambatch.torch`: a packed row computes exactly what each of its segments computes alone.

A tiny 2-layer transformer in float32 (learned positions read at ``position_ids``)
runs a packed batch once with `document_mask` through
``scaled_dot_product_attention`` and once with `block_mask` through
``flex_attention``; every real position must match the segment run alone (its
own tokens, read from the document, positions 0, 1, ...), and the packed
token-mean loss and its gradients must equal the segments' summed losses
divided by the same denominator.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import streambatch.torch as sbt
from streambatch.errors import ConfigError
from streambatch.items.pack.pack import PackedArrays, pack_lengths

VOCAB, WIDTH, HEADS = 37, 16, 2
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, h: torch.Tensor, attend: Attend) -> torch.Tensor:
        w, T, _ = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(w, T, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        h = h + self.proj(attend(q, k, v).transpose(1, 2).reshape(w, T, WIDTH))
        return h + self.mlp(self.norm2(h))


class TwoLayerLM(nn.Module):
    """Embeddings + learned positions (indexed by position ids) -> 2 pre-norm blocks -> logits, float32."""

    def __init__(self, max_positions: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.position = nn.Embedding(VOCAB, WIDTH), nn.Embedding(max_positions, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        h = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            h = block(h, attend)
        return self.head(self.norm(h))


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa(mask: torch.Tensor) -> Attend:
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flex(mask: Any) -> Attend:
    from torch.nn.attention.flex_attention import flex_attention

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # eager (unfused) on the CPU: exact, and warned about
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(q, k, v, block_mask=mask)  # type: ignore[return-value]

    return attend


def packed_corpus(seed: int) -> tuple[np.ndarray, np.ndarray, PackedArrays, int]:
    """Random documents (1 token, exactly T + 1, several T, short tails), all rows packed, in a random order."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(3, 13))
    lengths = np.concatenate([[1, T + 1, 3 * T + 2], rng.integers(0, 3 * T, size=int(rng.integers(3, 12)))])
    rng.shuffle(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, VOCAB, size=int(starts[-1]) + 1).astype(np.uint16)  # one spare: gathers read < size
    rows = pack_lengths(lengths, T)
    batch = rows.gather(tokens, starts[:-1], rng.permutation(len(rows)), pad_id=0)
    return tokens, starts, batch, T


def as_long(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.int64))


def alone_logits(model: TwoLayerLM, tokens: np.ndarray, starts: np.ndarray, batch: PackedArrays) -> list[torch.Tensor]:
    """Each segment run by itself: its own tokens read from its document, positions 0..n-1, plain causal attention."""
    out = []
    for doc, start, n in zip(batch.segment_documents, batch.segment_starts, batch.segment_lengths, strict=True):
        first = int(starts[doc] + start)
        ids = as_long(tokens[first : first + n])[None]
        out.append(model(ids, torch.arange(n)[None], causal)[0])
    return out


def segment_columns(batch: PackedArrays) -> np.ndarray:
    """The first column of each segment in its row."""
    ends = np.cumsum(batch.segment_lengths)
    first_of_row = np.searchsorted(batch.segment_rows, np.arange(batch.inputs.shape[0]))
    return ends - batch.segment_lengths - (ends - batch.segment_lengths)[first_of_row][batch.segment_rows]


@pytest.mark.parametrize("seed", range(6))
def test_packed_forward_equals_segments_alone(seed: int) -> None:
    tokens, starts, batch, T = packed_corpus(seed)
    model = TwoLayerLM(T)
    inputs, positions = as_long(batch.inputs), as_long(batch.position_ids)
    alone = alone_logits(model, tokens, starts, batch)
    columns = segment_columns(batch)
    with torch.no_grad():
        for attend in (sdpa(sbt.document_mask(batch)), flex(sbt.block_mask(batch))):
            packed = model(inputs, positions, attend)
            assert torch.isfinite(packed).all()  # padding rows too: no query without a key
            worst = max(
                float((packed[r, c : c + n] - a).abs().max())
                for r, c, n, a in zip(batch.segment_rows, columns, batch.segment_lengths, alone, strict=True)
            )
            assert worst <= 1e-5, worst


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention has no backward on the CPU; needs CUDA")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("kind", "device"), [("sdpa", "cpu"), pytest.param("flex", "cuda", marks=CUDA)])
def test_packed_token_mean_and_gradients_equal_segments_alone(seed: int, kind: str, device: str) -> None:
    tokens, starts, batch, T = packed_corpus(100 + seed)
    model = TwoLayerLM(T).to(device)
    attend = sdpa(sbt.document_mask(batch, device=device)) if kind == "sdpa" else flex(sbt.block_mask(batch, device=device))
    logits = model(as_long(batch.inputs).to(device), as_long(batch.position_ids).to(device), attend)
    targets = as_long(batch.targets).masked_fill(~torch.from_numpy(batch.loss_mask), -100).to(device)  # padding: ignored
    packed_loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="sum") / batch.target_count
    packed_loss.backward()
    packed_grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
    model = model.cpu()
    model.zero_grad(set_to_none=True)

    total = torch.zeros(())
    for doc, start, n, a in zip(
        batch.segment_documents,
        batch.segment_starts,
        batch.segment_lengths,
        alone_logits(model, tokens, starts, batch),
        strict=True,
    ):
        first = int(starts[doc] + start)
        total = total + F.cross_entropy(a, as_long(tokens[first + 1 : first + 1 + n]), reduction="sum")
    assert batch.target_count == int(batch.segment_lengths.sum()) == int(batch.loss_mask.sum())
    alone_loss = total / batch.target_count  # the same denominator: real targets only, never padding
    alone_loss.backward()
    alone_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert abs(packed_loss.item() - alone_loss.item()) <= 1e-5
    assert len(packed_grads) == len(alone_grads) == len(list(model.parameters()))
    for got, want in zip(packed_grads, alone_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=4), st.integers(0, 3))
def test_masks_follow_the_rule(segment_lengths: list[list[int]], pad: int) -> None:
    """mask[b, 0, q, k] == (same segment, padding counting as one) and k <= q; cu_seqlens matches the gather's."""
    T = max(sum(row) for row in segment_lengths) + pad
    ids = np.full((len(segment_lengths), T), -1, dtype=np.int32)
    for r, row in enumerate(segment_lengths):
        ids[r, : sum(row)] = np.repeat(np.arange(len(row)), row)
    mask = sbt.document_mask(ids)
    assert mask.shape == (len(segment_lengths), 1, T, T)
    assert mask.dtype == torch.bool
    for b in range(ids.shape[0]):
        for q in range(T):
            for k in range(T):
                assert bool(mask[b, 0, q, k]) == (ids[b, q] == ids[b, k] and k <= q)
    expected = [0]
    for r, row in enumerate(segment_lengths):
        bounds = np.cumsum([*row, T - sum(row)] if sum(row) < T else row) + r * T
        expected += bounds.tolist()
    assert sbt.cu_seqlens(ids).tolist() == expected
    assert sbt.cu_seqlens(torch.from_numpy(ids)).dtype == torch.int32


def test_cu_seqlens_and_masks_agree_with_the_gathered_batch() -> None:
    _, _, batch, T = packed_corpus(7)
    cu = sbt.cu_seqlens(batch)
    assert cu.tolist() == batch.cu_seqlens.tolist()
    assert int(cu.diff().max()) == batch.max_seqlen
    dense = sbt.document_mask(batch)[:, 0]
    blocks = sbt.block_mask(batch)
    assert blocks.shape == (batch.inputs.shape[0], 1, T, T)
    b, q, k = torch.meshgrid(torch.arange(dense.shape[0]), torch.arange(T), torch.arange(T), indexing="ij")
    assert torch.equal(blocks.mask_mod(b, torch.zeros_like(b), q, k), dense)  # the same rule, element by element


@pytest.mark.parametrize("bad", [np.zeros(4, dtype=np.int32), np.zeros((2, 3), dtype=np.float32)])
def test_bad_segment_ids_are_refused(bad: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="segment ids"):
        sbt.document_mask(bad)


def test_masks_take_the_library_batches() -> None:
    """A `PackedBatch` from a packed epoch and its `TensorBatch` give the same masks and its own cu_seqlens."""
    import streambatch as sb

    docs = [sb.Document(f"d{i}", "train", list(range(1 + 3 * i))) for i in range(7)]
    epoch = sb.Epoch(docs, context_length=5, batch_size=2, seed=4, pack=True)
    for batch in epoch:
        tensors = sbt.tensor_batch(batch)
        assert sbt.cu_seqlens(batch).tolist() == batch.cu_seqlens.tolist() == sbt.cu_seqlens(tensors).tolist()
        assert torch.equal(sbt.document_mask(batch), sbt.document_mask(tensors))
        ids = torch.from_numpy(batch.segment_ids.astype(np.int64))
        expected = (ids[:, :, None] == ids[:, None, :]) & torch.ones(5, 5, dtype=torch.bool).tril()
        assert torch.equal(sbt.document_mask(batch)[:, 0], expected)


def test_block_mask_across_several_blocks_equals_the_dense_mask() -> None:
    """T = 300 spans three 128-blocks (the last partial): flex_attention with block_mask equals SDPA with document_mask."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 700, size=12)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, VOCAB, size=int(starts[-1]) + 1).astype(np.uint16)
    batch = pack_lengths(lengths, 300).gather(tokens, starts[:-1], np.arange(len(pack_lengths(lengths, 300))))
    assert (batch.segment_ids == -1).any()  # padding present
    assert (batch.segment_ids.max(axis=1) > 0).any()  # several segments in a row
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch.inputs.shape[0], 2, 300, 8, generator=generator) for _ in range(3))
    dense = sdpa(sbt.document_mask(batch))(q, k, v)
    sparse = flex(sbt.block_mask(batch))(q, k, v)
    assert float((dense - sparse).abs().max()) <= 1e-5
