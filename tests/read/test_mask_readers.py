"""Tests for loss masks from readers (`streambatch.read.masks`): labels, 0/1 masks, prompt/completion, chats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.read.columns.hf import iter_hf
from streambatch.read.jsonl import iter_records
from streambatch.read.text.masks import ChatTemplate

TEMPLATE = (  # no {% generation %}: the mask comes from rendering prefixes
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_hf_labels_round_trip(tmp_path: Path) -> None:
    """Each window's counted targets are labels[1:] != -100 over its target positions, never position 0."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(5):
        ids = rng.integers(0, 200, 12).tolist()
        labels = [t if rng.random() < 0.5 else -100 for t in ids]
        labels[0] = ids[0]  # set at position 0: still never a target
        labels[-1] = ids[-1]
        rows.append({"id": f"r{i}", "input_ids": ids, "labels": labels})
    store = sb.prepare_store([_write(tmp_path / "l.jsonl", rows)], tmp_path / "s", quiet=True)
    by_id = {r["id"]: r for r in rows}
    for batch in sb.Epoch(store, context_length=4, batch_size=3, seed=5):
        for row, (doc, start) in enumerate(zip(batch.document_ids, batch.starts.tolist(), strict=True)):
            labels = np.array(by_id[doc]["labels"])
            expected = labels[1:][start : start + 4] != -100
            assert batch.loss_mask[row].tolist() == expected.tolist()
    assert [d.loss_mask[0] for d in store] == [False] * 5


def test_loss_mask_and_assistant_masks(tmp_path: Path) -> None:
    """0/1 masks under either name, in JSONL and through iter_records."""
    rows = [{"tokens": [1, 2, 3], "loss_mask": [1, 0, 1]}, {"input_ids": [4, 5, 6], "assistant_masks": [0, 1, 1]}]
    docs = list(iter_records(rows))
    assert [d.loss_mask.tolist() for d in docs] == [[False, False, True], [False, True, True]]
    store = sb.prepare_store([_write(tmp_path / "m.jsonl", rows)], tmp_path / "s", quiet=True)
    assert [store.loss_mask(i).tolist() for i in range(2)] == [[False, False, True], [False, True, True]]


def test_prompt_completion_pairs(tmp_path: Path) -> None:
    """The completion's tokens (and eos) train; the prompt's and bos never do."""
    rows = [{"q": "ab", "a": "cde"}]
    store = sb.prepare_store(
        [_write(tmp_path / "p.jsonl", rows)],
        tmp_path / "s",
        prompt_field="q",
        completion_field="a",
        bos_id=1,
        eos_id=2,
        quiet=True,
    )
    assert store.document(0).tokens.tolist() == [1, 97, 98, 99, 100, 101, 2]
    assert store.loss_mask(0).tolist() == [False, False, False, True, True, True, True]


def test_chat_template_mask_equals_one_by_hand(tmp_path: Path) -> None:
    """A template without {% generation %}: the prefix-rendered mask is exactly the assistant contents and their ends."""
    template = tmp_path / "tokenizer_config.json"
    template.write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"}))
    rows = [{"messages": CHAT}]
    store = sb.prepare_store(
        [_write(tmp_path / "c.jsonl", rows)], tmp_path / "s", chat_template=str(template), bos_id=None, eos_id=None, quiet=True
    )
    text = bytes(store.document(0).tokens.astype(np.uint8)).decode()
    expected_text = (
        "<s><|system|>be brief<|end|>\n<|user|>hi<|end|>\n<|assistant|>hello<|end|>\n<|user|>2+2?<|end|>\n<|assistant|>4<|end|>\n"
    )
    assert text == expected_text
    by_hand = np.zeros(len(text), bool)
    for answer in ("hello<|end|>\n", "4<|end|>\n"):
        at = text.index("<|assistant|>" + answer) + len("<|assistant|>")
        by_hand[at : at + len(answer)] = True
    assert store.loss_mask(0).tolist() == by_hand.tolist()


def test_a_template_that_is_not_prefix_stable_is_refused() -> None:
    """A template that rewrites earlier turns (here: only the last user turn is shown) names the document."""
    template = ChatTemplate("{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(sb.DataError, match=r"row 0 \(document id=.0.\): the chat template is not prefix-stable at messages\[1\]"):
        list(iter_hf([{"messages": CHAT[1:3]}], chat_template=template))


def test_the_sandbox_refuses_unsafe_templates() -> None:
    """Templates run in jinja2's immutable sandbox: mutating input or reaching internals is a DataError."""
    template = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(sb.DataError, match="chat template raised SecurityError"):
        list(iter_hf([{"messages": CHAT[1:3]}], chat_template=template))
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(sb.DataError, match="roles must alternate"):
        list(iter_hf([{"messages": CHAT[1:3]}], chat_template=raising))


def test_untrained_documents_are_refused_or_skipped(tmp_path: Path) -> None:
    """A document whose mask trains nothing is refused by name; skipping leaves it out and counts it."""
    rows = [{"id": "empty", "q": "ab", "a": ""}, {"id": "ok", "q": "ab", "a": "c"}]
    path = _write(tmp_path / "p.jsonl", rows)
    options = {"prompt_field": "q", "completion_field": "a", "bos_id": None, "eos_id": None, "quiet": True}
    with pytest.raises(sb.DataError, match=r"p.jsonl:1 \(document id='empty'\): the loss mask trains no target"):
        sb.prepare_store([path], tmp_path / "s", **options)
    assert not (tmp_path / "s").exists()
    store = sb.prepare_store([path], tmp_path / "s", skip_untrained_documents=True, **options)
    assert store.ids == ("ok",)
    header = json.loads((tmp_path / "s" / "header.json").read_text())
    assert header["untrained_documents_skipped"] == 1
    with pytest.raises(sb.DataError, match="trains no target"):
        list(iter_records([{"tokens": [1, 2], "labels": [1, -100]}]))
    assert list(iter_records([{"tokens": [1, 2], "labels": [1, -100]}], skip_untrained_documents=True)) == []


def test_parquet_labels_and_prompt_columns(tmp_path: Path) -> None:
    """Parquet tables carry labels columns and prompt/completion text columns."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 4]], "labels": [[-100, -100, 3, 4]]}), tmp_path / "t.parquet")
    store = sb.prepare_store([tmp_path / "t.parquet"], tmp_path / "s", quiet=True)
    assert store.loss_mask(0).tolist() == [False, False, True, True]
    pq.write_table(pa.table({"q": ["ab"], "a": ["c"]}), tmp_path / "p.parquet")
    store = sb.prepare_store(
        [tmp_path / "p.parquet"], tmp_path / "t", prompt_field="q", completion_field="a", bos_id=None, eos_id=None, quiet=True
    )
    assert store.loss_mask(0).tolist() == [False, False, True]
