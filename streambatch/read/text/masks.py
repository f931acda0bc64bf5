"""Loss masks from rows: HF ``labels``, ``loss_mask``/``assistant_masks``, prompt/completion pairs and chat ``messages``.

Token rows bring their mask as a column (`token_row_mask`).  Text rows bring it
as *segments*: pieces of text, each trained or not, tokenized one by one and
joined (`segment_tokens`), so every token knows which piece it came from:

* a prompt/completion pair is two segments, the completion trained;
* a chat (`ChatTemplate`) is cut where rendering ``messages[:i]`` with the
  generation prompt ends and rendering ``messages[:i + 1]`` ends: what an
  assistant turn adds is trained.  Templates need no ``{% generation %}`` block,
  but each rendering must be a prefix of the next, or the document is refused.

A document whose mask trains nothing is refused by name (`untrained_reason`),
unless the reader skips such documents (``skip_untrained_documents``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, DataError
from ...model.mask import check_loss_mask, labels_mask
from ...model.validate import short
from .tokenizers import Tokenizer, encode_texts, require, wrap_documents

MASK_KEYS = ("labels", "loss_mask", "assistant_masks")  # HF labels (-100 = not trained), then 0/1 masks
Segments = list[tuple[str, bool]]


def token_row_mask(row: Mapping[str, Any], length: int, where: str) -> npt.NDArray[np.bool_] | None:
    """The loss mask a token row carries (``labels``, ``loss_mask`` or ``assistant_masks``), or None.

    >>> token_row_mask({"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, 3, "row 0").tolist()
    [False, True, True]
    """
    key = next((k for k in MASK_KEYS if k in row and row[k] is not None), None)
    if key is None:
        return None
    if key == "labels":
        return labels_mask(row[key], length, where)
    return check_loss_mask(row[key], length, f"{where}: {key}")


def prompt_segments(row: Mapping[str, Any], prompt: str, completion: str, where: str) -> Segments:
    """A prompt/completion row's two segments: the prompt not trained, the completion trained.

    >>> prompt_segments({"q": "2+2=", "a": "4"}, "q", "a", "row 0")
    [('2+2=', False), ('4', True)]
    """
    pieces = []
    for field, trained in ((prompt, False), (completion, True)):
        if field not in row:
            raise DataError(f"{where}: missing field {field!r}; each row needs {prompt!r} and {completion!r} text")
        text = row[field]
        if not isinstance(text, str):
            raise DataError(f"{where}: {field}={short(text)} is not a string; prompt and completion are text to tokenize")
        pieces.append((text, trained))
    return pieces


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template, rendered in jinja2's immutable sandbox as Hugging Face renders it.

    *source* is the template text; *bos_token*/*eos_token* are the strings it may
    use.  `from_file` reads a template file or a ``tokenizer_config.json``.

    >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    ...                  "{% if add_generation_prompt %}<assistant>{% endif %}")
    >>> t.segments([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "row 0")
    [('<user>hi', False), ('<assistant>', False), ('yo', True)]
    """

    source: str
    bos_token: str = ""
    eos_token: str = ""
    name: str = "chat template"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ChatTemplate:
        """A template file, or a ``tokenizer_config.json`` (its ``chat_template``, ``bos_token``, ``eos_token``)."""
        name = os.fspath(path)
        try:
            with open(name, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"chat_template={name!r}: cannot read it ({err}); pass a template file") from None
        try:
            config = json.loads(text)
        except ValueError:
            return cls(text, name=name)
        if not isinstance(config, dict) or "chat_template" not in config:
            raise ConfigError(f"chat_template={name!r} is JSON without a 'chat_template' entry; pass a tokenizer_config.json")
        template = config["chat_template"]
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ConfigError(f"chat_template={name!r}: its 'chat_template' is not a template string")
        return cls(template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")), name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", _compile(self.source, self.name))

    def __reduce__(self) -> tuple[Any, ...]:  # workers rebuild the compiled template
        return (ChatTemplate, (self.source, self.bos_token, self.eos_token, self.name))

    def render(self, messages: Sequence[Any], add_generation_prompt: bool, where: str) -> str:
        """The template's text for *messages*; a template error is a `DataError` naming *where*."""
        template: Any = self.__dict__["_compiled"]
        try:
            text = template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception as err:  # the sandbox's SecurityError, raise_exception, a template bug
            raise DataError(f"{where}: the chat template raised {type(err).__name__}: {err}") from None
        return str(text)

    def segments(self, messages: Any, where: str) -> Segments:
        """The chat's text cut into segments; what each assistant turn adds is trained.

        Turn ``i``'s tokens are what rendering ``messages[:i + 1]`` adds to rendering
        ``messages[:i]`` with the generation prompt; every rendering must extend the
        previous one, else the document is refused (the template is not prefix-stable).
        """
        turns = _messages(messages, where)
        pieces: Segments = []
        done = ""
        for i, message in enumerate(turns):
            full = self.render(turns[: i + 1], False, where)
            if message["role"] == "assistant":
                head = self.render(turns[:i], True, where)
                _extends(done, head, where, i, "the generation prompt")
                _extends(head, full, where, i, "its turn")
                pieces.append((head[len(done) :], False))
                pieces.append((full[len(head) :], True))
            else:
                _extends(done, full, where, i, "its turn")
                pieces.append((full[len(done) :], False))
            done = full
        return [(text, trained) for text, trained in pieces if text]


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataError(f"{where}: messages={short(messages)} must be a non-empty list of {{role, content}} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}: messages[{i}]={short(message)} must be an object with a 'role' string")
    return [dict(m) for m in messages]


def _extends(before: str, after: str, where: str, turn: int, what: str) -> None:
    if not after.startswith(before):
        at = next((k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after)))
        raise DataError(
            f"{where}: the chat template is not prefix-stable at messages[{turn}] ({what}): rendering the conversation "
            f"up to it changes earlier text at character {at} ({short(before[at : at + 20])} becomes "
            f"{short(after[at : at + 20])}), so the assistant's tokens cannot be found; use a template whose "
            "renderings extend each other, or give labels/assistant_masks"
        )


def _compile(source: str, name: str) -> Any:
    jinja2 = require("jinja2", "chat", "rendering chat templates")
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """HF's ``{% generation %}`` tag: renders its body (the mask comes from prefixes anyway)."""

        tags = {"generation"}  # noqa: RUF012 - jinja2 declares it a set

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ConfigError(f"chat_template={name!r}: line {err.lineno}: {err.message}; fix the template") from None


def segment_tokens(
    tokenizer: Tokenizer, documents: Sequence[Segments], label: Callable[[int], str]
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Tokenize each document's segments (one by one, all in one batch) and join them, bos/eos around each document.

    Returns flat tokens, one length per document and the flat mask: a trained
    segment's tokens are set, and eos when the last segment is trained; bos never.
    """
    texts = [text for pieces in documents for text, _ in pieces]
    owner = np.repeat(np.arange(len(documents)), [len(p) for p in documents])
    raw = _Raw(tokenizer)
    body, sizes = encode_texts(raw, texts, lambda k: label(int(owner[k])))
    trained = np.repeat(np.fromiter((t for pieces in documents for _, t in pieces), dtype=np.bool_, count=len(texts)), sizes)
    per_doc = np.zeros(len(documents), dtype=np.int64)
    np.add.at(per_doc, owner, sizes)
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    lengths = per_doc + (bos is not None) + (eos is not None)
    tokens, keep = wrap_documents(body.astype(np.uint32, copy=False), lengths, bos, eos)
    mask = np.zeros(tokens.size, dtype=np.bool_)
    if eos is not None:  # the eos trains when the document's last segment does
        last = np.fromiter((bool(p) and p[-1][1] for p in documents), dtype=np.bool_, count=len(documents))
        mask[(np.cumsum(lengths) - 1)[last]] = True
    mask[keep] = trained
    return tokens, lengths, mask


class _Raw:
    """*tokenizer* without its bos/eos (segments are joined first, then wrapped once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.name, self.vocab_size = tokenizer.name, tokenizer.vocab_size
        self.eos_id = self.bos_id = None

    def encode(self, text: str) -> Any:
        return self._tokenizer.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> Sequence[Any]:
        return self._tokenizer.encode_batch(texts)

    def describe(self) -> dict[str, Any]:
        return self._tokenizer.describe()
