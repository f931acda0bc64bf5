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


def _synopsis() -> dict[str, str]:
    text = README.read_text()
    block = text[text.index("## Command line") :]
    block = block[block.index("```bash\n") + 8 : block.index("```", block.index("```bash\n") + 8)]
    commands: dict[str, str] = {}
    for line in block.replace("\\\n", " ").splitlines():
        words = line.split()
        if words[:1] == ["streambatch"]:
            commands[words[1]] = line
    return commands


def test_synopsis_lists_every_option_of_every_command() -> None:
    """The README's synopsis names each command and, for each, every option its parser takes."""
    import argparse

    from streambatch.cli import build_parser

    synopsis = _synopsis()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(synopsis)
    missing = []
    for name, parser in commands.choices.items():
        words = set(re.findall(r"--?[A-Za-z][a-z-]*", synopsis[name]))
        for action in parser._actions:
            hidden = action.help == argparse.SUPPRESS  # a refused 0.3 spelling (prepare --shard), not an option
            if action.option_strings and action.dest != "help" and not hidden and not words & set(action.option_strings):
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert [] == missing


def test_inspect_example_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inspect example defines its input file and prints exactly the table shown."""
    from streambatch.cli import main

    text = README.read_text()
    found = re.search(
        r"```bash\ncat > four\.jsonl <<'EOF'\n(.*?)EOF\n```\n```\n\$ streambatch (inspect .*?)\n(.*?)```", text, re.S
    )
    assert found is not None
    monkeypatch.chdir(tmp_path)
    Path("four.jsonl").write_text(found.group(1))
    out = io.StringIO()
    assert 0 == main(found.group(2).split(), out)
    assert found.group(3) == out.getvalue()


def test_hugging_face_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The datasets snippet is self-contained: given a tokenizer.json, it writes a store that records the tokenizer."""
    pytest.importorskip("datasets", reason="datasets is not installed (the hf extra)")
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    text = README.read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "iter_hf(" in b]
    monkeypatch.chdir(tmp_path)
    model = tokenizers.models.WordLevel({"first": 0, "second": 1, "[UNK]": 2, "</s>": 3}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save("tokenizer.json")
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)
    import streambatch as sb

    store = sb.open_store("store")
    assert [store.document(i).tokens.tolist() for i in range(len(store))] == [[0, 3], [1, 3]]
    assert store.tokenizer is not None
    assert store.tokenizer["eos_token"] == "</s>"
