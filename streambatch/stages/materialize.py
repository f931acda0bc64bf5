"""Stage 5, materialize: gather each chunk's rows straight into its final arrays.

The only place token buffers are created: one vectorized gather per buffer from
a read-only view of the flat tokens as overlapping ``T``-token records, giving
C-contiguous ``inputs[w, T]`` and ``targets[w, T]`` in the store's dtype.  No
per-window staging copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from ..batch.minibatch import MiniBatch
from ..errors import ConfigError, OutOfRangeError
from ..io.remote.prefetch import Reader, remote_files
from ..items.protocol import Items
from ..items.road import BatchReader, Renumbered, gather_one
from .chunk import Chunks


def materialize_one(chunk: Items, index: int | None = None, reader: BatchReader | None = None) -> MiniBatch:
    """Gather one chunk of items into a `MiniBatch` (*index* defaults to the chunk's batch index): its kind's one
    road (`streambatch.items.road`), fetched first from a remote store (*reader*: a `Batches`' own, numbering
    this chunk 0).

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
    >>> materialize_one(w[1:3]).inputs.tolist()
    [[10, 11], [11, 12]]
    """
    gather = getattr(chunk, "gather", None)
    if gather is None or not callable(gather):
        raise ConfigError(f"chunk={chunk!r} is not a streambatch.Windows; chunk windows with sb.chunk(windows, batch_size)")
    number = (chunk.batch_index or 0) if index is None else index
    batch: MiniBatch = gather(number) if reader is None else gather_one(chunk, number, reader)
    shared = getattr(chunk, "global_count", None)  # a rank's share: the whole batch's count, from the plan
    if shared is not None:
        batch.global_token_count = shared
    return batch


class Batches(Sequence[MiniBatch]):
    """A lazy, sized, indexable sequence of batches: ``materialize`` over `Chunks`.

    Nothing is gathered until a batch is asked for; ``batches[i]`` gathers batch
    *i* alone, so resumed runs index straight into it, and `road` walks a range
    of them (what `Run` and the torch datasets take: a DataLoader worker's
    strided share).  Every way in is the item kind's one road
    (`streambatch.items.road`); over a remote store one prefetching reader,
    kept across calls, fetches each batch's token ranges first and the next
    ones ahead.
    """

    __slots__ = ("_reader", "chunks")

    def __init__(self, chunks: Chunks[Any]) -> None:
        self.chunks = chunks
        self._reader: Any = None  # a remote store's prefetching reader (made at the first batch), False: all local

    def __len__(self) -> int:
        return len(self.chunks)

    @overload
    def __getitem__(self, item: int) -> MiniBatch: ...
    @overload
    def __getitem__(self, item: slice) -> Batches: ...
    def __getitem__(self, item: int | slice) -> MiniBatch | Batches:
        if isinstance(item, slice):
            return Batches(self.chunks[item])
        self.chunks[item]  # the index checks and their messages (OutOfRangeError)
        index = int(item) + len(self) if int(item) < 0 else int(item)
        return next(self.road(range(index, index + 1)))

    def __iter__(self) -> Iterator[MiniBatch]:
        return self.road(range(len(self)))

    def road(self, steps: range) -> Iterator[MiniBatch]:
        """Batches *steps* (increasing indexes into this sequence; a worker's share is strided), through the kind's
        one batch loop with block positions and the next batch's hint, each fetched first from a remote store."""
        if steps.step < 1 or (len(steps) and not 0 <= steps[0] <= steps[-1] < len(self)):
            raise OutOfRangeError(f"steps={steps!r} are not increasing batch indexes in [0, {len(self)})")
        chunks = self.chunks
        if self._reader is None:
            self._reader = remote_reader(chunks)
        reader = self._reader or None
        if not chunks.split and not chunks.uniform and reader is None and steps.step == 1:
            return self._phases(steps)  # a schedule's, local: each phase's run of equal widths on the kind's loop
        if chunks.split or not chunks.uniform:  # a share's rows of every batch, or a schedule's: batch by batch
            return self._ranked(steps, reader)
        numbers = chunks.batches
        via = None if reader is None else Renumbered(reader, numbers.index, numbers.step)
        return chunks.items.gather_batches(chunks.batch_size, numbers[steps.start : steps.stop : steps.step], reader=via)  # type: ignore[no-any-return]

    def _phases(self, steps: range) -> Iterator[MiniBatch]:
        chunks = self.chunks
        numbers = chunks.batches[steps.start : steps.stop]
        if numbers.step != 1:  # a strided slice of the chunks: batch by batch
            yield from self._ranked(steps, None)
            return
        items = chunks.items
        for start, first, size, part in chunks.batch_size.phases_of(numbers, len(items)):  # type: ignore[union-attr]
            local = range(part.start - start, part.stop - start)
            for batch in items.view(first, len(items)).gather_batches(size, local):
                batch.index += start  # the phase's batch numbers: the epoch's
                yield batch

    def _ranked(self, steps: range, reader: Any) -> Iterator[MiniBatch]:
        for j in steps:
            via = None if reader is None else Renumbered(reader, lambda _: j)  # noqa: B023 - used at once
            yield materialize_one(self.chunks[j], reader=via)

    def __repr__(self) -> str:
        return f"Batches({self.chunks!r})"


def remote_reader(chunks: Chunks[Any]) -> Any:
    """A prefetching `streambatch.io.remote.prefetch.Reader` when *chunks* read a remote store, else False."""
    items = chunks.items
    sources = getattr(items, "stores", ())  # the item kinds' own: a mixture's, one per source
    files = [f for source in sources for f in remote_files(source)]
    if not files:
        return False
    return Reader(lambda batches: token_spans(chunks, batches), len(chunks), files)


def token_spans(chunks: Chunks[Any], batches: Sequence[int]) -> list[Any]:
    """The token spans of batches *batches* (indexes into *chunks*): consecutive batches of one rank are one
    view of the items (one vectorized look-up), others are asked one by one."""
    order = chunks.batches
    if len(batches) > 1 and not chunks.split and order.step == 1 and batches[-1] - batches[0] == len(batches) - 1:
        first, last = chunks.span(order[batches[0]])[0], chunks.span(order[batches[-1]])[1]
        return chunks.items.view(first, last).token_spans()  # type: ignore[no-any-return]
    return [span for j in batches for span in chunks[j].token_spans()]


@overload
def materialize(chunks: Chunks[Any]) -> Batches: ...
@overload
def materialize(chunks: Iterable[Items]) -> Iterator[MiniBatch]: ...
def materialize(chunks: Iterable[Items]) -> Batches | Iterator[MiniBatch]:
    """Gather each chunk into a `MiniBatch`, lazily: the only token copy of the pipeline.

    Over `Chunks` the result is a lazy `Batches` sequence (``len``, indexing);
    over any other iterable of `Windows` it is an iterator.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
    >>> [b.shape for b in sb.materialize(sb.chunk(w, 2))]
    [(2, 2), (1, 2)]
    """
    if isinstance(chunks, Chunks):
        return Batches(chunks)
    if not isinstance(chunks, Iterable):
        raise ConfigError(f"chunks={chunks!r} is not an iterable of Windows; pass sb.chunk(windows, batch_size)")
    return map(materialize_one, chunks)
