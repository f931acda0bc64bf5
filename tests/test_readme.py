"""The README's pipeline example runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_pipeline_example_runs() -> None:
    """The first python block executes and prints the chapter's shapes and denominators."""
    block = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("(3, 2) ['train-b@1', 'train-a@1', 'train-b@0'] 6 ")
    assert lines[1].startswith("(2, 2) ['train-a@0', 'train-a@2'] 4 ")
