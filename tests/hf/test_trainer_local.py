"""`streambatch.hf` in one process: HF's names, packed attention, refusals, eval, resume without a state, TRL.

- `hf_batch` (hypothesis): ``shift_labels`` are the batch's targets with -100
  where a target does not count (their count is ``token_count``), ``labels``
  are HF's unshifted labels of the same targets, packed rows' ``position_ids``
  restart exactly where a segment starts.
- Packed logits: under SDPA a packed batch's logits equal each document run alone.
- TRL's ``SFTTrainer`` on a prompt/completion store trains on completion tokens only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
import streambatch.hf as sbh
import streambatch.torch as sbt

from .common import VOCAB, epoch, loss_sum, moved_error, one_process, tiny_llama, training_args


@st.composite
def masked_epochs(draw: st.DrawFn) -> sb.Epoch:
    count = draw(st.integers(1, 6))
    docs = []
    for i in range(count):
        n = draw(st.integers(2, 14))
        mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        mask[-1] = True  # every document trains something
        docs.append(sb.Document(f"d{i}", "train", np.arange(n) % VOCAB, loss_mask=mask))
    context = draw(st.integers(1, 6))
    pack = draw(st.booleans())
    if not pack and max(len(d) for d in docs) < context + 1:
        context = max(len(d) for d in docs) - 1
    return sb.Epoch(docs, context_length=context, batch_size=draw(st.integers(1, 4)), seed=draw(st.integers(0, 9)), pack=pack)


@given(masked_epochs())
def test_hf_batch_names_the_targets_hf_expects(chosen: sb.Epoch) -> None:
    for batch in chosen:
        out = sbh.hf_batch(batch)
        targets = sbt.tensor_batch(batch).targets.long()
        assert torch.equal(out["input_ids"], torch.from_numpy(batch.inputs.astype(np.int64)))
        assert torch.equal(out["shift_labels"], targets)  # streambatch's targets, -100 where they do not count
        assert int((out["shift_labels"] != -100).sum()) == batch.token_count
        assert out["use_cache"] is False
        labels = out["labels"]
        starts = torch.zeros_like(labels, dtype=torch.bool)
        starts[:, 0] = True
        if batch.packed:
            segments = torch.from_numpy(batch.segment_ids.astype(np.int64))
            starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
            assert torch.equal(out["position_ids"] == 0, starts)  # positions restart exactly at each segment
        else:
            assert torch.equal(out["position_ids"], torch.arange(batch.context_length).expand(batch.width, -1))
        assert (labels[starts] == -100).all()
        assert torch.equal(labels[:, 1:][~starts[:, 1:]], targets[:, :-1][~starts[:, 1:]])  # HF's shift of the same targets


def test_an_empty_share_is_one_row_that_counts_nothing() -> None:
    last = epoch("windows").batches(rank=1, world_size=2)[len(epoch("windows")) - 1]
    assert last.width == 0
    out = sbh.hf_batch(last)
    assert out["input_ids"].shape == (1, 4)
    assert (out["shift_labels"] == -100).all()
    assert (out["labels"] == -100).all()


def test_the_model_loss_is_the_summed_loss_over_the_count() -> None:
    """HF's causal-LM loss on `hf_batch` uses shift_labels as given: the sum over counted targets / the count."""
    model = tiny_llama()
    with torch.no_grad():
        for kind in ("windows", "packed"):
            for batch in epoch(kind):
                if batch.token_count:  # (HF's loss runs in float32: its one division rounds there)
                    loss = model(**sbh.hf_batch(batch), num_items_in_batch=batch.token_count).loss
                    assert float(loss) == pytest.approx(float(loss_sum(model, batch)) / batch.token_count, rel=1e-6)


def test_packed_logits_equal_each_document_run_alone() -> None:
    """SDPA with the restarting position_ids: no attention across a segment, so each segment's logits are its own."""
    model = tiny_llama().eval()
    checked = 0
    for batch in epoch("packed"):
        out = sbh.hf_batch(batch)
        logits = model(input_ids=out["input_ids"], position_ids=out["position_ids"], use_cache=False).logits
        segments = batch.segments
        for row, start, length, column in _segment_places(batch):
            alone = model(input_ids=out["input_ids"][row : row + 1, column : column + length]).logits
            torch.testing.assert_close(logits[row, column : column + length], alone[0], rtol=0, atol=1e-12)
            checked += int(length > 0) + 0 * start
        assert len(segments.row) >= batch.width
    assert checked > epoch("packed").item_count  # some rows hold several segments


def _segment_places(batch: Any) -> list[tuple[int, int, int, int]]:
    ids = batch.segment_ids
    places = []
    for row in range(batch.width):
        column = 0
        for segment in sorted(set(ids[row].tolist()) - {-1}):
            length = int((ids[row] == segment).sum())
            places.append((row, segment, length, column))
            column += length
    return places


def test_a_disagreeing_batch_size_is_refused_naming_both_numbers(tmp_path: Path) -> None:
    run = sb.Run.from_epoch(epoch("windows"), epochs=1)  # B=5, one process, accumulation 2: at most 3 rows
    with pytest.raises(sb.ConfigError, match=r"per_device_train_batch_size=4 .* at most 3 rows"):
        sbh.Trainer(model=tiny_llama(), args=training_args(str(tmp_path), 2, per_device_train_batch_size=4), train_dataset=run)
    trainer = sbh.Trainer(
        model=tiny_llama(), args=training_args(str(tmp_path), 2, per_device_train_batch_size=3), train_dataset=run
    )
    assert trainer.train_dataset is run
    with pytest.raises(sb.ConfigError, match="average_tokens_across_devices=False"):
        sbh.Trainer(
            model=tiny_llama(), args=training_args(str(tmp_path), 2, average_tokens_across_devices=False), train_dataset=run
        )


def test_any_other_dataset_trains_as_in_hf(tmp_path: Path) -> None:
    import transformers

    rows = [{"input_ids": list(r), "labels": list(r)} for b in epoch("windows") for r in b.inputs.tolist()]
    found = []
    for cls in (sbh.Trainer, transformers.Trainer):
        trainer = cls(model=tiny_llama(), args=training_args(str(tmp_path / cls.__module__), 2, max_steps=3), train_dataset=rows)
        trainer.train()
        found.append(trainer.model.state_dict())
    assert all(torch.equal(found[0][k], found[1][k]) for k in found[1])


def test_eval_is_the_exact_token_mean_of_the_epoch(tmp_path: Path) -> None:
    model = tiny_llama()
    trainer = sbh.Trainer(model=model, args=training_args(str(tmp_path), 1), eval_dataset=epoch("packed"))
    metrics = trainer.evaluate()
    with torch.no_grad():
        total = sum(float(loss_sum(model, b)) for b in epoch("packed"))
    count = sum(b.token_count for b in epoch("packed"))
    assert metrics["eval_tokens"] == count
    assert metrics["eval_loss"] == pytest.approx(total / count, rel=1e-9)
    assert trainer.evaluate(eval_dataset=epoch("windows"))["eval_tokens"] == sum(b.token_count for b in epoch("windows"))


def test_a_checkpoint_without_the_run_state_is_refused(tmp_path: Path) -> None:
    args = training_args(str(tmp_path), 1, max_steps=2, save_strategy="steps", save_steps=1)
    sbh.Trainer(model=tiny_llama(), args=args, train_dataset=epoch("windows")).train()
    checkpoint = tmp_path / "checkpoint-1"
    assert (checkpoint / sbh.STATE_FILE).is_file()
    os.remove(checkpoint / sbh.STATE_FILE)
    trainer = sbh.Trainer(model=tiny_llama(), args=args, train_dataset=epoch("windows"))
    with pytest.raises(sb.StateError, match=f"holds no {sbh.STATE_FILE}"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over the tiny vocabulary, built in memory (TRL reads its pad token)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 2)} | {"<pad>": VOCAB - 2, "<eos>": VOCAB - 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>", eos_token="<eos>"
    )


def test_trl_sft_trainer_trains_on_completion_tokens_only(tmp_path: Path) -> None:
    pytest.importorskip("trl", reason="TRL is not installed; pip install -e '.[trl]' from the checkout")
    from trl import SFTConfig

    args = training_args(str(tmp_path), 2).to_dict()
    config = SFTConfig(**{k: v for k, v in args.items() if k in SFTConfig.__dataclass_fields__ and not k.startswith("_")})
    trainer = sbh.SFTTrainer(model=tiny_llama(), args=config, train_dataset=epoch("windows"), processing_class=tiny_tokenizer())
    trainer.train()
    found = trainer.model.state_dict()
    expected = one_process(epoch("windows"), dtype=torch.float64)  # divides by the completion targets each batch counts
    every_target = one_process(epoch("windows"), denominator=lambda b: b.inputs.size, dtype=torch.float64)
    assert moved_error(every_target, expected) > 0.1  # counting the prompt's targets moves the weights elsewhere
    assert moved_error(found, expected) <= 1e-4  # TRL's fused LM head multiplies in float32: rounding, not the count


@pytest.mark.parametrize(
    ("hidden", "statement", "extra"),
    [("transformers", "import streambatch.hf", "transformers"), ("trl", "streambatch.hf.SFTTrainer", "trl")],
)
def test_a_missing_package_names_the_extra(hidden: str, statement: str, extra: str) -> None:
    """Without transformers (or TRL) the import is a MissingDependencyError naming the extra that installs it."""
    import subprocess
    import sys

    code = (
        f"import sys; sys.modules[{hidden!r}] = None\nfrom streambatch.errors import MissingDependencyError\n"
        f"try:\n    import streambatch.hf\n    {statement}\nexcept MissingDependencyError as err:\n    print(err)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=root).stdout
    assert f"needs the {hidden} package" in out
    assert f"(the {extra} extra of streambatch" in out
