"""Tests for `streambatch.read.text.tokenizers`: the byte, Hugging Face and callable tokenizers, bos/eos, vocabularies."""

from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.read.text.tokenizers import (
    BOS_NAMES,
    EOS_NAMES,
    ByteTokenizer,
    CallableTokenizer,
    HFTokenizer,
    as_tokenizer,
    encode_texts,
)

CORPUS = [f"the {w} fox number {i} jumps over the lazy dog" for i, w in enumerate(["quick", "brown", "red", "grey"] * 50)]


def train_bpe(path: Path, specials: list[str], vocab_size: int = 300) -> Path:
    """Train a small byte-level BPE on text this test writes, and save it as tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path))
    return path


@pytest.mark.parametrize(
    ("eos", "bos", "expected"),
    [
        (None, None, [[104, 105], []]),
        (256, None, [[104, 105, 256], [256]]),
        (None, 257, [[257, 104, 105], [257]]),
        (256, 257, [[257, 104, 105, 256], [257, 256]]),
    ],
    ids=["none", "eos", "bos", "both"],
)
def test_bos_and_eos_around_every_document(eos: int | None, bos: int | None, expected: list[list[int]]) -> None:
    """bos is prepended and eos appended to each document, empty ones included."""
    tokens, lengths = encode_texts(ByteTokenizer(eos_id=eos, bos_id=bos), ["hi", ""], ["a", "b"])
    assert expected == [p.tolist() for p in np.split(tokens, np.cumsum(lengths)[:-1])]


@given(
    st.lists(st.text(max_size=20), max_size=6),
    st.one_of(st.none(), st.integers(0, 300)),
    st.one_of(st.none(), st.integers(0, 300)),
)
def test_encode_texts_is_each_text_framed(texts: list[str], eos: int | None, bos: int | None) -> None:
    """The flat result is, text by text, [bos] + encode(text) + [eos]."""
    tok = ByteTokenizer(eos_id=eos, bos_id=bos)
    tokens, lengths = encode_texts(tok, texts, [str(i) for i in range(len(texts))])
    expected = [
        [*([bos] if bos is not None else []), *tok.encode(t).tolist(), *([eos] if eos is not None else [])] for t in texts
    ]
    assert [len(e) for e in expected] == lengths.tolist()
    assert [x for e in expected for x in e] == tokens.tolist()
    assert np.uint32 == tokens.dtype


def test_byte_tokenizer_vocabulary_grows_with_its_specials() -> None:
    """256 byte ids, plus room for special ids beyond them."""
    assert 256 == ByteTokenizer().vocab_size
    assert 258 == ByteTokenizer(eos_id=257, bos_id=3).vocab_size
    assert {"name": "bytes", "kind": "bytes", "file_hash": None, "vocab_size": 257, "eos_id": 256, "bos_id": None} == (
        ByteTokenizer(eos_id=256).describe()
    )


def test_callable_vocabulary_is_enforced() -> None:
    """A callable's ids beyond its declared vocabulary: DataError naming the document and position."""
    tok = CallableTokenizer(lambda s: [len(w) for w in s.split()], name="lengths", vocab_size=4)
    with pytest.raises(
        sb.DataError, match=r"f.txt:2: token\[1\]=5 is outside the vocabulary of tokenizer 'lengths' \(vocab_size=4\)"
    ):
        encode_texts(tok, ["a bb", "ccc fffff"], ["f.txt:1", "f.txt:2"])


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (lambda s: [1.5] if s == "boom" else [1], r"b: tokenizer output: token\[0\]=1.5 is not an integer"),
        (lambda s: 1 / 0 if s == "boom" else [1], r"b: the tokenizer raised ZeroDivisionError"),
        (lambda s: [-1] if s == "boom" else [1], r"b: tokenizer output: token\[0\]=-1 is outside"),
    ],
    ids=["float", "raises", "negative"],
)
def test_bad_tokenizer_output_names_the_text(function: Any, message: str) -> None:
    """A user tokenizer's failure is reported at the text it failed on."""
    with pytest.raises(sb.DataError, match=message):
        encode_texts(as_tokenizer(function), ["fine", "boom"], ["a", "b"])


def test_hf_tokenizer_from_file(tmp_path: Path) -> None:
    """A BPE trained here: hash of the file, vocabulary size, <|endoftext|> found as eos, no bos."""
    path = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    tok = HFTokenizer.from_file(path)
    assert "blake2b-256:" + hashlib.blake2b(path.read_bytes(), digest_size=32).hexdigest() == tok.file_hash
    assert (300, 0, None) == (tok.vocab_size, tok.eos_id, tok.bos_id)
    described = tok.describe()
    assert {"name": "tokenizer.json", "kind": "huggingface", "eos_token": "<|endoftext|>"}.items() <= described.items()
    text = "the quick fox jumps"
    assert tok.tokenizer.decode(tok.encode(text).tolist()) == text
    assert [tok.encode(t).tolist() for t in CORPUS[:5]] == [a.tolist() for a in tok.encode_batch(CORPUS[:5])]
    again = pickle.loads(pickle.dumps(tok))
    assert tok.encode(text).tolist() == again.encode(text).tolist()
    assert tok.describe() == again.describe()


@pytest.mark.parametrize(
    ("specials", "eos", "bos"),
    [
        (["<s>", "</s>"], "</s>", "<s>"),
        (["[CLS]", "[SEP]", "[PAD]"], "[SEP]", "[CLS]"),
        (["<|begin_of_text|>", "<|end_of_text|>", "<s>"], "<|end_of_text|>", "<|begin_of_text|>"),
        (["[PAD]"], None, None),
    ],
    ids=["llama2", "bert", "llama3", "none"],
)
def test_special_ids_follow_the_documented_names(tmp_path: Path, specials: list[str], eos: str | None, bos: str | None) -> None:
    """eos/bos: the first name of EOS_NAMES/BOS_NAMES that the vocabulary holds; none otherwise."""
    tok = HFTokenizer.from_file(train_bpe(tmp_path / "t.json", specials))
    assert (eos, bos) == (tok.describe().get("eos_token"), tok.describe().get("bos_token"))
    assert eos is None or eos in EOS_NAMES
    assert bos is None or bos in BOS_NAMES
    tokens, _ = encode_texts(tok, ["the fox"], ["x"])
    if bos is not None:
        assert tok.tokenizer.token_to_id(bos) == tokens[0]
    if eos is not None:
        assert tok.tokenizer.token_to_id(eos) == tokens[-1]


def test_overrides_and_errors(tmp_path: Path) -> None:
    """eos_id/bos_id override the tokenizer's (None: none); ids outside the vocabulary and bad files are ConfigErrors."""
    path = train_bpe(tmp_path / "t.json", ["<s>", "</s>"])
    tok = as_tokenizer(path, eos_id=None, bos_id=5)
    assert (None, 5) == (tok.eos_id, tok.bos_id)
    assert 1 == as_tokenizer(tok, eos_id=1).eos_id
    with pytest.raises(sb.ConfigError, match=r"eos_id=300 is outside the vocabulary of 't.json' \(vocab_size=300\)"):
        as_tokenizer(path, eos_id=300)
    with pytest.raises(sb.ConfigError, match=r"tokenizer='.*missing.json': cannot read"):
        HFTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(sb.ConfigError, match=r"is not a Hugging Face tokenizer.json"):
        HFTokenizer.from_file(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        (42, {}, r"tokenizer=42 is not a tokenizer"),
        (None, {"eos_id": -1}, r"eos_id=-1 must be a token id in \[0, 2\*\*32\)"),
        (None, {"bos_id": 1.5}, r"bos_id=1.5 must be a token id"),
        (lambda s: [1], {"eos_id": 9}, None),
    ],
    ids=["not-a-tokenizer", "negative-eos", "float-bos", "callable-ok"],
)
def test_as_tokenizer_arguments(spec: Any, options: dict[str, Any], message: str | None) -> None:
    """What as_tokenizer accepts, and the ConfigError for the rest."""
    if message is None:
        assert 9 == as_tokenizer(spec, **options).eos_id
    else:
        with pytest.raises(sb.ConfigError, match=message):
            as_tokenizer(spec, **options)


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the tokenizers package, --tokenizer says which extra to install (an ImportError too)."""
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ImportError, match=r"pip install 'tokenizers>=[0-9.]+' \(the tokenizers extra of streambatch"):
        HFTokenizer.from_file("tokenizer.json")
