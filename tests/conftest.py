"""Shared test configuration: the hypothesis profile and golden-file paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def golden() -> Path:
    """Folder of the chapter's exact outputs."""
    return GOLDEN
