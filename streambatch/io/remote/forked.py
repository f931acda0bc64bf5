"""Requests of a forked child, made by a process it starts: obstore's runtime does not survive a fork.

A process that read from object storage and then forked (a ``DataLoader`` worker
under Linux's default start method) cannot use obstore in the child: its worker
threads were not copied, so a request would wait forever.  Such a child sends
its requests (HEAD, whole and ranged GETs, PUTs) to one helper process it
starts itself (``python -m streambatch.io.remote.forked``: a fresh interpreter,
its own runtime), over a pipe, and gets the answers, or the very error, back.
The helper ends when the child's end of the pipe closes (the child exited or
was killed).  `streambatch.io.remote.client.ObjectClient` uses it by itself.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import IO, Any

from ...errors import StoreError

_SIZE = struct.Struct("<Q")


def _send(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_SIZE.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    head = stream.read(_SIZE.size)
    if len(head) < _SIZE.size:
        raise EOFError
    size = _SIZE.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class Spawned:
    """One helper process making a client's requests for this (forked) process; calls are serialised."""

    def __init__(self, client: Any) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "streambatch.io.remote.forked"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._in, self._out = self._process.stdin, self._process.stdout
        _send(self._in, client)

    def call(self, method: str, *args: Any) -> Any:
        """``client.method(*args)`` in the helper: its result, or its exception raised here."""
        with self._lock:
            try:
                _send(self._in, (method, args))
                ok, value = _receive(self._out)
            except (EOFError, OSError) as err:
                raise StoreError(f"the request helper of forked process {os.getpid()} stopped ({err or 'no answer'})") from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End the helper (closing its pipe) and wait for it."""
        with contextlib.suppress(OSError):
            self._in.close()
        with contextlib.suppress(Exception):
            self._process.wait(5)


def _serve() -> None:
    """The helper: one client, then requests until the pipe closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the answers' pipe
    try:
        client = _receive(stdin)
    except EOFError:
        return
    while True:
        try:
            method, args = _receive(stdin)
        except EOFError:
            return
        try:
            answer: tuple[bool, Any] = (True, getattr(client, method)(*args))
        except Exception as err:  # sent back as it is (its type and message), raised in the caller
            answer = (False, err)
        _send(stdout, answer)


if __name__ == "__main__":
    _serve()
