"""What a mixture blends: its parts (all `Windows`, or all packed `Rows`) and its sources' names, checked.

Every part is one source's whole sequence in document (row) order: ``sb.windows(source,
...)`` of each source, all with the same context length, stride and partition, or
``sb.pack(source, context_length=T)`` of each, all with the same ``T``, partition
and pad id.  The mixture orders each source itself, so a view or an already
shuffled part is refused, and so is a part with no item, or windows mixed with rows.
A part built with ``skip_untrained=True`` is whole when it holds every kept item
in document order: the mixture then mixes each source's kept items.  Either
every part is filtered or none is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._checks import short_repr
from ...errors import ConfigError
from ..pack.rows import Rows
from ..protocol import PlannedItems
from ..windows.windows import Windows
from .plan import MAX_SOURCES

__all__ = ["check_names", "check_parts"]

Part = Windows | Rows


def check_parts(parts: Any) -> tuple[Part, ...]:
    """*parts* as a tuple of whole `Windows` (or whole packed `Rows`) in document order sharing one configuration."""
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or hasattr(parts, "gather_batches"):
        raise ConfigError(f"parts={short_repr(parts)} must be a list of sb.windows(...) or of sb.pack(...), one per source")
    found: tuple[Any, ...] = tuple(parts)
    if not 1 <= len(found) <= MAX_SOURCES:
        raise ConfigError(f"parts has {len(found)} entries; a mixture takes 1 to {MAX_SOURCES} sources")
    for s, part in enumerate(found):
        if not isinstance(found[s], PlannedItems):
            raise ConfigError(
                f"parts[{s}]={short_repr(part)} is neither streambatch.Windows nor packed Rows; "
                "pass sb.windows(source, ...) or sb.pack(source, ...)"
            )
        if part.words.kind != found[0].words.kind:
            raise ConfigError(
                f"parts[{s}] is {_kind(part)} but parts[0] is {_kind(found[0])}; a mixture blends items of one kind: "
                "pass sb.windows(...) of every source, or sb.pack(...) of every source"
            )
        _check_whole(s, part)
        if (part.untrained is None) != (found[0].untrained is None):
            raise ConfigError(
                f"parts[{s}] {'keeps every item' if part.untrained is None else 'was built with skip_untrained=True'} "
                f"but parts[0] {'keeps every item' if found[0].untrained is None else 'was'}; build every part with "
                "skip_untrained=True, or none"
            )
        if part.config != found[0].config or part.partition != found[0].partition:
            raise ConfigError(
                f"parts[{s}] has context_length={part.context_length}, stride={part.config.stride}, partition="
                f"{part.partition.value!r} but parts[0] has {found[0].context_length}, {found[0].config.stride}, "
                f"{found[0].partition.value!r}; every source of a mixture needs the same"
            )
        if part.packed and part.space.pad_id != found[0].space.pad_id:
            raise ConfigError(
                f"parts[{s}] pads with pad_id={part.space.pad_id} but parts[0] with {found[0].space.pad_id}; "
                "pack every source with the same pad_id"
            )
    return found


def _kind(part: Any) -> str:
    kind: str = part.words.kind
    return kind


def _check_whole(s: int, part: Part) -> None:
    if not part.is_whole:  # every item (every kept one, under skip_untrained) in document order
        raise ConfigError(
            f"parts[{s}] is a view or already shuffled; the mixture orders each source itself: pass {part.words.call}"
        )
    if not len(part):
        what = part.words.empty
        if part.untrained is not None:
            what = f"{what.split()[0]} with a counted target (skip_untrained dropped all {part.untrained.dropped})"
        raise ConfigError(f"parts[{s}] has no {what}; a source needs one: lower the context length or drop it")


def check_names(names: Any, count: int) -> tuple[str, ...]:
    """*names* (or ``source-0``, ...) as distinct non-empty strings, one per source."""
    if names is None:
        return tuple(f"source-{s}" for s in range(count))
    found = tuple(names) if isinstance(names, Sequence) and not isinstance(names, str) else None
    if found is None or len(found) != count or not all(isinstance(n, str) and n for n in found):
        raise ConfigError(f"names={short_repr(names)} must be {count} non-empty strings, one per source")
    if len(set(found)) != count:
        twice = next(n for n in found if found.count(n) > 1)
        raise ConfigError(f"names has {twice!r} twice; give each source its own name")
    return found
