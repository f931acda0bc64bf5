"""What the HF tests share: a tiny float64 Llama built from a config, a masked SFT corpus, the one-process loop.

The corpus is prompt/completion documents (the prompt never trains; the loss
mask is the store's), arranged so that the cases the count must survive occur:
in document order with T=4 and B=5, batch 0 holds no counted target at all,
rank 0's share of batch 1 is all masked while rank 1's is not, and the epoch's
last batch is one window (world size 2: rank 1 has no rows).  Packed rows of
the same corpus (T=6, B=5) end with a one-row batch too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

import streambatch as sb
import streambatch.torch as sbt

VOCAB = 48
LR = 0.5


def tiny_llama() -> Any:
    """A 2-layer Llama of width 16 in float64 (no hub download), the same weights in every process."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa", tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config).to(torch.float64)


def sft_documents() -> list[sb.Document]:
    """A 14-token prompt that trains only its last target, then prompt/completion pairs (the completion trains)."""
    rng = np.random.default_rng(11)
    first = np.zeros(14, dtype=bool)
    first[-1] = True
    docs = [sb.Document("long-prompt", "train", rng.integers(0, VOCAB, 14), loss_mask=first)]
    for i, (prompt, completion) in enumerate([(3, 4), (5, 6), (2, 3), (4, 7), (4, 2), (3, 5), (2, 4)]):
        mask = np.arange(prompt + completion) >= prompt
        docs.append(sb.Document(f"sft-{i}", "train", rng.integers(0, VOCAB, prompt + completion), loss_mask=mask))
    return docs


def epoch(kind: str) -> sb.Epoch:
    """The case's epoch: ``windows`` (T=4, B=5, document order) or ``packed`` (T=6, B=5, seed 5)."""
    if kind == "windows":
        return sb.Epoch(sft_documents(), context_length=4, batch_size=5, seed=None)
    return sb.Epoch(sft_documents(), context_length=6, batch_size=5, seed=5, pack=True)


def training_args(out: str, accumulation: int, **extra: Any) -> Any:
    from transformers import TrainingArguments

    options: dict[str, Any] = {
        "output_dir": out, "gradient_accumulation_steps": accumulation, "num_train_epochs": 1,
        "learning_rate": LR, "optim": "sgd", "lr_scheduler_type": "constant", "weight_decay": 0.0,
        "max_grad_norm": 0.0, "report_to": [], "save_strategy": "no", "logging_strategy": "no", "use_cpu": True,
        "disable_tqdm": True, "seed": 0, "dataloader_num_workers": 0,
    }  # fmt: skip
    return TrainingArguments(**{**options, **extra})


def loss_sum(model: Any, batch: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The batch's summed next-token loss from the model's logits in *dtype* (float32: as HF's loss casts them;
    TRL's fused head keeps the model's float64)."""
    tensors = sbt.tensor_batch(batch)
    positions = None if tensors.position_ids is None else tensors.position_ids.long()
    logits = model(input_ids=tensors.inputs.long(), position_ids=positions, use_cache=False).logits
    flat = logits.to(dtype).reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, tensors.targets.long().reshape(-1), reduction="sum", ignore_index=-100)


def one_process(batches: Iterable[Any], denominator: Any = None, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The plain loop: per whole batch, the summed loss over its counted targets divided by their count, SGD.

    *denominator* (batch -> number) replaces the count: the wrong-denominator control.
    """
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for batch in batches:
        count = batch.token_count if denominator is None else denominator(batch)
        (loss_sum(model, batch, dtype) / max(count, 1)).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def moved_error(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The worst relative error of any parameter's change from the initial weights: ||Δfound − Δexpected|| / ||Δexpected||."""
    start = tiny_llama().state_dict()
    worst = 0.0
    for name, want in expected.items():
        moved = want - start[name]
        error = float((found[name] - want).norm()) / max(float(moved.norm()), 1e-300)
        worst = max(worst, error)
    return worst
