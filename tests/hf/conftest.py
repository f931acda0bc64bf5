"""HF Trainer / TRL integration tests: skipped cleanly (with the reason) where transformers is not installed."""

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed; pip install -e '.[transformers]' from the checkout")
pytest.importorskip("transformers", reason="transformers is not installed; pip install -e '.[transformers]' from the checkout")
pytest.importorskip("accelerate", reason="accelerate is not installed; pip install -e '.[transformers]' from the checkout")
