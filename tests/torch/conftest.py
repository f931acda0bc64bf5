"""Torch integration tests: skipped cleanly (with the reason) where torch is not installed."""

import pytest

pytest.importorskip(
    "torch", reason="PyTorch is not installed; pip install -e '.[torch]' from the checkout (CI installs torch==2.13.0)"
)
