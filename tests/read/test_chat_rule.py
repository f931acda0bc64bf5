"""One chat rule (issue 43): a chat trains exactly what its template marks (or, without markers, what its assistant
turns add); a chat that trains nothing is refused by name or left out and counted, whatever else is around it; the
mask equals transformers' ``return_assistant_tokens_mask``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.read.columns.hf import iter_hf
from streambatch.read.text.chat import ChatTemplate
from streambatch.read.text.tokenizers import HFTokenizer

tokenizers = pytest.importorskip("tokenizers")

CHATML = (  # ChatML with Hugging Face's {% generation %} markers: the reply and its <|im_end|> train, not the newline
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PLAIN = (  # no markers: the prefix rule (each assistant turn's content and its end train)
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def char_tokenizer() -> Any:
    """A tokenizer built here (no download): one id per character, ChatML's markers as special tokens."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    model = tokenizers.models.WordLevel({"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok


TOK = char_tokenizer()


def char_ids(text: str) -> list[int]:
    """TOK as a plain callable: one thread per process, so workers=2 runs two spawned workers."""
    return list(TOK.encode(text, add_special_tokens=False).ids)


def by_hand(template: str, chat: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """The tokens and mask each rule gives, written out piece by piece for the two templates."""
    pieces: list[tuple[str, bool]] = []
    for m in chat:
        if template == CHATML:
            pieces.append((f"<|im_start|>{m['role']}\n", False))
            pieces += [(m["content"] + "<|im_end|>", True), ("\n", False)] if m["role"] == "assistant" else []
            pieces += [] if m["role"] == "assistant" else [(m["content"] + "<|im_end|>\n", False)]
        else:
            pieces.append((f"<|{m['role']}|>", False))
            pieces.append((m["content"] + "<|end|>\n", m["role"] == "assistant"))
    tokens: list[int] = []
    mask: list[bool] = []
    for text, trained in pieces:
        ids = TOK.encode(text, add_special_tokens=False).ids
        tokens += ids
        mask += [trained] * len(ids)
    mask[:1] = [False] * len(mask[:1])
    return tokens, mask


roles = st.sampled_from(["system", "user", "assistant"])
contents = st.text(alphabet="ab \n?", max_size=6)
turns = st.fixed_dictionaries({"role": roles, "content": contents})
conversations = st.one_of(
    st.just([]),  # empty
    st.lists(turns, min_size=1, max_size=1),  # single turn
    st.lists(turns, min_size=2, max_size=8).map(lambda c: [*c, {"role": "user", "content": "cut?"}]),  # cut before a reply
    st.lists(turns, min_size=30, max_size=120),  # long
)


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _template_file(tmp_path: Path, template: str) -> Path:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": template}))
    return path


def _tokenizer_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokenizer.json"
    path.write_text(TOK.to_str())
    return path


def _check(tmp_path: Path, template: str, chats: list[list[dict[str, str]]], workers: int) -> None:
    """Prepared with and without skipping: the trained chats keep the by-hand mask, the others are refused by name
    or counted."""
    rows = [{"id": f"c{i}", "messages": chat} for i, chat in enumerate(chats)]
    path = _write(tmp_path / "chats.jsonl", rows)
    options: dict[str, Any] = {
        "tokenizer": str(_tokenizer_file(tmp_path)) if workers == 1 else char_ids,
        "chat_template": str(_template_file(tmp_path, template)),
        "eos_id": None,
        "bos_id": None,
        "workers": workers,
        "quiet": True,
    }
    expected = [by_hand(template, chat) for chat in chats]
    untrained = [i for i, (_, mask) in enumerate(expected) if not any(mask)]
    assert untrained == [i for i, chat in enumerate(chats) if not any(m["role"] == "assistant" for m in chat)]
    if untrained:
        with pytest.raises(sb.DataError, match=rf"chats.jsonl:{untrained[0] + 1} \(document id='c{untrained[0]}'\)"):
            sb.prepare_store([path], tmp_path / "refused", **options)
        assert not (tmp_path / "refused").exists()
    store = sb.prepare_store([path], tmp_path / "s", skip_untrained_documents=True, **options)
    kept = [i for i in range(len(chats)) if i not in untrained]
    assert list(store.ids) == [f"c{i}" for i in kept]
    header = json.loads((tmp_path / "s" / "header.json").read_text())
    assert header.get("untrained_documents_skipped", 0) == len(untrained)
    for at, i in enumerate(kept):
        tokens, mask = expected[i]
        assert store.document(at).tokens.tolist() == tokens
        assert store.loss_mask(at).tolist() == mask


@pytest.mark.parametrize("template", [CHATML, PLAIN], ids=["markers", "prefixes"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chats=st.lists(conversations, min_size=1, max_size=4))
def test_the_chat_rule_in_one_process(template: str, chats: list[list[dict[str, str]]], tmp_path_factory: Any) -> None:
    """Random conversations (empty, single-turn, cut, long), alone or beside others: the by-hand mask, or by name."""
    _check(tmp_path_factory.mktemp("chat"), template, chats, workers=1)


@pytest.mark.parametrize("template", [CHATML, PLAIN], ids=["markers", "prefixes"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chats=st.lists(conversations, min_size=1, max_size=4))
def test_the_chat_rule_with_two_workers(template: str, chats: list[list[dict[str, str]]], tmp_path_factory: Any) -> None:
    """The same rule when spawned workers tokenize the chats."""
    _check(tmp_path_factory.mktemp("chat"), template, chats, workers=2)


def test_a_prompt_only_chat_alone_in_its_file_is_refused(tmp_path: Path) -> None:
    """The issue's case: a file of chats with no assistant turn was stored with no mask (every target trained)."""
    path = _write(tmp_path / "c.jsonl", [{"id": "q", "messages": [{"role": "user", "content": "hi"}]}])
    template = _template_file(tmp_path, PLAIN)
    with pytest.raises(sb.DataError, match=r"c.jsonl:1 \(document id='q'\): the loss mask trains no target"):
        sb.prepare_store([path], tmp_path / "s", chat_template=str(template), quiet=True)
    store = sb.prepare_store([path], tmp_path / "s", chat_template=str(template), skip_untrained_documents=True, quiet=True)
    assert len(store) == 0
    assert json.loads((tmp_path / "s" / "header.json").read_text())["untrained_documents_skipped"] == 1


@settings(max_examples=30, deadline=None)
@given(chat=st.lists(turns, min_size=1, max_size=12))
def test_the_mask_is_transformers_assistant_mask(chat: list[dict[str, str]]) -> None:
    """ChatML with markers: tokens and mask equal apply_chat_template(..., return_assistant_tokens_mask=True)."""
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=TOK)
    fast.chat_template = CHATML
    out = fast.apply_chat_template(chat, tokenize=True, return_assistant_tokens_mask=True, return_dict=True)
    ours = HFTokenizer(TOK, eos_id=None, bos_id=None)
    docs = list(iter_hf([{"messages": chat}], tokenizer=ours, chat_template=ChatTemplate(CHATML), skip_untrained_documents=True))
    hf_mask = [bool(b) for b in out["assistant_masks"]]
    hf_mask[:1] = [False] * len(hf_mask[:1])  # position 0 is never a target (HF's is 0 there too)
    if not any(hf_mask):
        assert docs == []
        return
    assert docs[0].tokens.tolist() == out["input_ids"]
    assert docs[0].loss_mask.tolist() == hf_mask


def test_the_newline_after_im_end_does_not_train() -> None:
    """The issue measured 4.9% of a ChatML job's targets on the newline after <|im_end|>: with markers, none."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ok"}]
    doc = next(iter_hf([{"messages": chat}], tokenizer=HFTokenizer(TOK, eos_id=None, bos_id=None), chat_template=CHATML_T))
    newline = TOK.token_to_id("\n")
    assert not doc.loss_mask[doc.tokens == newline].any()
    assert int(doc.loss_mask.sum()) == 3  # "y", "o", <|im_end|>


CHATML_T = ChatTemplate(CHATML)


def test_a_long_chat_renders_once() -> None:
    """20,000 one-character turns with markers: one rendering (scripts/bench_chat.py times it; the issue saw 84 s)."""
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(20_000)]
    doc = next(iter_hf([{"messages": chat}], tokenizer=HFTokenizer(TOK, eos_id=None, bos_id=None), chat_template=CHATML_T))
    assert int(doc.loss_mask.sum()) == 20_000  # each reply's "x" and <|im_end|>: 10,000 x 2
    user = len(["<|im_start|>", *"user\n", "x", "<|im_end|>", "\n"])
    reply = len(["<|im_start|>", *"assistant\n", "x", "<|im_end|>", "\n"])
    assert len(doc) == 10_000 * (user + reply)


def test_messages_without_a_template_say_to_pass_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A chat row without --chat-template is told to pass it, not that it lacks tokens."""
    path = _write(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    assert main(["prepare", str(path), "-o", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "pass --chat-template FILE" in err
    assert "c.jsonl:1" in err
    assert not (tmp_path / "s").exists()
