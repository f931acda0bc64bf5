"""Small contract breaks of issue 43: each a one-line error saying what to do, changing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main

DOCS = [sb.Document(f"d{i}", "train", list(range(i, i + 17))) for i in range(4)]


def test_shuffling_a_mixture_says_to_seed_the_mixture() -> None:
    a = sb.windows(DOCS[:2], context_length=4)
    b = sb.windows(DOCS[2:], context_length=4)
    mixture = sb.mix([a, b], [1, 1], seed=3)
    with pytest.raises(sb.ConfigError, match=r"^sb.shuffle: a mixture orders itself .* sb.mix\(\.\.\., seed=N\)"):
        sb.shuffle(mixture, seed=1)
    assert list(mixture) == list(sb.mix([a, b], [1, 1], seed=3))
    assert len(sb.shuffle(sb.pack(DOCS, context_length=4), seed=1)) == len(sb.pack(DOCS, context_length=4))


def test_a_state_past_the_runs_end_is_refused() -> None:
    longer = sb.Run(DOCS, context_length=4, batch_size=3, seed=7, epochs=3)
    run = sb.Run(DOCS, context_length=4, batch_size=3, seed=7, epochs=1)
    longer.set_position(1, 1)
    with pytest.raises(sb.StateError, match=r"position \(epoch 1, batch 1\) is past the end of this run of 1 epoch"):
        run.load_state_dict(longer.state_dict())
    assert run.position == (0, 0)
    longer.set_position(1, 0)  # exactly the end: a finished run
    run.load_state_dict(longer.state_dict())
    assert run.position == (1, 0)
    assert list(run) == []
    endless = sb.Run(DOCS, context_length=4, batch_size=3, seed=7)
    longer.set_position(2, 1)
    endless.load_state_dict(longer.state_dict())
    assert endless.position == (2, 1)


def test_a_refused_resume_creates_no_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "d.jsonl"
    source.write_text("".join(json.dumps({"id": d.id, "tokens": d.tokens.tolist()}) + "\n" for d in DOCS))
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    args = ["epoch", str(source), "-T", "4", "-B", "2", "--seed", "5"]
    assert main([*args, "-o", str(out), "--save-state", str(state)]) == 0
    out.unlink()
    capsys.readouterr()
    assert main([*args, "-o", str(out), "--resume", str(state)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "out.jsonl is missing" in err
    assert "start again without --resume" in err
    assert not out.exists()
