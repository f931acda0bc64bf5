"""Tokenizers the Ray fault tests send to workers (importable there: the fixture puts this checkout on PYTHONPATH)."""

from __future__ import annotations

import os
import time


class Trap:
    """Bytes, except that the first text holding ``TRAP`` writes this process's pid to FOLDER/pid and waits (to be
    SIGKILLed by the test) until FOLDER/sprung exists; once it does, the tokenizer is plain bytes."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, text: str) -> list[int]:
        sprung = os.path.join(self.folder, "sprung")
        if "TRAP" in text and not os.path.exists(sprung):
            partial = os.path.join(self.folder, f"pid.{os.getpid()}")
            with open(partial, "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(partial, os.path.join(self.folder, "pid"))
            deadline = time.monotonic() + 120
            while not os.path.exists(sprung) and time.monotonic() < deadline:
                time.sleep(0.02)
        return list(text.encode())


class Hold:
    """Bytes, except that a text holding ``HOLD`` writes this process's pid to FOLDER/held and waits until
    FOLDER/release exists (its driver is killed meanwhile)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, text: str) -> list[int]:
        release = os.path.join(self.folder, "release")
        if "HOLD" in text and not os.path.exists(release):
            partial = os.path.join(self.folder, f"held.{os.getpid()}")
            with open(partial, "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(partial, os.path.join(self.folder, "held"))
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.02)
        return list(text.encode())
