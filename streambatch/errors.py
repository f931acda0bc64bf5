"""The `StreamBatchError` family: every error streambatch raises on purpose.

Each message says ``name=value``, the rule that was broken, where (document id,
line, coordinate, file) and what to do about it.
"""

from __future__ import annotations


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


class AccumulationError(StreamBatchError):
    """A token contribution or accumulator operation was rejected; nothing changed."""


class RowIndexError(OutOfRangeError):
    """A batch row index is out of range (also an `IndexError`)."""


class StateError(StreamBatchError):
    """A saved run position is malformed or belongs to another run (corpus, configuration, seed, version)."""
