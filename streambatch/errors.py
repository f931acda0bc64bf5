"""The `StreamBatchError` family: every error streambatch raises on purpose.

Each message says ``name=value``, the rule that was broken, where (document id,
line, coordinate, file) and what to do about it.
"""

from __future__ import annotations

from pathlib import Path

from ._paths import short_path


class StreamBatchError(ValueError):
    """Base of every error streambatch raises on purpose."""


class ConfigError(StreamBatchError):
    """A stage argument is out of range or conflicts with another."""


class OutOfRangeError(ConfigError, IndexError):
    """A batch or row index is out of range (also an `IndexError`)."""


class MissingDependencyError(ConfigError, ImportError):
    """An optional dependency is not installed; the message names the extra to install (also an `ImportError`)."""


class DataError(StreamBatchError):
    """A document, store or batch is malformed; the message says where."""


class PartitionError(DataError):
    """A document belongs to another partition than the epoch's."""


class DuplicateIdError(DataError):
    """Two documents share one id; the message names both positions."""


class StoreError(DataError):
    """A token store on disk is missing, truncated, corrupted or inconsistent."""


class MissingObject(StoreError):
    """No object of that name in object storage (a 404 that is not a missing bucket)."""


class AccumulationError(StreamBatchError):
    """A token contribution or accumulator operation was rejected; nothing changed."""


class RowIndexError(OutOfRangeError):
    """A batch row index is out of range (also an `IndexError`)."""


class StateError(StreamBatchError):
    """A saved run position is malformed or belongs to another run (corpus, configuration, seed, version)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises `KeyboardInterrupt` (`streambatch._signals`), so the same cleanup runs.

    Not a `StreamBatchError`: like Ctrl-C it is a request to stop, not a bad input.
    """


class OverBudget(BaseException):
    """A time budget spent (`streambatch.read.text.budget`): raised in the working thread between bytecodes, never out of
    `time_budget` (which turns it into a `DataError` naming the document).  A `BaseException`, so no
    ``except Exception`` in the code it stops (a template's runtime) keeps it."""


class Untraceable(BaseException):
    """A chat template did something with the chat that `streambatch.read.text.chat_trace.Turns` does not follow as a
    list would: the caller renders every prefix instead.  A `BaseException`, so jinja2's ``except Exception`` lets it
    through; never out of `ChatTemplate.segments`."""


class NotRegularFileError(OSError):
    """A path names a FIFO, device, socket or directory where a regular file is expected (an `OSError`:
    the store and file readers turn it into a `StoreError` or `DataError` naming the path)."""


class StoreFileMissing(Exception):
    """A store file was not there: raised inside one attempt to open a store, never out of `streambatch.open_store`
    (the reader turns it into a `StoreError`, or tries again when a writer replaced the store meanwhile)."""

    def __init__(self, name: str, err: OSError) -> None:
        super().__init__(name)
        self.name = name
        self.err = err


class WorkerLostError(RuntimeError):
    """A worker process died (killed, or crashed) while it held some inputs; the run failed, nothing was written.

    Not a refusal of the input (``streambatch prepare`` exits 1, not 2): a `RuntimeError`.
    """


EXTRAS = {  # the optional extras of pyproject.toml and the packages each installs (tests/test_newcomer.py keeps them equal)
    "progress": ("tqdm>=4.60",),
    "torch": ("torch>=2.1", "torchdata>=0.8"),
    "tokenizers": ("tokenizers>=0.19",),
    "hf": ("datasets>=2.14",),
    "arrow": ("pyarrow>=12",),
    "zstd": ("zstandard>=0.21",),
    "chat": ("jinja2>=3.1",),
    "remote": ("obstore>=0.8",),
    "transformers": ("torch>=2.1", "transformers>=4.56,<6", "accelerate>=1.0,<2"),
    "trl": ("torch>=2.1", "transformers>=4.56,<6", "accelerate>=1.0,<2", "trl>=0.20,<2"),
    "lightning": ("torch>=2.1", "lightning>=2.4,<3"),
    "ray": ("ray[data]>=2.40,<3",),
}


def install_hint(extra: str) -> str:
    """The one command that installs an extra: its packages by name, and this project's own checkout when there is one.

    Never ``pip install streambatch[...]``: an unrelated package of that name is
    on the public index.

    >>> install_hint("zstd").startswith("pip install 'zstandard>=0.21' (the zstd extra")
    True
    """
    packages = " ".join(f"'{p}'" for p in EXTRAS[extra])
    root = Path(__file__).resolve().parent.parent
    found = (root / "pyproject.toml").is_file()
    checkout = f"; or, from this checkout, pip install -e '{short_path(root)}[{extra}]'" if found else ""
    return f"pip install {packages} (the {extra} extra of streambatch{checkout})"


def missing_dependency(what: str, module: str, extra: str) -> MissingDependencyError:
    """The `MissingDependencyError` for *what*, which needs *module* from the optional *extra*.

    >>> print(str(missing_dependency("reading .zst files", "zstandard", "zstd")).split(": ")[1])
    pip install 'zstandard>=0.21' (the zstd extra of streambatch...
    """
    return MissingDependencyError(f"{what} needs the {module} package, which is not installed: {install_hint(extra)}")
