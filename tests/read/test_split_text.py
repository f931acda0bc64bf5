"""Long texts tokenized in pieces give exactly the ids of the whole text, with real `tokenizers` pipelines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streambatch.read.text import split_text
from streambatch.read.text.tokenizers import HFTokenizer

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from tests.hostile import PEAK_RSS  # noqa: E402

GPT4_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "def f(x):\n    return x + 1\n\n\nclass A:\n\tpass\r\n",
    "the quick brown fox\njumps over\n\nthe lazy dog. 123 4567\n",
    "héllo wörld\n한국어 텍스트\ne\u0301t\u00e9\n",
] * 20
ALPHABET = "ab é\u0301\n\n\t\r.1(x한\u1161\u200d  '"


def _bpe(pre: Any, normalizer: Any = None) -> Any:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _wordpiece() -> Any:
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False))
    return tok


SPLITTABLE = {
    "byte-level BPE": lambda: _bpe(pre_tokenizers.ByteLevel(add_prefix_space=False)),
    "GPT-4 Split + ByteLevel BPE": lambda: _bpe(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(GPT4_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
        normalizers.NFC(),
    ),
    "Whitespace WordPiece": _wordpiece,
}
BUILT = {name: make() for name, make in SPLITTABLE.items()}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(sorted(SPLITTABLE)),
    texts=st.lists(st.text(alphabet=ALPHABET, max_size=120), min_size=1, max_size=4),
    piece=st.integers(1, 12),
    batch=st.integers(1, 40),
)
def test_pieces_give_the_ids_of_the_whole(
    monkeypatch: pytest.MonkeyPatch, name: str, texts: list[str], piece: int, batch: int
) -> None:
    tok = BUILT[name]
    wrapped = HFTokenizer(tok)
    assert wrapped.split
    monkeypatch.setattr(split_text, "PIECE_CHARS", piece)
    monkeypatch.setattr(split_text, "BATCH_CHARS", batch)
    expected = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    assert expected == [ids.tolist() for ids in wrapped.encode_batch(texts)]
    assert expected[0] == wrapped.encode(texts[0]).tolist()
    one_line = " ".join(texts).replace("\n", " ")  # no newline: cut at spaces
    assert tok.encode(one_line, add_special_tokens=False).ids == wrapped.encode(one_line).tolist()


@pytest.mark.parametrize("name", sorted(SPLITTABLE))
def test_long_texts_are_cut(name: str) -> None:
    """Real text is cut (after lone newlines; without newlines, before lone spaces), and the pieces' ids are the whole's."""
    for text, mark in (("".join(CORPUS) * 50, "\n"), (" ".join("".join(CORPUS).split()) * 50, " ")):
        cuts = split_text.cuts(text, BUILT[name].pre_tokenizer, 1000)
        assert len(cuts) > len(text) // 2000
        assert all((text[c - 1] if mark == "\n" else text[c]) == mark for c in cuts)
        pieces = [text[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        whole = BUILT[name].encode(text, add_special_tokens=False).ids
        assert whole == [i for p in pieces for i in BUILT[name].encode(p, add_special_tokens=False).ids]


def test_unsafe_tokenizers_are_not_cut() -> None:
    """A prefix space, Metaspace, no pre-tokenizer, a non-local normalizer or an added token holding \\n: whole texts."""
    prefix = _bpe(pre_tokenizers.ByteLevel(add_prefix_space=True))
    meta = _bpe(pre_tokenizers.Metaspace())
    bare = _bpe(None)
    strip = _bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizers.Strip())
    added = _bpe(pre_tokenizers.ByteLevel(add_prefix_space=False))
    added.add_special_tokens(["<a>\nb"])
    for tok in (prefix, meta, bare, strip, added):
        assert not split_text.splittable(tok)
        assert not HFTokenizer(tok).split
    text = "ab\ncd\n" * 10
    assert [prefix.encode(text, add_special_tokens=False).ids] == [a.tolist() for a in HFTokenizer(prefix).encode_batch([text])]


_CHILD = (
    PEAK_RSS
    + """
import resource, sys
import numpy as np
from tokenizers import Tokenizer
from streambatch.read.text.tokenizers import HFTokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8").read()
wrapped = HFTokenizer(tok)
base = peak()
ids = wrapped.encode(text)
growth = peak() - base
whole = np.array(tok.encode(text, add_special_tokens=False).ids, np.uint32)  # after the peak was read
print(ids.size, int(np.array_equal(ids, whole)), growth)
"""
)


@pytest.mark.slow
def test_a_long_text_in_bounded_memory(tmp_path: Path) -> None:
    """A 4 MB text: the tokenizer's peak is bounded (~140 bytes per character whole: 560 MB), the ids unchanged."""
    tok = BUILT["byte-level BPE"]
    tok.save(str(tmp_path / "tok.json"))
    text = "".join(CORPUS) * (4_000_000 // len("".join(CORPUS)))
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "tok.json"), str(tmp_path / "t.txt")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    count, equal, growth = map(int, done.stdout.split())
    assert count > len(text) // 4
    assert equal == 1
    assert growth < 150 << 20, f"peak growth {growth >> 20} MiB for {len(text):,} characters"


def test_prepare_cli_stores_the_whole_texts_ids(tmp_path: Path) -> None:
    """`prepare --tokenizer` of a text longer than a piece: the stored ids are the whole text's, plus the eos id."""
    import io

    import streambatch as sb
    from streambatch.cli import main

    tok = BUILT["GPT-4 Split + ByteLevel BPE"]
    tok.save(str(tmp_path / "tok.json"))
    text = "".join(CORPUS) * 60  # 150,000 characters: cut into pieces
    assert len(split_text.cuts(text, tok.pre_tokenizer)) >= 2
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    argv = ["prepare", str(tmp_path / "long.txt"), "--tokenizer", str(tmp_path / "tok.json"), "-o", str(tmp_path / "s"), "-q"]
    assert 0 == main(argv, io.StringIO())
    stored = sb.open_store(tmp_path / "s").document(0).tokens.tolist()
    assert [*tok.encode(text, add_special_tokens=False).ids, tok.token_to_id("<|endoftext|>")] == stored
