"""A dataset's next position in shared memory: what the main process sets reaches its DataLoader workers."""

from __future__ import annotations

from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any


class SharedPosition:
    """``(epoch, batch, pending)`` in shared memory, made once by a dataset's constructor.

    DataLoader workers get this very memory (inherited when forked, passed as a file
    descriptor while a worker is spawned), so what the main process sets reaches
    persistent workers at their next iteration.  Pickled any other way (a deep
    copy, say) it becomes a private snapshot.
    """

    __slots__ = ("_values",)

    def __init__(self, epoch: int, batch: int, pending: bool) -> None:
        self._values = RawArray("q", [epoch, batch, int(pending)])

    def get(self) -> tuple[int, int, bool]:
        epoch, batch, pending = self._values
        return int(epoch), int(batch), bool(pending)

    def set(self, epoch: int, batch: int, pending: bool) -> None:
        self._values[0], self._values[1], self._values[2] = epoch, batch, int(pending)

    def clear_pending(self) -> None:
        self._values[2] = 0

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:  # starting a worker process: share the memory itself
            return {"shared": self._values}
        return {"snapshot": list(self._values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._values = state["shared"] if "shared" in state else RawArray("q", state["snapshot"])
