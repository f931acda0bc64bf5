"""Hugging Face integration: ``streambatch.hf.Trainer`` (and TRL's ``SFTTrainer``) over an `sb.Run` or `sb.Epoch`.

The ``transformers`` extra (transformers and accelerate; TRL for `SFTTrainer`).
One streambatch batch is one optimizer step; the step's count comes from the
plan (no prefetch, no gather); checkpoints carry the run's position and resume
with no replay.  See `streambatch.hf.trainer` and docs/trainers.md.

    trainer = streambatch.hf.Trainer(model=model, args=TrainingArguments(...), train_dataset=run)
    trainer.train()
"""

from __future__ import annotations

from typing import Any

try:
    import accelerate  # type: ignore[import-untyped]  # noqa: F401
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised in a subprocess without transformers
    from ..errors import missing_dependency

    raise missing_dependency("streambatch.hf", err.name or "transformers", "transformers") from err

from .collate import hf_batch
from .trainer import STATE_FILE, StreamBatchMixin, Trainer

__all__ = ["STATE_FILE", "SFTTrainer", "StreamBatchMixin", "Trainer", "hf_batch"]


def __getattr__(name: str) -> Any:
    if name == "SFTTrainer":  # TRL is optional: imported on first use
        from .sft import SFTTrainer

        return SFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
