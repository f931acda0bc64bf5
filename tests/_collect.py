"""pytest plugin (loaded with ``-p tests._collect``): skip the torch package's modules where torch is absent."""

from __future__ import annotations

from pathlib import Path

TORCH_PACKAGE = Path(__file__).resolve().parents[1] / "streambatch" / "torch"  # its doctests need torch


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def torch_only(path: Path) -> bool:
    """True for the torch package (`TORCH_PACKAGE`) and everything in it."""
    found = Path(path).resolve()
    return found == TORCH_PACKAGE or TORCH_PACKAGE in found.parents


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Leave streambatch/torch/'s doctests out when torch cannot be imported (tests/ that need it skip themselves)."""
    if torch_only(collection_path) and not _has_torch():
        return True
    return None
