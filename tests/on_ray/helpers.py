"""Tokenizers the Ray fault tests send to workers (importable there: the fixture puts this checkout on PYTHONPATH)."""

from __future__ import annotations

import os
import time


class Pause:
    """Bytes, except that a text holding `word` writes this process's pid to FOLDER/`note` and waits (up to 120 s)
    until FOLDER/`go` exists; once it does, the tokenizer is plain bytes."""

    word, note, go = "", "", ""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, text: str) -> list[int]:
        go = os.path.join(self.folder, self.go)
        if self.word in text and not os.path.exists(go):
            partial = os.path.join(self.folder, f"{self.note}.{os.getpid()}")
            with open(partial, "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(partial, os.path.join(self.folder, self.note))
            deadline = time.monotonic() + 120
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.02)
        return list(text.encode())


class Trap(Pause):
    """The first text holding ``TRAP`` writes the pid to FOLDER/pid and waits (to be SIGKILLed by the test) until
    FOLDER/sprung exists."""

    word, note, go = "TRAP", "pid", "sprung"


class Hold(Pause):
    """A text holding ``HOLD`` writes the pid to FOLDER/held and waits until FOLDER/release exists (its driver is
    killed meanwhile)."""

    word, note, go = "HOLD", "held", "release"
