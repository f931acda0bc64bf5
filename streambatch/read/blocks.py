"""What every format's reader produces: `Block`s of consecutive documents, under one set of `ReadOptions`.

A `Block` packs documents as flat tokens + lengths (what `streambatch.prepare_store`
writes, `documents` unpacks).  `ReadKeywords` are the reading keywords a user
passes (to `prepare_store`, `iter_files`, the CLI); `read_options` checks them once
into a `ReadOptions`, which every reader takes.
"""

from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

from .._checks import is_integer
from ..errors import ConfigError, DataError
from ..model.documents import PARTITIONS, Document, Partition
from ..model.mask import untrained_reason
from ..model.validate import TOKEN_LIMIT, check_vocabulary
from .inputs import MAX_DOCUMENT_BYTES, MAX_LINE_BYTES
from .text.chat import RENDER_SECONDS, ChatTemplate
from .text.tokenizers import AUTO, ByteTokenizer, SpecialId, Tokenizer, TokenizerSpec, as_tokenizer, encode_texts

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

BLOCK_TOKENS = 1 << 22  # .npy/.bin documents are packed about 4 Mi tokens at a time
BLOCK_DOCUMENTS = 1 << 16  # lines become blocks of at most this many documents: bounded per-document temporaries


def batches(items: Iterable[T], size: int = BLOCK_DOCUMENTS) -> Iterator[list[T]]:
    """*items* in lists of at most *size* (``itertools.batched``, Python 3.12).

    >>> list(batches(range(5), 2))
    [[0, 1], [2, 3], [4]]
    """
    iterator = iter(items)
    while group := list(itertools.islice(iterator, size)):
        yield group


@dataclass(frozen=True, eq=False)
class Block:
    """Consecutive documents packed: flat *tokens*, one length, id, partition code and *where* per document.

    *tokenized* counts the documents the tokenizer made (the others came as token ids).
    *loss_mask* is one bool per token (flat, like *tokens*) or None (every target
    trains); *untrained* counts documents left out because their mask trained nothing.
    """

    tokens: npt.NDArray[Any]
    lengths: npt.NDArray[np.int64]
    ids: list[str]
    codes: npt.NDArray[np.uint8]
    wheres: list[str]
    tokenized: int = 0
    loss_mask: npt.NDArray[np.bool_] | None = None
    untrained: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def label(self, index: int) -> str:
        """How errors name document *index*: ``where (document id=...)``."""
        where, name = self.wheres[index], self.ids[index]
        return f"{where} (document id={name!r})" if where else f"document id={name!r}"

    def documents(self) -> Iterator[Document]:
        """The block's documents, one `Document` each."""
        ends = np.cumsum(self.lengths).tolist()
        start = 0
        mask = self.loss_mask
        for i, end in enumerate(ends):
            part = None if mask is None else mask[start:end]
            yield Document(self.ids[i], PARTITIONS[int(self.codes[i])], self.tokens[start:end], part, where=self.wheres[i])
            start = end

    def with_masks(self, skip_untrained: bool) -> Block:
        """This block with each document's position 0 cleared; a document that trains nothing refused, or left out.

        Nothing to do without a mask.  Left-out documents are counted in `untrained`.
        """
        if self.loss_mask is None or not len(self):
            return self
        mask = self.loss_mask.copy()
        ends = np.cumsum(self.lengths)
        starts = ends - self.lengths
        mask[starts[self.lengths > 0]] = False
        running = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
        trained = running[ends] - running[starts]
        bad = np.flatnonzero(trained == 0)
        if not bad.size:
            return Block(self.tokens, self.lengths, self.ids, self.codes, self.wheres, self.tokenized, mask, self.untrained)
        if not skip_untrained:
            first = int(bad[0])
            raise DataError(untrained_reason(mask[starts[first] : ends[first]], self.label(first)))
        keep = np.ones(len(self), dtype=np.bool_)
        keep[bad] = False
        tokens_kept = np.repeat(keep, self.lengths)
        picked = np.flatnonzero(keep).tolist()
        return Block(
            self.tokens[tokens_kept],
            self.lengths[keep],
            [self.ids[i] for i in picked],
            self.codes[keep],
            [self.wheres[i] for i in picked],
            self.tokenized,
            mask[tokens_kept],
            self.untrained + int(bad.size),
        )


@dataclass(frozen=True)
class ReadOptions:
    """How files become documents (the options of `iter_files` and `prepare_store`)."""

    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)
    per_line: bool = False
    partition: Partition = Partition.TRAIN
    column: str | None = None
    bin_separator: int | None = None
    bin_dtype: str = "uint16"
    vocab_size: int | None = None  # token inputs must fit this (the tokenizer's, when one is given)
    named_tokenizer: bool = False  # the user named the tokenizer (then a store records it)
    max_line_bytes: int = MAX_LINE_BYTES  # one line (a JSONL row; a text document with per_line) may hold no more
    max_document_bytes: int = MAX_DOCUMENT_BYTES  # one text document (a whole file, a row's text) may hold no more
    prompt_field: str | None = None  # with completion_field: rows are prompt/completion text pairs (the completion trains)
    completion_field: str | None = None
    chat_template: ChatTemplate | None = None  # rows with "messages" are chats rendered by it (assistant turns train)
    skip_untrained_documents: bool = False  # leave out (and count) documents whose mask trains nothing, else refuse them
    labels_shifted: bool = False  # token rows' labels are shifted by one (labels[i] is the target at i + 1)
    chat_render_seconds: float = RENDER_SECONDS  # the time budget of one chat's renderings


class ReadKeywords(TypedDict, total=False):
    """The reading keywords a user passes (`prepare_store`, `iter_files`); `read_options` checks them.

    *tokenizer*: a `Tokenizer`, a tokenizer.json path or a ``str -> ids`` callable
    (bytes by default); *eos_id*/*bos_id* around each text document (``"auto"``:
    the tokenizer's own); *per_line*: a text document per non-blank line;
    *partition*: for documents that name none; *column*: the table (or JSONL
    text) column; *bin_separator*/*bin_dtype*: how ``.bin`` files split;
    *max_line_bytes* (64 MiB) / *max_document_bytes* (256 MiB): the most one line
    (a JSONL row, a text line with *per_line*) / one text document (a whole text
    file, a JSONL/Parquet/Arrow/dataset text) may hold, in UTF-8 bytes; a longer one
    is a `DataError` naming the file (and line); lines and whole files are refused
    before they are held.  Loss masks: *prompt_field*/*completion_field* name the
    text fields of prompt/completion rows (the completion's tokens train);
    *chat_template* (a `ChatTemplate`, or a template or tokenizer_config.json file)
    renders rows' ``messages`` (the assistant turns train); token rows may carry
    ``labels`` (-100 = not trained; aligned with the tokens, or shifted by one
    with *labels_shifted*), ``loss_mask`` or ``assistant_masks``; a document whose
    mask trains nothing is refused unless *skip_untrained_documents*.
    *chat_render_seconds* (60) bounds the time one chat's renderings may take.
    """

    tokenizer: TokenizerSpec
    eos_id: SpecialId
    bos_id: SpecialId
    per_line: bool
    partition: Partition | str
    column: str | None
    bin_separator: int | None
    bin_dtype: str
    max_line_bytes: int
    max_document_bytes: int
    prompt_field: str | None
    completion_field: str | None
    chat_template: ChatTemplate | str | os.PathLike[str] | None
    skip_untrained_documents: bool
    labels_shifted: bool
    chat_render_seconds: float


def read_options(**keywords: Unpack[ReadKeywords]) -> ReadOptions:
    """Check the reading keywords once; an explicit *tokenizer* also bounds token inputs by its vocabulary.

    >>> read_options(eos_id=256, per_line=True).tokenizer.vocab_size
    257
    """
    unknown = sorted(set(keywords) - ReadKeywords.__optional_keys__)
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    tokenizer = keywords.get("tokenizer")
    tok = as_tokenizer(tokenizer, eos_id=keywords.get("eos_id", AUTO), bos_id=keywords.get("bos_id", AUTO))
    bin_dtype, bin_separator = keywords.get("bin_dtype", "uint16"), keywords.get("bin_separator")
    if bin_dtype not in ("uint16", "uint32"):
        raise ConfigError(f"bin_dtype={bin_dtype!r} must be 'uint16' or 'uint32'")
    if bin_separator is not None and not (is_integer(bin_separator) and 0 <= bin_separator <= np.iinfo(bin_dtype).max):
        raise ConfigError(f"bin_separator={bin_separator!r} must be a token id that fits {bin_dtype}")
    separator = tok.eos_id if bin_separator is None else int(bin_separator)  # checked against the dtype when a .bin is read
    column = keywords.get("column")
    if column is not None and (not isinstance(column, str) or not column):
        raise ConfigError(f"column={column!r} must be a non-empty column name")
    named = tokenizer is not None
    partition = Partition.parse(keywords.get("partition", Partition.TRAIN))
    per_line = bool(keywords.get("per_line", False))
    limits = {name: byte_limit(keywords.get(name, default), name) for name, default in _LIMITS.items()}
    prompt, completion = keywords.get("prompt_field"), keywords.get("completion_field")
    for field_name, value in (("prompt_field", prompt), ("completion_field", completion)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{field_name}={value!r} must be a non-empty field name")
    if (prompt is None) != (completion is None):
        raise ConfigError(
            f"prompt_field={prompt!r}, completion_field={completion!r}: pass both (prompt/completion rows) or neither"
        )
    template = keywords.get("chat_template")
    chat = template if template is None or isinstance(template, ChatTemplate) else ChatTemplate.from_file(template)
    skip = bool(keywords.get("skip_untrained_documents", False))
    seconds = keywords.get("chat_render_seconds", RENDER_SECONDS)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise ConfigError(f"chat_render_seconds={seconds!r} must be a positive number of seconds")
    vocab = tok.vocab_size if named else None
    return ReadOptions(
        tok, per_line, partition, column, separator, bin_dtype, vocab, named, **limits,
        prompt_field=prompt, completion_field=completion, chat_template=chat, skip_untrained_documents=skip,
        labels_shifted=bool(keywords.get("labels_shifted", False)), chat_render_seconds=float(seconds),
    )  # fmt: skip


_LIMITS = {"max_line_bytes": MAX_LINE_BYTES, "max_document_bytes": MAX_DOCUMENT_BYTES}


def byte_limit(value: object, name: str) -> int:
    """A size limit in bytes: a positive int (what ``max_line_bytes=`` and ``max_document_bytes=`` take)."""
    if not is_integer(value) or operator.index(value) < 1:  # type: ignore[arg-type]
        raise ConfigError(f"{name}={value!r} must be a positive number of bytes")
    return operator.index(value)  # type: ignore[arg-type]


def partition_codes(count: int, partition: Partition) -> npt.NDArray[np.uint8]:
    """*count* documents' partition codes, all *partition*."""
    return np.full(count, partition.code, dtype=np.uint8)


def text_block(texts: Sequence[str], ids: list[str], wheres: list[str], codes: npt.NDArray[np.uint8], opts: ReadOptions) -> Block:
    """Tokenize *texts* (one document each) with bos/eos; ids are checked, and each text's size (`max_document_bytes`)."""
    limit = opts.max_document_bytes
    for k, text in enumerate(texts):  # the UTF-8 size only of texts that may exceed it (at most 4 bytes a character)
        if len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit:
            raise DataError(
                f"{wheres[k]} (document id={ids[k]!r}): a text of more than {limit:,} bytes (the limit for one document); "
                "raise it with --max-document-bytes (max_document_bytes=), or split it"
            )
    tokens, lengths = encode_texts(opts.tokenizer, texts, lambda k: f"{wheres[k]} (document id={ids[k]!r})")
    return Block(tokens, lengths, ids, codes, wheres, tokenized=len(ids))


def flat_block(
    tokens: npt.NDArray[Any],
    lengths: npt.NDArray[Any],
    ids: list[str],
    codes: npt.NDArray[np.uint8],
    wheres: list[str],
    opts: ReadOptions,
    loss_mask: npt.NDArray[np.bool_] | None = None,
) -> Block:
    """Token inputs already flat: check the dtype, the range [0, 2**32) and the declared vocabulary."""
    lengths = np.asarray(lengths, dtype=np.int64)
    block = Block(tokens, lengths, ids, codes, wheres, loss_mask=loss_mask)
    if tokens.dtype.kind not in "ui":
        raise DataError(f"{block.label(0)}: tokens have dtype {tokens.dtype}; token ids must be integers")
    if not (tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4) and tokens.size:
        bad = (tokens < 0) | (tokens >= TOKEN_LIMIT)
        if bad.any():
            at = int(np.argmax(bad))
            ends = np.cumsum(lengths)
            doc = int(np.searchsorted(ends, at, side="right"))
            raise DataError(
                f"{block.label(doc)}: token[{at - int(ends[doc] - lengths[doc])}]={int(tokens[at])} is outside [0, 2**32); "
                "token ids must fit in uint32"
            )
        block = Block(tokens.astype(np.uint32), lengths, ids, codes, wheres, loss_mask=loss_mask)
    check_vocabulary(block.tokens, lengths, block.label, opts.vocab_size, opts.tokenizer.name)
    return block


def documents(blocks: Iterable[Block]) -> Iterator[Document]:
    """Unpack blocks into documents, lazily."""
    for block in blocks:
        yield from block.documents()
