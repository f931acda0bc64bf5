"""Every Python block of README.md and docs/*.md runs as written, and prints what the page says it prints.

Each block runs alone, in a fresh folder holding the files the pages name
(`corpus/`, `data/store`, `data/shard-0`, `data/shard-1`, `docs.jsonl`, and
`tokenizer.json` where `tokenizers` is installed).  A block that imports an
optional package (torch, datasets, tokenizers, pyarrow) is skipped, with the
reason, where that package is absent.  A block followed by a ``prints`` block
must print exactly that.  The command lines the pages show are checked too:
every option they name exists, and the inspect example prints its table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```(?:\n\nprints\n\n```\n(.*?)```)?", re.S)
CHAPTER = '{"id": "train-a", "tokens": [0, 10, 11, 12, 1]}\n{"id": "train-b", "tokens": [0, 20, 21, 1]}\n'
OPTIONAL = ("torch", "torchdata", "datasets", "tokenizers", "pyarrow", "zstandard", "transformers", "trl", "lightning")


def _blocks() -> Iterator[Any]:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for found in BLOCK.finditer(text):
            line = text[: found.start()].count("\n") + 1
            yield pytest.param(found.group(1), found.group(2), id=f"{page.relative_to(ROOT)}:{line}")


def _needs(block: str) -> list[str]:
    """The optional packages *block* imports (``streambatch.torch`` needs torch; ``tokenizer.json`` needs tokenizers)."""
    modules = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][\w.]*)", block, flags=re.M))
    modules |= {m.strip() for line in re.findall(r"^\s*import\s+(.+)$", block, flags=re.M) for m in line.split(",")}
    tops = {m.split()[0].split(".")[0] for m in modules if m}
    if any(m.startswith("streambatch.torch") for m in modules) or "import streambatch.torch" in block:
        tops.add("torch")
    if "tokenizer.json" in block:
        tops.add("tokenizers")
    return [name for name in OPTIONAL if name in tops]


def _text(seed: int) -> str:
    words = ["token", "window", "batch", "epoch", "shuffle", "document", "store", "plan", "rank", "mean"]
    return "\n".join(" ".join(words[(seed * 7 + i * j) % len(words)] for j in range(12)) for i in range(40)) + "\n"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the pages name, built once; each block gets a copy."""
    base = tmp_path_factory.mktemp("docs-workspace")
    corpus = base / "corpus"
    corpus.mkdir()
    for k in range(3):
        (corpus / f"part-{k}.txt").write_text(_text(k))
    store = sb.prepare_store([str(corpus)], str(base / "data" / "store"))
    documents = [store.document(i) for i in range(len(store))]
    sb.write_store(str(base / "data" / "shard-0"), documents[:2])
    sb.write_store(str(base / "data" / "shard-1"), documents[2:])
    (base / "docs.jsonl").write_text(CHAPTER)
    if importlib.util.find_spec("tokenizers") is not None:
        import tokenizers

        vocab = {w: i for i, w in enumerate(sorted(set(" ".join(_text(k) for k in range(3)).split())))}
        vocab.update({"[UNK]": len(vocab), "</s>": len(vocab) + 1})
        tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        tokenizer.save(str(base / "tokenizer.json"))
    return base


@pytest.mark.parametrize(("block", "shown"), list(_blocks()))
def test_python_block_runs(
    block: str, shown: str | None, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block runs in a copy of the workspace; with a ``prints`` block after it, it prints exactly that."""
    for name in _needs(block):
        pytest.importorskip(name, reason=f"{name} is not installed (an optional extra)")
    here = tmp_path / "here"
    shutil.copytree(workspace, here)
    monkeypatch.chdir(here)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "docs-block", "exec"), {"__name__": "__docs__"})
    if shown is not None:
        assert shown == out.getvalue()


def test_every_page_has_its_blocks_found() -> None:
    """The pages hold Python blocks, and each ``prints`` block belongs to the Python block just before it."""
    blocks = list(_blocks())
    assert len(blocks) >= 12
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert text.count("\n\nprints\n\n```\n") == sum(1 for m in BLOCK.finditer(text) if m.group(2) is not None), page


def test_the_readme_is_the_front_door() -> None:
    """At most 400 lines, a table of contents, the two set-up commands, and a link to every reference page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    assert "## Contents" in text
    assert "scripts/demo.sh        # creates .venv" in text
    assert "scripts/test.sh        # installs test tools" in text
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, page.name
    for name in ("prepare", "packing", "mixtures", "resume", "scale", "limits", "cli"):
        assert (ROOT / "docs" / f"{name}.md").exists(), name
    for command in _commands():  # the table of commands names every command
        assert f"| `streambatch {command}" in text, command


def test_the_pipeline_example_prints_the_chapter() -> None:
    """The README's first block is the chapter's pipeline: its final batch's mean is 0.4375."""
    (block, shown) = next(iter(_blocks())).values
    assert "sb.materialize" in block
    assert shown.splitlines()[1].endswith(" 4 0.4375")


# --- the command lines the pages show ------------------------------------------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    from streambatch.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def _synopsis() -> dict[str, str]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    block = text[text.index("## Synopsis") :]
    block = block[block.index("```bash\n") + 8 : block.index("```", block.index("```bash\n") + 8)]
    commands: dict[str, str] = {}
    for line in block.replace("\\\n", " ").splitlines():
        words = line.split()
        if words[:1] == ["streambatch"]:
            commands[words[1]] = line
    return commands


def test_synopsis_lists_every_option_of_every_command() -> None:
    """docs/cli.md's synopsis names each command and, for each, every option its parser takes, and no other."""
    synopsis = _synopsis()
    commands = _commands()
    assert set(commands) == set(synopsis)
    missing, unknown = [], []
    for name, parser in commands.items():
        options = {o for a in parser._actions for o in a.option_strings}
        words = set(re.findall(r"(?<![\w-])--?[A-Za-z][a-z-]*", synopsis[name]))
        for action in parser._actions:
            hidden = action.help == argparse.SUPPRESS  # a refused 0.3 spelling (prepare --shard), not an option
            if action.option_strings and action.dest != "help" and not hidden and not words & set(action.option_strings):
                missing.append(f"{name} {'/'.join(action.option_strings)}")
        unknown += [f"{name} {w}" for w in sorted(words - options)]
    assert ([], []) == (missing, unknown)


def _script_options() -> set[str]:
    found: set[str] = set()
    for script in (ROOT / "scripts").glob("*.py"):
        found |= set(re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", script.read_text(encoding="utf-8")))
    return found


# flags of other tools the pages show (Slurm, torchrun, ruff), and the CLI's own --help/--version
OTHER_TOOLS = {
    "--array",
    "--cpus-per-task",
    "--standalone",
    "--nproc-per-node",
    "--check",
    "--help",
    "--version",
    "--head",
    "--address",
}


def test_every_option_the_pages_name_exists() -> None:
    """A `streambatch CMD` line names only CMD's options; any other --flag in the pages is some command's or a script's."""
    commands = _commands()
    per_command = {name: {o for a in p._actions for o in a.option_strings} for name, p in commands.items()}
    known = set().union(*per_command.values()) | _script_options() | OTHER_TOOLS
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for line in re.sub(r"\]\([^)]*\)", "]", text).replace("\\\n", " ").splitlines():  # links' anchors are no flags
            for command, rest in re.findall(r"streambatch (\w+)((?: [^`|]*)?)", line):
                if command in per_command:
                    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest.split("#")[0]))
                    wrong += [f"{page.name}: streambatch {command} {f}" for f in sorted(flags - per_command[command])]
            wrong += [f"{page.name}: {f}" for f in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line)) - known)]
    assert [] == sorted(set(wrong))


def test_inspect_example_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md's inspect example defines its input file and prints exactly the table shown."""
    from streambatch.cli import main

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    found = re.search(
        r"```bash\ncat > four\.jsonl <<'EOF'\n(.*?)EOF\n```\n```\n\$ streambatch (inspect .*?)\n(.*?)```", text, re.S
    )
    assert found is not None
    monkeypatch.chdir(tmp_path)
    Path("four.jsonl").write_text(found.group(1))
    out = io.StringIO()
    assert 0 == main(found.group(2).split(), out)
    assert found.group(3) == out.getvalue()


def test_audit_example_prints_its_proof_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md's audit output of the chapter's epoch is the audit's own first line."""
    from streambatch.cli import main

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    shown = re.search(r"```\n(PROOF\|coverage=5/5.*?)\n", text)
    assert shown is not None
    monkeypatch.chdir(tmp_path)
    Path("docs.jsonl").write_text(
        '{"id": "train-a", "tokens": [0, 10, 11, 12, 1]}\n{"id": "train-b", "tokens": [0, 20, 21, 1]}\n'
    )
    out = io.StringIO()
    assert 0 == main(["audit", "docs.jsonl", "-T", "2", "-B", "3", "--seed", "7"], out)
    assert out.getvalue().splitlines()[0] == shown.group(1)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_pages_lands() -> None:
    """Each relative link names a file that exists and, with #anchor, one of its headings."""
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(
                    r"^#+ (.+)$", re.sub(r"```.*?```", "", linked.read_text(encoding="utf-8"), flags=re.S), re.M
                )
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target}")
    assert [] == broken


def test_every_dotted_name_the_pages_give_exists() -> None:
    """`streambatch.x.y` in the pages (not a quoted format name) imports, attribute by attribute."""
    import importlib

    from streambatch.errors import MissingDependencyError

    missing = []
    for page in PAGES:
        for name in sorted(set(re.findall(r"(?<![\"\w.])streambatch(?:\.[A-Za-z_]\w*)+", page.read_text(encoding="utf-8")))):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    found: Any = importlib.import_module(".".join(parts[:cut]))
                except MissingDependencyError:  # streambatch.torch without torch: not checkable here
                    break
                except ImportError:
                    continue
                try:
                    for attribute in parts[cut:]:
                        found = getattr(found, attribute)
                except AttributeError:
                    missing.append(f"{page.name}: {name}")
                break
    assert [] == missing


def test_the_readme_and_changelog_give_the_version() -> None:
    """One version: the README's and the changelog's newest entry are the package's (and so pyproject's, --version)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"Version {sb.__version__} " in readme
    released = [h for h in re.findall(r"^## (\S+)", changelog, flags=re.M) if h != "Unreleased"]  # merged, not released
    assert released[0] == sb.__version__
