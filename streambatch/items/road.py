"""The one road from items to batches, for every kind: held and fetched first, then the kind's fast loop.

Every item kind has one batch loop (its ``_batches(batch_size, batches)``: block
positions, the next batch's rows handed to the kernel as a hint), and reaches it
through `fetched` only: ``gather_batches`` is `fetched` over that loop, and
``gather(i)`` is its one-batch case (`gather_one`), so `sb.materialize` of
`Chunks` or of any list of chunks, ``chunk.gather()``, ``items.gather(i)``,
``Epoch[i]``, `Run`, the torch datasets and the tools all take the same road.

Over a store in object storage `fetched` serves each batch through a prefetching
`streambatch.io.remote.prefetch.Reader`: the batch's token spans are held and
fetched before the loop gathers it, and those of the batches after it are on
their way.  The remote tokens are unreadable outside held ranges
(`streambatch.io.remote.tokens`), so a loop that ran ahead of its fetch could
not read zeros.  A road that walks many batches (an iteration, a DataLoader
worker's strided share, a run after a resume) names its step, and the reader
starts the batches ahead at once.  A `streambatch.Batches` keeps one reader
across its calls (indexing learns the step from two requests) and passes it in.
A closed store (``store.close()``) refuses every road with a `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from ..batch.minibatch import MiniBatch
from ..errors import ConfigError
from ..io.remote.prefetch import Reader, Span, remote_files

Loop = Callable[[range], Iterator[MiniBatch]]


class BatchReader(Protocol):
    """What serves batches once their token ranges are in memory: a `Reader`, or one renumbering for it."""

    def get(self, index: int, gather: Callable[[], MiniBatch], along: int | None = None) -> MiniBatch: ...

    @property
    def complete(self) -> bool:
        """Every byte the batches read is here, checked and held for good: nothing is left to fetch."""
        ...


def fetched(items: Any, batch_size: int, batches: range, loop: Loop, reader: BatchReader | None = None) -> Iterator[MiniBatch]:
    """Batches *batches* of *items* chunked by *batch_size*, made by the kind's *loop*, each only once its token
    ranges are held and fetched (a remote store's; local stores go straight to *loop*).

    *reader* numbers batches as *batches* does; without one a reader is made for this call (it fetches nothing
    past ``batches.stop`` and is closed when the iteration ends or is dropped).
    """
    check_open(items)
    if reader is None:
        own = batch_reader(items, batch_size, batches.stop)
        if own is None:
            return loop(batches)
        return _through(own, loop(batches), batches, own)
    return _through(reader, loop(batches), batches, None)


def _through(reader: BatchReader, made: Iterator[MiniBatch], batches: range, own: Reader | None) -> Iterator[MiniBatch]:
    along = batches.step if len(batches) > 1 else None  # a walk names its step; one batch does not
    try:
        for index in batches:
            if reader.complete:  # every byte here for good (a small store, fetched whole): the kind's own loop
                yield from made
                return
            yield reader.get(index, made.__next__, along=along)
    finally:
        if own is not None:
            own.close()


def batch_reader(items: Any, batch_size: int, count: int) -> Reader | None:
    """A prefetching `Reader` of batches ``0 .. count - 1`` of *items* chunked by *batch_size* (None: no store of
    *items* is remote)."""
    files = [f for store in items.stores for f in remote_files(store)]
    if not files:
        return None
    return Reader(lambda wanted: batch_spans(items, batch_size, wanted), count, files)


def batch_spans(items: Any, batch_size: int, batches: Sequence[int]) -> list[Span]:
    """The token spans of batches *batches* of *items* chunked by *batch_size*: consecutive batches are one view
    (one vectorized look-up), others are asked one by one."""
    total = len(items)
    if len(batches) > 1 and batches[-1] - batches[0] == len(batches) - 1:
        view = items.view(batches[0] * batch_size, min((batches[-1] + 1) * batch_size, total))
        return view.token_spans()  # type: ignore[no-any-return]
    return [s for b in batches for s in items.view(b * batch_size, min((b + 1) * batch_size, total)).token_spans()]


def gather_one(items: Any, index: int, reader: BatchReader | None = None) -> MiniBatch:
    """*items* (a view) as one batch numbered *index*: the one-batch case of its ``gather_batches``."""
    batch: MiniBatch = next(items.gather_batches(max(len(items), 1), range(1), reader=reader))
    batch.index = index
    return batch


def check_open(items: Any) -> None:
    """Refuse (`ConfigError`) items whose store was closed."""
    for store in items.stores:
        if store.closed:
            raise ConfigError(f"{store!r} was closed; open it again (sb.open_store, sb.open_corpus) to read its batches")


class Renumbered:
    """A reader seen through another numbering: batch *b* here is batch ``to(b)`` of *reader*, steps divided by
    *scale* (a `streambatch.Batches`' reader numbers its chunks, the kinds number their batches)."""

    __slots__ = ("reader", "scale", "to")

    def __init__(self, reader: BatchReader, to: Callable[[int], int], scale: int = 1) -> None:
        self.reader, self.to, self.scale = reader, to, scale

    @property
    def complete(self) -> bool:
        """The reader's (nothing left to fetch)."""
        return self.reader.complete

    def get(self, index: int, gather: Callable[[], MiniBatch], along: int | None = None) -> MiniBatch:
        """Batch *index* (this numbering) from the reader."""
        return self.reader.get(self.to(index), gather, None if along is None else max(1, along // self.scale))
