"""The README's pipeline example runs as written and prints what the README says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_pipeline_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first python block executes and prints exactly the block that follows it (0.4375 for the final batch)."""
    text = README.read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    shown = re.search(r"```python\n.*?```\n\nprints\n\n```\n(.*?)```", text, flags=re.S)
    assert shown is not None
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    assert shown.group(1) == out.getvalue()
    assert out.getvalue().splitlines()[1].endswith(" 4 0.4375")
