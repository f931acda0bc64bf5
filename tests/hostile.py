"""Shared inputs and helpers of the hostile-input, crash and output tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import streambatch as sb
from streambatch.io.store import write_store

REPO = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b"9" * 5_000
GOOD = b'{"id": "a", "partition": "train", "tokens": [1, 2, 3, 4, 5]}\n'
EPOCH = ["-T", "2", "-B", "2", "--seed", "1"]


SMALL = (sb.Document("a", "train", range(10)), sb.Document("b", "test", range(5)))


def small_store(path: Path) -> sb.DocumentStore:
    """Write the two documents of `SMALL` to *path*."""
    return write_store(path, SMALL)


def temporaries(parent: Path, name: str) -> list[Path]:
    return sorted(parent.glob(f".{name}.partial-*")) + sorted(parent.glob(f".{name}.old-*"))


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def jsonl_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    return path


def killing_tokenizer(text: str) -> list[int]:
    """UTF-8 bytes, except that a text holding ``KILL`` kills the process (SIGKILL, as the out-of-memory killer does)."""
    if "KILL" in text:
        os.kill(os.getpid(), signal.SIGKILL)
    return list(text.encode())


PEAK_RSS = """import resource
def peak():  # this process's own peak RSS in bytes (VmHWM: ru_maxrss would inherit the parent's peak across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""
"""Source of ``peak()`` for a child script (``-c``): the child's own peak RSS in bytes."""
