"""TRL's ``SFTTrainer`` over an `sb.Run` or `sb.Epoch`: the same `StreamBatchMixin` in front of it (``trl`` extra)."""

from __future__ import annotations

from typing import Any

try:
    from trl.trainer.sft_trainer import SFTTrainer as _TRLTrainer
except ImportError as err:  # pragma: no cover - exercised where TRL is not installed
    from ..errors import missing_dependency

    raise missing_dependency("streambatch.hf.SFTTrainer", "trl", "trl") from err

from .trainer import StreamBatchMixin


class SFTTrainer(StreamBatchMixin, _TRLTrainer):
    """TRL's ``SFTTrainer`` whose ``train_dataset`` / ``eval_dataset`` may be an `sb.Run` or `sb.Epoch`.

    The run's loss mask decides which targets count (a prompt/completion store
    trains its completions only); TRL's own dataset preparation, packing and
    collator are not used for a run.  Pass ``processing_class=`` (the tokenizer the
    store was made with): TRL reads its pad token.
    """

    @classmethod
    def _stand_in(cls) -> Any:
        import datasets  # type: ignore[import-untyped]

        return datasets.Dataset.from_dict({"input_ids": [[0, 0]]})  # already tokenized: TRL prepares nothing
