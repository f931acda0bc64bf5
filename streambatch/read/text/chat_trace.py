"""The prefix rule in linear time: one traced rendering of a whole chat tells what rendering each prefix of it gives.

The chat is handed to the template as `Turns`, a read-only list that records
every look the template takes at it (a turn fetched by a loop, an index, the
length, a slice) with how much text had been written then.  Rendering is
deterministic, so rendering ``messages[:k]`` runs exactly like rendering the
whole chat up to the first look whose answer differs for the prefix: reading
turn ``k`` or later, the length, a negative index, the last turn, the turn after
the current one (``loop.last``, ``loop.nextitem``).  `Trace.prefix` derives the
prefix's text only when that first look is the ``{% for %}`` loop fetching turn
``k`` right after turn ``k - 1`` (so for the prefix the loop simply ends there),
and what the template does after the loop ends looks at nothing that differs
for the prefix: no turn from ``k`` on, and no ``namespace()`` attribute that the
skipped turns wrote.  Then the prefix's text is the whole chat's text up to that
fetch followed by the text written after the loop.  Any other prefix is
rendered on its own (`None`); any look the list cannot follow raises
`Untraceable` and the caller renders every prefix.

A template is followed only when `followable` holds: its loops write their text
as they go (none inside a ``{% filter %}`` or ``{% set %}...{% endset %}``
block), ``loop`` is only read (``loop.index``, ``loop.last``, ...), and it uses
no stateful or random helper (``cycler``, ``joiner``, ``lipsum``, ``random``,
``pprint``).
"""

from __future__ import annotations

import dis
import sys
from bisect import bisect_right
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from typing import Any

from ...errors import Untraceable

_FOR_ITER = dis.opmap["FOR_ITER"]
_UNSEEN = -1  # a look whose answer is the same for every prefix
TRACE: ContextVar[Trace | None] = ContextVar("streambatch_chat_trace", default=None)


@dataclass(frozen=True, slots=True)
class Text:
    """``base[:cut] + tail``: a prefix's text, sharing the whole chat's rendering (no copy)."""

    base: str
    cut: int
    tail: str = ""

    @classmethod
    def of(cls, text: str) -> Text:
        return cls(text, len(text))

    def __len__(self) -> int:
        return self.cut + len(self.tail)

    def window(self, start: int, stop: int) -> str:
        """``str(self)[start:stop]`` for ``0 <= start``, without building the rest."""
        stop = min(stop, len(self))
        if start >= stop:
            return ""
        if stop <= self.cut:
            return self.base[start:stop]
        if start >= self.cut:
            return self.tail[start - self.cut : stop - self.cut]
        return self.base[start : self.cut] + self.tail[: stop - self.cut]

    def first_difference(self, other: Text) -> int:
        """The first position where the two texts differ, or the shorter one's length."""
        end = min(len(self), len(other))
        at = min(self.cut, other.cut, end) if self.base is other.base else 0  # known equal
        step = 64
        while at < end:
            stop = min(end, at + step)
            mine, theirs = self.window(at, stop), other.window(at, stop)
            if mine != theirs:
                return at + next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
            at, step = stop, 2 * step
        return end


class Trace:
    """The looks one rendering of the whole chat took at it, in order: for each, the largest prefix length ``t`` for
    which its answer differs (a prefix of ``k`` turns sees the same answer iff ``k > t``) and the text written then."""

    def __init__(self, turns: list[Any], root: Any, tracker: Any) -> None:
        self.turns = turns
        self.root = root  # the template's top-level code: its loops are the ones followed
        self.tracker = tracker  # the rendering's output count (`_Tracker.done`)
        self.differs: list[int] = []
        self.written: list[int] = []
        self.site: list[int] = []  # a fetch by a top-level loop: which loop statement, else -1
        self.after: list[int] = []  # a fetch: the site of its iterator's fetch before it (-2: none)
        self.iterator: list[int] = []  # a fetch: which iterator (-1: not a fetch)
        self.ended: dict[int, int] = {}  # iterator -> the look where it first ran out
        self.sites: dict[tuple[bool, int], int] = {}
        self.iterators = 0
        self.reads: list[int] = []  # namespace reads and writes: the number of looks before them
        self.writes: list[int] = []
        self.text = ""

    def look(self, differs: int) -> None:
        self._add(differs, -1, -2, -1)

    def fetch(self, iterator: TurnsIterator, caller: Any) -> None:
        """*iterator* is asked for its next turn by *caller* (a frame); it ran out when past the chat."""
        site = self._site(caller)
        position = iterator.position
        if position < len(self.turns):
            self._add(position, site, iterator.last_site, iterator.number)
        else:
            self.ended.setdefault(iterator.number, len(self.differs))
            self._add(_UNSEEN, site, iterator.last_site, iterator.number)
        iterator.last_site = site

    def _add(self, differs: int, site: int, after: int, iterator: int) -> None:
        self.differs.append(differs)
        self.written.append(self.tracker.done)
        self.site.append(site)
        self.after.append(after)
        self.iterator.append(iterator)

    def _site(self, frame: Any) -> int:
        """Which top-level ``{% for %}`` statement is fetching (-1: something else, e.g. a filter or ``loop.last``)."""
        code = frame.f_code
        if code is not self.root:
            if code is not _loop_next() or frame.f_back is None or frame.f_back.f_code is not self.root:
                return -1
            frame = frame.f_back
        if frame.f_code.co_code[frame.f_lasti] != _FOR_ITER:
            return -1
        return self.sites.setdefault((code is self.root, frame.f_lasti), len(self.sites))

    def prefix(self, length: int, first: list[int], later: list[int]) -> Text | None:
        """The text rendering the first *length* turns gives, when this trace proves it; else None.

        *first* and *later* come from `firsts` and `maxima` (computed once per trace)."""
        at = first[length] if length < len(first) else -1
        if at < 0:  # no look differs: the same text
            return Text.of(self.text)
        site, number = self.site[at], self.iterator[at]
        end = self.ended.get(number, -1)
        if site < 0 or self.after[at] != site or end < 0 or self.site[end] != site or later[end + 1] >= length:
            return None
        if self.reads and self.reads[-1] > end and bisect_right(self.writes, end) > bisect_right(self.writes, at):
            return None  # after the loop the template reads a namespace that the skipped turns wrote
        return Text(self.text, self.written[at], self.text[self.written[end] :])

    def firsts(self) -> list[int]:
        """For each prefix length ``k < len(turns)``, the first look whose answer differs for it (-1: none)."""
        first = [-1] * len(self.turns)
        top = -1
        for at, differs in enumerate(self.differs):
            if differs > top:
                first[top + 1 : differs + 1] = [at] * (differs - top)
                top = differs
        return first

    def maxima(self) -> list[int]:
        """``maxima()[i]``: the largest ``differs`` from look ``i`` on (-1 past the last)."""
        later = [-1] * (len(self.differs) + 1)
        for at in range(len(self.differs) - 1, -1, -1):
            later[at] = max(later[at + 1], self.differs[at])
        return later


class Turns:
    """A chat as the template sees it: a read-only list from turn *start* on that reports each look to its `Trace`.

    Everything a list answers is answered the same; what it cannot follow raises `Untraceable`."""

    __slots__ = ("_sb_start", "_sb_trace")

    def __init__(self, trace: Trace, start: int) -> None:
        self._sb_trace = trace
        self._sb_start = start

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):  # the sandbox keeps templates from these (as from a list's)
            return object.__getattribute__(self, name)
        raise Untraceable(name)  # a list's methods (.index, .count, ...): not followed

    def _all(self) -> list[Any]:
        """The whole view, looked at as a whole (the same only for the whole chat)."""
        trace = self._sb_trace
        trace.look(len(trace.turns) - 1)
        return trace.turns[self._sb_start :]

    def __len__(self) -> int:
        return len(self._all())

    def __bool__(self) -> bool:
        trace, start = self._sb_trace, self._sb_start
        trace.look(start if start < len(trace.turns) else _UNSEEN)
        return start < len(trace.turns)

    def __getitem__(self, key: Any) -> Any:
        trace, start = self._sb_trace, self._sb_start
        count = len(trace.turns)
        if isinstance(key, int):
            if key < 0:
                return self._all()[key]
            trace.look(start + key if start + key < count else _UNSEEN)
            return trace.turns[start + key]  # past the end: IndexError, as the list's
        if not isinstance(key, slice):
            raise Untraceable(repr(key))
        low, high, step = key.start, key.stop, key.step
        forward = step in (None, 1) and all(v is None or (isinstance(v, int) and v >= 0) for v in (low, high))
        if not forward:
            return self._all()[key]
        low = start + (low or 0)
        if high is None:
            return Turns(trace, low)
        high = min(start + high, count)
        trace.look(high - 1 if low < high else _UNSEEN)
        return trace.turns[low:high]

    def __iter__(self) -> TurnsIterator:
        return TurnsIterator(self._sb_trace, self._sb_start)

    def __reversed__(self) -> Iterator[Any]:
        return iter(reversed(self._all()))

    def __contains__(self, item: Any) -> bool:
        return item in self._all()

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, Turns) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # a list is unhashable

    def __repr__(self) -> str:
        return repr(self._all())

    def _refuse(self, *_: Any) -> Any:
        raise Untraceable("an operator")

    __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = __mul__ = __rmul__ = _refuse


class TurnsIterator:
    """An iterator over `Turns` that reports each fetch, and who fetched (a loop statement, a filter)."""

    __slots__ = ("last_site", "number", "position", "trace")

    def __init__(self, trace: Trace, start: int) -> None:
        self.trace = trace
        self.position = start
        self.number = trace.iterators
        trace.iterators += 1
        self.last_site = -2

    def __iter__(self) -> TurnsIterator:
        return self

    def __next__(self) -> Any:
        trace = self.trace
        trace.fetch(self, sys._getframe(1))
        if self.position >= len(trace.turns):
            raise StopIteration
        self.position += 1
        return trace.turns[self.position - 1]


def whole(value: Any) -> Any:
    """For ``tojson``: `Turns` as the list it stands for (looked at as a whole)."""
    if isinstance(value, Turns):
        return value._all()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@cache
def _loop_next() -> Any:
    from jinja2.runtime import LoopContext

    return LoopContext.__next__.__code__


@cache
def namespace_class() -> type:
    """jinja2's ``namespace``, reporting reads and writes to the `Trace` being taken (if any)."""
    from jinja2.utils import Namespace

    class TracedNamespace(Namespace):
        def __getattribute__(self, name: str) -> Any:
            if name not in {"_Namespace__attrs", "__class__"}:
                _note("reads")
            return super().__getattribute__(name)

        def __setitem__(self, name: str, value: Any) -> None:
            _note("writes")
            super().__setitem__(name, value)

        def __repr__(self) -> str:
            _note("reads")
            return super().__repr__()

    return TracedNamespace


def _note(kind: str) -> None:
    trace = TRACE.get()
    if trace is not None:
        getattr(trace, kind).append(len(trace.differs))


def followable(ast: Any) -> bool:
    """Whether a parsed template is one `Trace` follows (module docstring)."""
    from jinja2 import nodes

    if any(n.name in {"cycler", "joiner", "lipsum"} for n in ast.find_all(nodes.Name)):
        return False
    if any(f.name in {"random", "pprint"} for f in ast.find_all(nodes.Filter)):
        return False
    if any(any(True for _ in block.find_all(nodes.For)) for block in ast.find_all((nodes.FilterBlock, nodes.AssignBlock))):
        return False
    for parent in (ast, *ast.find_all(nodes.Node)):
        for child in parent.iter_child_nodes():
            if isinstance(child, nodes.Name) and child.name == "loop" and child.ctx == "load":
                read = isinstance(parent, (nodes.Getattr, nodes.Getitem, nodes.Call)) and parent.node is child
                if not read:
                    return False
    return True
