"""One local Ray cluster for the whole session (2 CPUs, loopback only), started by the first test that asks for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """``ray.init(num_cpus=2)`` once, listening on 127.0.0.1 only (no dashboard); workers import this checkout."""
    os.environ[LOOPBACK] = "0"  # Ray's "no cluster" mode: the node is 127.0.0.1, so every server binds loopback only
    ray = pytest.importorskip("ray")
    constants = ray._private.ray_constants  # read at import: set again where ray was imported first (doctests)
    constants.ENABLE_RAY_CLUSTER = False
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([saved] if saved else [])])  # the raylet's workers inherit it
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop(LOOPBACK, None)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
