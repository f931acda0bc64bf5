"""A time budget for work that runs user code (a chat template): past it, the work is stopped where it is.

`time_budget` arms a per-process watchdog thread that, at the deadline, raises
`OverBudget` in the thread doing the work (between Python bytecodes, so a
template's nested loops stop; one long C call finishes first, which is why the
template's sandbox also bounds what one operation may build).  Arming and
disarming cost a lock each: cheap enough per document.

>>> with time_budget(5.0, "row 0", "rendering the chat template"):
...     total = sum(range(10))
>>> total
45
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ...errors import DataError, OverBudget


def _raise_in(thread: int, error: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None if error is None else ctypes.py_object(error))


class _Watchdog:
    """One daemon thread per process; armed budgets by token: (deadline, thread id)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._pid = -1

    def arm(self, seconds: float) -> int:
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: its parent's thread is gone
                self._pid = os.getpid()
                self._armed.clear()
                self._fired.clear()
                threading.Thread(target=self._run, name="streambatch-budget", daemon=True).start()
            token = self._next
            self._next += 1
            self._armed[token] = (time.monotonic() + seconds, threading.get_ident())
            self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Whether the budget was spent; a stop still pending in this thread is cleared."""
        with self._cond:
            self._armed.pop(token, None)
            if token not in self._fired:
                return False
            self._fired.discard(token)
            _raise_in(threading.get_ident(), None)
            return True

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for token in [t for t, (deadline, _) in self._armed.items() if deadline <= now]:
                    _, thread = self._armed.pop(token)
                    self._fired.add(token)
                    _raise_in(thread, OverBudget)
                wait = min((deadline for deadline, _ in self._armed.values()), default=None)
                self._cond.wait(None if wait is None else max(0.0, wait - now))


_WATCHDOG = _Watchdog()


@contextmanager
def time_budget(seconds: float, where: str, what: str) -> Iterator[None]:
    """Run the body within *seconds*; past them, a `DataError` naming *where* (and *what* took too long)."""
    spent = False
    token = _WATCHDOG.arm(seconds)
    try:
        try:
            yield
        finally:
            spent = _WATCHDOG.disarm(token)
    except OverBudget:
        spent = True
    if spent:
        raise DataError(
            f"{where}: {what} took more than {seconds:g} s (the limit for one document); fix the template or the "
            "document, or raise it with --chat-render-seconds (chat_render_seconds=)"
        )
