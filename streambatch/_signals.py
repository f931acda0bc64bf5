"""The one signal helper: SIGTERM stops a command the way Ctrl-C does, and both wait while a worker starts.

Every cleanup in streambatch (atomic writers removing their temporaries, a
worker pool stopping its processes, a store writer removing its partial folder)
runs on `KeyboardInterrupt`.  `terminate_as_interrupt` makes SIGTERM raise
`streambatch.errors.Terminated`, a `KeyboardInterrupt`, so ``kill PID`` cleans
up exactly as Ctrl-C does; the command line then exits 143 (128 + 15) with one
line.  `stops_deferred` holds both signals back over a short block (a worker
being spawned), and delivers them at its end.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from .errors import Terminated

STOPS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread during the block (once: a second one waits for the cleanup).

    Outside the main thread, or where a handler was set outside Python, nothing changes.
    """
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield
        return
    raised: list[int] = []

    def stop(number: int, frame: FrameType | None) -> None:
        if not raised:
            raised.append(number)
            raise Terminated(f"signal {number}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM during the block take effect at its end (not lost, not halfway through starting a worker).

    Both are also blocked in this thread meanwhile, so a process spawned in the
    block starts with them blocked: a Ctrl-C never interrupts a worker while it
    imports (its initializer then ignores SIGINT for good, and unblocks SIGTERM:
    the pool stops its workers with it).
    """
    if not _main_thread() or not hasattr(signal, "pthread_sigmask") or any(signal.getsignal(s) is None for s in STOPS):
        yield
        return
    caught: list[int] = []
    handlers = {s: signal.signal(s, lambda number, frame: caught.append(number)) for s in STOPS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOPS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in handlers.items():
            signal.signal(number, handler)
    for caught_number in dict.fromkeys(caught):
        signal.raise_signal(caught_number)
