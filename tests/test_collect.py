"""The ``tests._collect`` plugin: the path it names is the torch package, and without torch it is left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import _collect
from .hostile import ENV, REPO


def test_the_named_torch_package_exists_and_needs_torch() -> None:
    """`TORCH_PACKAGE` is the package's folder, and its modules import torch (what the plugin skips for)."""
    assert _collect.TORCH_PACKAGE == (REPO / "streambatch" / "torch").resolve()
    assert (_collect.TORCH_PACKAGE / "__init__.py").is_file()
    modules = sorted(_collect.TORCH_PACKAGE.glob("*.py"))
    assert any("import torch" in p.read_text() for p in modules)


@pytest.mark.parametrize("has_torch", [False, True])
def test_the_torch_package_is_ignored_only_without_torch(monkeypatch: pytest.MonkeyPatch, has_torch: bool) -> None:
    monkeypatch.setattr(_collect, "_has_torch", lambda: has_torch)
    package = _collect.TORCH_PACKAGE
    for path in (package, package / "datasets.py", package / "__init__.py"):
        assert _collect.pytest_ignore_collect(path) is (None if has_torch else True)
    for path in (REPO / "streambatch", REPO / "streambatch" / "batch" / "minibatch.py", REPO / "tests" / "torch.py"):
        assert _collect.pytest_ignore_collect(path) is None


def test_collection_without_torch_leaves_the_torch_package_out(tmp_path: Path) -> None:
    """A pytest run in which ``import torch`` fails collects the rest of the package and nothing of streambatch/torch/."""
    code = (
        "import sys; sys.modules['torch'] = None; import pytest; "
        "sys.exit(pytest.main(['--collect-only', '-q', 'streambatch/torch', 'streambatch/batch']))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert any(line.startswith("streambatch/batch/") for line in collected), done.stdout
    assert not any(line.startswith("streambatch/torch") for line in collected), done.stdout
