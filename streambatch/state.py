"""The one state codec: every checkpoint streambatch writes or reads, and the one position check.

A state is a small JSON-serializable dict ``{"format": "streambatch.state",
"version": 2, "kind": K, ...}``.  Four kinds share the format, the version and
the refusals:

- ``run``: a run's position (``epoch``, ``batch`` consumed in it) plus what the
  order depends on (``seed``, ``context_length``, ``stride``, ``batch_size``,
  ``partition``, corpus ``fingerprint``, and ``mode``: ``"pack"`` for packed
  rows, absent (``"window"``) for the chapter's windows; ``items``: the items consumed since the run's start, written only
  under a batch-size schedule; ``skip_untrained``:
  true for a run that drops items with no counted target, else absent):
  `streambatch.Run.state_dict`;
- ``worker``: a DataLoader worker's place in a run (``run``, ``stop``,
  ``worker``, ``last``): `streambatch.torch.RunDataset` / ``EpochDataset``;
- ``batches``: a worker's place in any sized source of batches:
  `streambatch.torch.BatchesDataset`;
- ``epoch-command``: the ``streambatch epoch --save-state`` file (``run``, the
  ``epoch`` it writes, and the ``output`` it has written so far).

`decode` refuses, with a `StateError` that names the problem: anything but a
dict, another format, version or kind, a missing or unknown key, a value of the
wrong type or out of range.  Version 1 run states (``"format":
"streambatch.run"``) are still read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from ._checks import is_integer, short_repr
from .errors import OutOfRangeError, StateError

FORMAT = "streambatch.state"
VERSION = 2
_LEGACY_RUN = ("streambatch.run", 1)

Count = Annotated[int, msgspec.Meta(ge=0, lt=1 << 48)]
Size = Annotated[int, msgspec.Meta(ge=1, lt=1 << 48)]


class _State(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    format: str
    version: int
    kind: str


class _Run(_State):
    kind: Literal["run"]
    seed: int | None  # in [0, 2**64): checked by decode
    epoch: Count
    batch: Count
    context_length: Size
    stride: Size
    batch_size: Size | str  # a batch-size schedule's text ("0:2 64:4"): streambatch.stages.schedule
    partition: str
    fingerprint: str
    mode: Literal["window", "pack"] = "window"  # written only by packed runs: window states are unchanged
    skip_untrained: bool = False  # written only by runs of skip_untrained: other states are unchanged
    contract: str = ""  # written only for stores that record a data contract (`streambatch.model.contract`)
    items: Count | None = None  # written only under a batch-size schedule: the items consumed since the run's start


class _Worker(_State):
    kind: Literal["worker"]
    run: dict[str, Any]
    stop: tuple[Count, Count] | None
    worker: tuple[Count, Size]
    last: tuple[Count, Count] | None


class _Batches(_State):
    kind: Literal["batches"]
    length: Count
    start: Count
    worker: tuple[Count, Size]
    last: Count | None
    begin: Count | None = None  # written only after an elastic resume: the iteration began there, not at start


class _Output(msgspec.Struct, forbid_unknown_fields=True):
    path: str
    bytes: Count
    batches: Count
    first: Count
    digest: str
    format: Literal["jsonl", "arrow"] = "jsonl"


class _Command(_State):
    kind: Literal["epoch-command"]
    epoch: Count
    run: dict[str, Any]
    output: _Output


_KINDS: dict[str, type[_State]] = {"run": _Run, "worker": _Worker, "batches": _Batches, "epoch-command": _Command}
RUN_KEYS = tuple(k for k in _Run.__struct_fields__ if k not in ("mode", "skip_untrained", "contract", "items"))
"""The keys of a window run's state, in order (a packed run's adds ``mode``, one of ``skip_untrained`` that)."""


def encode(kind: str, **fields: Any) -> dict[str, Any]:
    """A state of *kind* holding *fields*, checked as `decode` would check it.

    >>> encode("batches", length=3, start=0, worker=[0, 1], last=None)["kind"]
    'batches'
    """
    state = {"format": FORMAT, "version": VERSION, "kind": kind, **fields}
    decode(state, kind)
    return state


def decode(state: Any, kind: str, where: str = "state") -> dict[str, Any]:
    """*state* as a plain dict after every refusal of the codec; *where* names it in messages.

    >>> decode({"format": "streambatch.state", "version": 2, "kind": "batches"}, "batches")
    Traceback (most recent call last):
    ...
    streambatch.errors.StateError: state: Object missing required field `length`; pass a state_dict() unchanged
    """
    if not isinstance(state, Mapping):
        raise StateError(f"{where}={short_repr(state)} is not a dict; pass what state_dict() returned (e.g. json.load of it)")
    form, version = state.get("format"), state.get("version")
    if kind == "run" and (form, version) == _LEGACY_RUN:
        state = {**state, "format": FORMAT, "version": VERSION, "kind": "run"}
        form, version = FORMAT, VERSION
    if form != FORMAT:
        raise StateError(f"{where} format={short_repr(form)} is not {FORMAT!r}; pass a state streambatch wrote")
    if not is_integer(version) or version != VERSION:
        raise StateError(
            f"{where} version={short_repr(version)} but this streambatch reads version {VERSION}; "
            "resume with the streambatch that wrote it"
        )
    if state.get("kind") != kind:
        raise StateError(f"{where} kind={short_repr(state.get('kind'))} is not {kind!r}; pass the {kind} state saved for this")
    try:
        msgspec.convert(dict(state), type=_KINDS[kind], strict=True)
    except (msgspec.ValidationError, OverflowError, TypeError) as err:
        raise StateError(f"{where}: {err}; pass a state_dict() unchanged") from None
    seed = state.get("seed")
    if kind == "run" and seed is not None and not 0 <= seed < 1 << 64:
        raise StateError(f"{where} seed={short_repr(seed)} must be an int in [0, 2**64) or None; pass a state_dict() unchanged")
    if kind == "run":
        return {"mode": "window", "skip_untrained": False, **state}
    return dict(state)


def check_same(state: Mapping[str, Any], ours: Mapping[str, Any], where: str = "state") -> None:
    """Refuse a *state* whose fields differ from *ours* (what this run's order depends on), naming each.

    >>> check_same({"seed": 7, "stride": 1}, {"seed": 8, "stride": 1})
    Traceback (most recent call last):
    ...
    streambatch.errors.StateError: state seed=7 but this run has seed=8; resume with the corpus, partition, ...
    """
    mismatches = [
        f"{where} {key}={state[key]!r} but this run has {key}={value!r}" for key, value in ours.items() if state[key] != value
    ]
    if mismatches:
        mixed = str(state.get("fingerprint", "")).startswith("mixture:") and state.get("fingerprint") != ours.get("fingerprint")
        why = " (the mixture changed: a weight, a source, a source's content or the length)" if mixed else ""
        raise StateError(
            "; ".join(mismatches) + f"{why}; resume with the corpus, partition, configuration and seed the state was saved with"
        )


def check_position(epoch: Any, batch: Any, batches_per_epoch: int, *, where: str = "", error: type[Exception]) -> tuple[int, int]:
    """The one position check: ``(epoch, batch)`` with ``0 <= batch <= batches_per_epoch`` (that epoch's: under
    a batch-size schedule epochs may differ, `streambatch.Run.check_position`), normalised.

    ``batch == batches_per_epoch`` (an epoch consumed) becomes ``(epoch + 1, 0)``.

    >>> check_position(2, 3, 3, error=ValueError)
    (3, 0)
    """
    if not is_integer(epoch) or not 0 <= int(epoch) < 1 << 48:
        raise error(f"{where}epoch={short_repr(epoch)} must be a non-negative int; pass the epoch number (0 for the first)")
    if not is_integer(batch) or not 0 <= int(batch) <= batches_per_epoch:
        raise error(
            f"{where}batch={short_repr(batch)} must be an int in [0, {batches_per_epoch}] (the epoch's batches); "
            "pass the number of batches already consumed in that epoch"
        )
    if batches_per_epoch and int(batch) == batches_per_epoch:
        return int(epoch) + 1, 0
    return int(epoch), int(batch)


def check_index(index: Any, count: int, what: str = "batch index") -> int:
    """*index* as an int in ``[0, count)``, else `streambatch.OutOfRangeError`.

    >>> check_index(1, 2)
    1
    """
    if not is_integer(index):
        raise OutOfRangeError(f"{what}={short_repr(index)} is not an int; pass 0 <= index < {count}")
    if not 0 <= int(index) < count:
        raise OutOfRangeError(f"{what}={short_repr(index)} is out of range for {count}; use 0 <= index < {count}")
    return int(index)
