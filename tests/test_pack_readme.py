"""The README's packing example runs as written and prints what the README says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_packing_example_runs() -> None:
    """The python block of the "Packing" section prints exactly the block that follows it."""
    section = README.read_text().split("## Packing", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```\n\nprints\n\n```\n(.*?)```", section, flags=re.S)
    assert found is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(found.group(1), "README.md", "exec"), {})
    assert found.group(2) == out.getvalue()
