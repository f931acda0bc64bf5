"""Tests for `streambatch._kernels`: the one door to the C extensions, the switch per kernel, the old switch names,
``STREAMBATCH_DISABLE_CPU_FEATURES``, and a build without a C compiler."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch import _kernels
from streambatch.errors import ConfigError
from streambatch.items.windows.gather import window_gather

ROOT = Path(__file__).parents[1]
HIDDEN = sorted(set(_kernels.EXTENSIONS.values()))
BUILT = all(_kernels.available().values())
needs_c = pytest.mark.skipif(not BUILT, reason="the C extensions are not built")
OLD_SWITCHES = [  # module, attribute, kernel, the old word for the Python path
    ("streambatch.order.shuffle", "BACKEND", "shuffle", "numpy"),
    ("streambatch.items.pack.pack", "BACKEND", "best_fit", "python"),
    ("streambatch.items.pack._pack_fit", "BACKEND", "best_fit", "python"),
    ("streambatch.items.pack.rows", "GATHER_BACKEND", "packed_gather", "numpy"),
    ("streambatch.items.windows.gather", "WINDOW_BACKEND", "window_gather", "numpy"),
    ("streambatch.items.mix.order", "BACKEND", "mix_order", "python"),
    ("streambatch.items.mix.plan", "BACKEND", "mix_order", "python"),
]


def _run(code: str, env: dict[str, str] | None = None) -> str:
    """*code* in a fresh interpreter importing this tree; its stdout."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=environment)
    assert done.returncode == 0, done.stderr
    return done.stdout


def digest() -> str:
    """One hash of every array of masked window and packed epochs (rows under and over the copy's 1 KB chunk, uint16
    and uint32 tokens) and a packed mixture: what each kernel path must give alike."""
    rng = np.random.default_rng(3)
    found = hashlib.sha256()
    for dtype in (np.uint16, np.uint32):
        docs = []
        for i, n in enumerate(rng.integers(2, 1500, 24).tolist()):
            mask = rng.random(n) < 0.7
            mask[-1] = True
            docs.append(sb.Document(f"d{i}", "train", rng.integers(0, 60_000, n).astype(dtype), loss_mask=mask))
        store = sb.DocumentStore.from_documents(docs)
        epochs = [sb.Epoch(store, context_length=T, batch_size=5, seed=7, pack=pack) for T in (5, 600) for pack in (False, True)]
        parts = [sb.pack(sb.DocumentStore.from_documents(docs[k::2]), context_length=40) for k in (0, 1)]
        batches = [*(batch for epoch in epochs for batch in epoch), *sb.materialize(sb.chunk(sb.mix(parts, [2, 1], seed=4), 6))]
        for batch in batches:
            for name in ("inputs", "targets", "loss_mask", "segment_ids", "position_ids", "cu_seqlens"):
                value = getattr(batch, name, None)
                found.update(name.encode() + (b"-" if value is None else np.ascontiguousarray(value).tobytes()))
            found.update(str(batch.target_count).encode())
    return found.hexdigest()


def test_available_names_every_kernel_and_each_switch_starts_on_it() -> None:
    """`available` names the six kernels; each runs C exactly where its extension was built."""
    found = _kernels.available()
    assert sorted(found) == sorted(_kernels.KERNELS)
    assert {k: "c" if built else "python" for k, built in found.items()} == {k: _kernels.backend(k) for k in found}
    assert [k for k in found if (_kernels.built(k) is not None) != found[k]] == []


def test_only_the_door_imports_the_extensions() -> None:
    """No module but `streambatch._kernels` imports a C extension (they ask it), nor names one in a string import."""
    package, names = Path(sb.__file__).parent, set(_kernels.EXTENSIONS.values())
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "_kernels.py":
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                named = {(node.module or "").rpartition(".")[2], *(alias.name for alias in node.names)}
            elif isinstance(node, ast.Import):
                named = {alias.name.rpartition(".")[2] for alias in node.names}
            else:
                continue
            found += [f"{path.relative_to(package)}: {name}" for name in sorted(named & names)]
        found += [f"{path.relative_to(package)}: {n} (string)" for n in sorted(names) if f"streambatch.{n}'" in text]
    assert found == []


@needs_c
def test_use_switches_one_kernel_inside_the_block_and_restores_it() -> None:
    """`use` switches one kernel inside the block, nested or left by an error, and no other."""
    with _kernels.use("window_gather", "python"):
        assert _kernels.extension("window_gather") is None
        assert _kernels.extension("packed_gather") is _kernels.built("packed_gather")
        with _kernels.use("window_gather", "c"):
            assert _kernels.extension("window_gather") is _kernels.built("window_gather")
        assert _kernels.backend("window_gather") == "python"
    assert _kernels.backend("window_gather") == "c"
    with pytest.raises(KeyError), _kernels.use("shuffle", "python"):
        raise KeyError("inside")
    assert _kernels.backend("shuffle") == "c"
    assert _kernels.set_backend("mix_order", "python") == "c"
    try:
        assert _kernels.extension("mix_order") is None
    finally:
        _kernels.set_backend("mix_order", "c")


def test_a_bad_kernel_or_path_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown kernel or path names the choices; "c" without its extension says how to build it, changing nothing."""
    with pytest.raises(ConfigError, match="not one of shuffle, best_fit"):
        _kernels.backend("gather")
    with pytest.raises(ConfigError, match="not 'c' or 'python'"), _kernels.use("shuffle", "numpy"):
        pass
    monkeypatch.setitem(_kernels._MODULES, "_row_gather", None)
    before = _kernels.backend("packed_gather")
    with pytest.raises(ConfigError, match=r"_row_gather is not built; reinstall .* or use 'python'"):
        _kernels.set_backend("packed_gather", "c")
    assert before == _kernels.backend("packed_gather")


@needs_c
@pytest.mark.parametrize(("module", "attribute", "kernel", "word"), OLD_SWITCHES)
def test_the_old_switch_names_still_read_and_set_the_switch(module: str, attribute: str, kernel: str, word: str) -> None:
    """The five old switch names (and their re-exports) work for one release: they read and set the kernel's switch,
    with a DeprecationWarning naming the new one."""
    old = sys.modules[module] if module in sys.modules else __import__(module, fromlist=["_"])
    warning = rf"{module}.{attribute} is deprecated.*use\('{kernel}', 'python'\)"
    with pytest.warns(DeprecationWarning, match=warning):
        assert getattr(old, attribute) == "c"
    try:
        with pytest.warns(DeprecationWarning, match=warning):
            setattr(old, attribute, word)
        assert _kernels.backend(kernel) == "python"
        with pytest.warns(DeprecationWarning, match=warning):
            assert getattr(old, attribute) == word
    finally:
        _kernels.set_backend(kernel, "c")


@needs_c
def test_a_switch_reaches_a_space_whose_gather_was_made() -> None:
    """A space caches its gather per switch: batches gathered before and after a switch, and back, are alike."""
    epoch = sb.Epoch([sb.Document("a", "train", np.arange(400) % 300)], context_length=7, batch_size=4, seed=1)
    first = epoch.batch(0)
    assert window_gather(first.space).kernel is not None
    with _kernels.use("window_gather", "python"):
        assert window_gather(first.space).kernel is None
        assert epoch.batch(0) == first
    assert window_gather(first.space).kernel is not None


def test_describe_and_the_version_line_name_each_kernels_path() -> None:
    """`describe` gives each kernel's path and the CPU features in use; ``streambatch --version`` prints it."""
    line = _kernels.describe()
    assert all(f"{kernel} {_kernels.backend(kernel)}" in line for kernel in _kernels.KERNELS)
    out = _run("import sys; from streambatch.cli import main; sys.argv = ['streambatch', '--version']; main()")
    assert out.splitlines()[1].startswith("kernels: shuffle ")


@needs_c
def test_the_disable_variable_turns_the_named_loops_off() -> None:
    """``STREAMBATCH_DISABLE_CPU_FEATURES`` (any case, spaces or commas, "all") turns those loops off at import, and
    the C module and `disabled_features` read it alike; an unknown name warns."""
    code = "import json; from streambatch import _kernels; print(json.dumps(_kernels.cpu_features()))"
    default = json.loads(_run(code, {_kernels.DISABLE_VARIABLE: ""}))
    assert sorted(default) == sorted(_kernels.CPU_FEATURES)
    for value in ("avx2, Popcnt", "AVX512BW\tfsrm", "all", "ALL"):
        found = json.loads(_run(code, {_kernels.DISABLE_VARIABLE: value}))
        off = _kernels.disabled_features(value)
        pair = ["AVX512F", "AVX512BW", "BMI2"]
        expected = {k: on and k not in off and not (k in pair and off & set(pair)) for k, on in default.items()}
        assert found == expected, value
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import streambatch"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), _kernels.DISABLE_VARIABLE: "sse9 avx2"},
    )
    assert "names SSE9, which no kernel dispatches on" in done.stderr


@pytest.mark.kernels
def test_the_features_the_variable_names_are_off_in_this_process() -> None:
    """Under ``STREAMBATCH_DISABLE_CPU_FEATURES`` (.ci/run's second pass) the C loops it names are not in use."""
    off = _kernels.disabled_features()
    if not off:
        pytest.skip(f"{_kernels.DISABLE_VARIABLE} is not set here (the subprocess tests set it)")
    features = _kernels.cpu_features()
    assert [name for name in off & set(features) if features[name]] == []


@needs_c
@pytest.mark.slow
def test_every_loop_off_gives_the_same_batches() -> None:
    """With every CPU feature off (the SSE2, SWAR and memcpy loops) the gathers give the batches they give here."""
    here = digest()
    assert here == _run("from tests.test_kernels import digest; print(digest())", {_kernels.DISABLE_VARIABLE: "all"}).strip()


@needs_c
@pytest.mark.slow
def test_a_build_without_a_c_compiler_gives_the_same_batches() -> None:
    """Every extension hidden, as a build without a C compiler has none: the package imports, `available` is all
    False, every kernel runs its Python path, and the epochs and mixture equal the C kernels' byte for byte."""
    hide = "".join(f"sys.modules['streambatch.{name}'] = None; " for name in HIDDEN)  # their import then fails
    code = (
        f"import sys, json; {hide}\n"
        "from streambatch import _kernels\n"
        "from tests.test_kernels import digest\n"
        "print(json.dumps([_kernels.available(), [_kernels.backend(k) for k in _kernels.KERNELS], _kernels.cpu_features()]))\n"
        "print(digest())"
    )
    report, found = _run(code).strip().splitlines()
    available, paths, features = json.loads(report)
    assert available == dict.fromkeys(_kernels.KERNELS, False)
    assert paths == ["python"] * len(_kernels.KERNELS)
    assert features == {}
    assert found == digest()
