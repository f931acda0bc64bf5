"""pytest plugin (loaded with ``-p tests._collect``): skip the torch package's modules where torch is absent, and
streambatch/ray.py (it imports ray) where ray is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TORCH_PACKAGE = Path(__file__).resolve().parents[1] / "streambatch" / "torch"  # its doctests need torch
HF_PACKAGE = TORCH_PACKAGE.parent / "hf"  # its doctests need transformers and accelerate (sft.py: trl too)
RAY_MODULE = Path(__file__).resolve().parents[1] / "streambatch" / "ray.py"  # imports ray (the ray extra)


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def torch_only(path: Path) -> bool:
    """True for the torch package (`TORCH_PACKAGE`) and everything in it."""
    found = Path(path).resolve()
    return found == TORCH_PACKAGE or TORCH_PACKAGE in found.parents


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """Leave streambatch/torch/'s doctests out when torch cannot be imported (tests/ that need it skip themselves);
    streambatch/hf/'s where transformers (or, for its TRL module, trl) is not installed; streambatch/ray.py without ray."""
    if torch_only(collection_path) and not _has_torch():
        return True
    found = Path(collection_path).resolve()
    if found == RAY_MODULE and not _has("ray"):
        return True
    if found == HF_PACKAGE or HF_PACKAGE in found.parents:
        needed = ["torch", "transformers", "accelerate"] + (["trl"] if found.name == "sft.py" else [])
        return True if not all(_has(m) for m in needed) else None
    return None
