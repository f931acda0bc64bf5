"""pytest plugin (loaded with ``-p tests._collect``): skip torch-only modules where torch is absent."""

from __future__ import annotations

from pathlib import Path


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Leave streambatch/torch.py's doctests out when torch cannot be imported (tests/torch skip themselves)."""
    if collection_path.name == "torch.py" and collection_path.parent.name == "streambatch" and not _has_torch():
        return True
    return None
