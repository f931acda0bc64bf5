"""A data contract that audit proves (issue 43): each store records the tokenizer's digest and its BOS/EOS policy;
mixing, sharding and resuming across a difference are refused; audit reports tokens in = tokens out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.model.contract import contract_of
from streambatch.read.text.tokenizers import ByteTokenizer
from streambatch.tools.audit.check import audit_epoch


def _text_store(tmp_path: Path, name: str, eos_id: int | None) -> sb.DocumentStore:
    folder = tmp_path / f"{name}-in"
    folder.mkdir()
    for i in range(3):
        (folder / f"{name}-{i}.txt").write_text(f"document {i} of {name} " * 4)
    return sb.prepare_store([folder], tmp_path / name, eos_id=eos_id, quiet=True)


def _token_store(tmp_path: Path, name: str, eos_id: int | None) -> Path:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "tokens": list(range(i, i + 30))}) + "\n" for i in range(4)))
    sb.prepare_store([path], tmp_path / name, tokenizer=None if eos_id is None else ByteTokenizer(eos_id=eos_id), quiet=True)
    return tmp_path / name


def test_a_store_records_its_contract(tmp_path: Path) -> None:
    _text_store(tmp_path, "a", 256)
    header = json.loads((tmp_path / "a" / "header.json").read_text())
    assert header["version"] == 1  # an optional field: the format's version is unchanged
    assert header["contract"] == {
        "version": 1,
        "tokenizer_digest": contract_of(header["tokenizer"])["tokenizer_digest"],
        "bos_id": None,
        "eos_id": 256,
    }
    assert header["contract"]["tokenizer_digest"].startswith("blake2b-256:")


def test_an_older_store_without_the_field_still_opens(tmp_path: Path) -> None:
    _text_store(tmp_path, "a", 256)
    path = tmp_path / "a" / "header.json"
    header = json.loads(path.read_text())
    del header["contract"]
    path.write_text(json.dumps(header))
    assert sb.open_store(tmp_path / "a").tokenizer == header["tokenizer"]


def test_an_edited_contract_is_refused(tmp_path: Path) -> None:
    _text_store(tmp_path, "a", 256)
    path = tmp_path / "a" / "header.json"
    header = json.loads(path.read_text())
    header["contract"]["eos_id"] = 0
    path.write_text(json.dumps(header))
    with pytest.raises(StoreError, match=r"header.json: contract=.* is not the contract of its tokenizer entry"):
        sb.open_store(tmp_path / "a")


def test_mixing_or_sharding_across_a_bos_eos_difference_is_refused(tmp_path: Path) -> None:
    """One tokenizer (bytes), another end-of-document id: the token ids agree, the documents do not."""
    a, b = _text_store(tmp_path, "a", 0), _text_store(tmp_path, "b", 1)
    with pytest.raises(sb.DataError, match=r"source 'b' wraps each text document in bos_id=None, eos_id=1 but source 'a'"):
        sb.mix([sb.windows(a, context_length=4), sb.windows(b, context_length=4)], [1, 1], seed=1, names=["a", "b"])
    with pytest.raises(sb.DataError, match=r"eos_id=1 but .* eos_id=0; a corpus mixes documents of one BOS/EOS policy"):
        sb.write_corpus(tmp_path / "corpus.json", [tmp_path / "a", tmp_path / "b"])
    assert not (tmp_path / "corpus.json").exists()
    same = _text_store(tmp_path, "c", 0)
    assert len(sb.mix([sb.windows(a, context_length=4), sb.windows(same, context_length=4)], [1, 1], seed=1)) > 0


def test_resuming_across_a_contract_difference_is_refused(tmp_path: Path) -> None:
    """Token inputs are stored as given: two stores of the same tokens share a fingerprint, not a contract."""
    first = _token_store(tmp_path, "one", 300)
    run = sb.Run(sb.open_store(first), context_length=4, batch_size=2, seed=3)
    next(iter(run))
    state = run.state_dict()
    assert "|eos=300" in state["contract"]
    other = sb.Run(sb.open_store(_token_store(tmp_path, "two", 301)), context_length=4, batch_size=2, seed=3)
    assert other.fingerprint == run.fingerprint
    with pytest.raises(sb.StateError, match=r"state contract='blake2b-256:.*\|eos=300' but this run has contract=.*eos=301"):
        other.load_state_dict(state)
    plain = sb.Run(sb.open_store(_token_store(tmp_path, "plain", None)), context_length=4, batch_size=2, seed=3)
    assert "contract" not in plain.state_dict()  # stores without a contract keep their states as they were
    again = sb.Run(sb.open_store(first), context_length=4, batch_size=2, seed=3)
    again.load_state_dict(state)
    assert again.position == run.position


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    context_length=st.integers(1, 6),
    stride=st.integers(1, 9),
)
def test_audit_balances_tokens_in_and_out(lengths: list[int], context_length: int, stride: int) -> None:
    docs = [sb.Document(f"d{i}", "train", list(range(n))) for i, n in enumerate(lengths)]
    docs.append(sb.Document("other", "validation", list(range(50))))  # another partition: never counted in
    epoch = sb.Epoch(docs, context_length=context_length, stride=stride, batch_size=3, seed=5, keep_partition=True)
    result = audit_epoch(epoch)
    tokens = result.tokens
    assert tokens["in"] == sum(lengths)
    assert tokens["balanced"]
    assert tokens["in"] == tokens["out"] + tokens["left_out"]
    width = context_length + 1
    short = sum(n for n in lengths if n < width)
    assert tokens["short_documents"] == short
    held = 0  # by hand: each document's windows, every stride, while T + 1 tokens fit
    for n in lengths:
        covered = set()
        for start in range(0, n - width + 1, stride):
            covered.update(range(start, start + width))
        held += len(covered)
    assert tokens["out"] == held
