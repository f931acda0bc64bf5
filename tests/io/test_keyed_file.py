"""Issue 22 item 3 and issue 25 items 1, 3, 4: one keyed-file module for plan, packing and mixture-plan files.

Every changed byte of a plan, packing or mixture plan is a `DataError` naming the
file without ``--verify`` (a digest per block, checked on first read); the
forged cases (digests recomputed) are caught by the kind's own checks; an
unwritable plan folder is a `StoreError`; earlier layouts are refused with the
re-plan message; a 255-source mixture has a plan file.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
import streambatch.io.keyed_file as keyed_file
from streambatch.cli import main
from streambatch.errors import DataError, StoreError
from streambatch.order.splitmix import derive_seed
from streambatch.tools.mix_report import audit_mixture
from tests import keyed

T, B, SEED = 4, 3, 7


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Status, stdout and stderr of the command; stderr without its notes (a mixture's repeats)."""
    capsys.readouterr()
    out = io.StringIO()
    status = main(argv, out)
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if not line.startswith("streambatch: note:"))
    return status, out.getvalue(), err


class Files:
    """A store (train and validation documents of equal lengths), a mixture file, and their keyed files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        docs = []
        for i in range(9):
            docs.append(sb.Document(f"t{i}", "train", np.arange(7 + i % 3) + 10 * i))
            if i % 3 == 0:
                docs.append(sb.Document(f"v{i}", "validation", np.arange(7 + i % 3) + 500 + i))
        sb.write_store(root / "store", docs)
        sb.write_store(root / "web", [sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 18)) for i in range(3)])
        sb.write_store(root / "code", [sb.Document("c0", "train", range(1000, 1018))])
        entries = [{"name": "web", "path": "web", "weight": 0.75}, {"name": "code", "path": "code", "weight": 0.25}]
        (root / "mixture.json").write_text(json.dumps({"sources": entries}))
        self.store = root / "store"
        self.mixture = root / "mixture.json"
        self.plans = root / "plans"
        self.plan = Path(str(self.epoch().order.plan_path))
        self.pack()
        (self.packing,) = self.plans.glob("*.packing")
        list(self.mixed())
        (self.mixplan,) = self.plans.glob("*.mixplan")

    def epoch(self, **more: Any) -> sb.Epoch:
        """Epoch 0 of run SEED (the plan `streambatch epoch --seed SEED` maps)."""
        opened = sb.open_store(self.store)
        seed = derive_seed(SEED, 0)
        return sb.Epoch(opened, context_length=T, batch_size=B, seed=seed, keep_partition=True, plan_dir=self.plans, **more)

    def pack(self) -> sb.Rows:
        return sb.pack(sb.open_store(self.store), context_length=T, keep_partition=True, plan_dir=self.plans)

    def mixed(self, **more: Any) -> sb.Epoch:
        return sb.Epoch(sb.open_source(self.mixture), context_length=2, batch_size=3, seed=SEED, plan_dir=self.plans, **more)

    def use(self, kind: str) -> Any:
        """Read every entry of the *kind* file the way batches do (no verify)."""
        if kind == "plan":
            return list(self.epoch())
        if kind == "packing":
            return self.pack()
        return list(self.mixed())

    def path(self, kind: str) -> Path:
        return {"plan": self.plan, "packing": self.packing, "mixplan": self.mixplan}[kind]

    def cli_args(self, kind: str) -> list[str]:
        if kind == "mixplan":
            return ["epoch", str(self.mixture), "-T", "2", "-B", "3", "--seed", str(SEED), "--plan-dir", str(self.plans)]
        common = ["epoch", str(self.store), "-T", str(T), "-B", str(B), "--keep-partition", "--plan-dir", str(self.plans)]
        return [*common, "--seed", str(SEED), *(["--pack"] if kind == "packing" else [])]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("keyed"))


@pytest.fixture
def fresh(tmp_path: Path) -> Files:
    return Files(tmp_path)


KINDS = ["plan", "packing", "mixplan"]


def _regions(path: Path) -> list[tuple[int, int]]:
    """``(offset, size)`` of every region of the file: the prefix and header, its padding, each section and the
    padding after it, the table: together every byte (the paddings must be blank or zeros)."""
    head = keyed.header(path)
    table_at, blocks, _ = head["digests"]
    cuts = sorted({0, keyed_file._PREFIX + len(json.dumps(head).encode())} | {o for o, n in keyed.section_bytes(path)}
                  | {o + n for o, n in keyed.section_bytes(path)} | {table_at, table_at + blocks * 16})  # fmt: skip
    assert cuts[-1] == path.stat().st_size
    return [(a, b - a) for a, b in itertools.pairwise(cuts) if b > a]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), where=st.floats(0, 1, exclude_max=True), pick=st.integers(0, 10**6), flip=st.integers(1, 255))
def test_one_changed_byte_anywhere_is_a_data_error_naming_the_file(
    files: Files, kind: str, where: float, pick: int, flip: int
) -> None:
    """Hypothesis over the byte position: header, its padding, any block of any section, a section's padding, or the
    digest table; no --verify."""
    path = files.path(kind)
    original = path.read_bytes()
    ranges = _regions(path)
    offset, size = ranges[pick % len(ranges)]
    at = offset + int(where * size)
    changed = bytearray(original)
    changed[at] ^= flip
    path.write_bytes(bytes(changed))
    try:
        with pytest.raises(DataError, match=re.escape(str(path)) + ": "):
            files.use(kind)
    finally:
        path.write_bytes(original)
    files.use(kind)  # the control: the file as written is used


def test_blocks_are_checked_lazily_once_each(tmp_path: Path) -> None:
    """A plan of 4 blocks: the first batch checks one; a damaged last block is refused only by the batch reading it."""
    count = 3 * keyed_file.BLOCK + 100
    store = sb.DocumentStore.from_arrays(np.arange(count + 1) % 50, [0, count + 1])
    epoch = sb.Epoch(store, context_length=1, batch_size=1000, seed=SEED, plan_dir=tmp_path)
    path = Path(str(epoch.order.plan_path))
    body = keyed.body(path, "plan")
    body[-1] ^= 1
    body.flush()
    del body, epoch
    epoch = sb.Epoch(store, context_length=1, batch_size=1000, seed=SEED, plan_dir=tmp_path)
    epoch[0]
    base: Any = epoch.order.plan
    while isinstance(base, np.ndarray):
        base = base.base
    found = keyed_file._REGISTRY[base]
    assert 1 == int(found.keyed._checked.sum())  # one block read, one block checked
    epoch[1]  # the same block: no new check
    assert 1 == int(found.keyed._checked.sum())
    with pytest.raises(DataError, match=re.escape(str(path)) + r": block 3 of its plan \(entries 196608\.\.196707\)"):
        epoch[epoch.batch_count - 1]
    with pytest.raises(DataError, match="block 3 of its plan"):  # a worker that maps the file again checks it itself
        pickle.loads(pickle.dumps(epoch.order))[len(epoch.order) - 5 :].positions()


def test_verify_checks_every_block_up_front(fresh: Files) -> None:
    body = keyed.body(fresh.plan, "plan")
    body[-1] ^= 1
    body.flush()
    del body
    with pytest.raises(StoreError, match=r"block 0 of its plan .* does not match its digest"):
        fresh.epoch(verify_plan=True).order  # noqa: B018 - opening with verify reads it all


# -- issue 25 item 1: each attack, plain (the digest) and forged (the kind's own check) ----------------------------


def _packing_other_partition(files: Files) -> None:
    """A tail pointed at a document of another partition with a tail of the same size."""
    store = sb.open_store(files.store)
    tails = keyed.body(files.packing, "tails")
    lengths, partitions = store.lengths, [store.partition(i).value for i in range(len(store))]
    at = next(
        i
        for i, d in enumerate(tails.tolist())
        if any(partitions[v] != "train" and lengths[v] == lengths[d] for v in range(len(store)))
    )
    tails[at] = next(v for v in range(len(store)) if partitions[v] != "train" and lengths[v] == lengths[int(tails[at])])
    tails.flush()


def _packing_duplicate(files: Files) -> None:
    """A tail copied over another."""
    tails = keyed.body(files.packing, "tails")
    tails[1] = tails[0]
    tails.flush()


def _mixplan_swap(files: Files) -> None:
    """Two items of different sources swapped inside one block."""
    ids = keyed.body(files.mixplan, "sources")
    j = int(np.flatnonzero(ids != ids[0])[0])
    ids[0], ids[j] = ids[j], ids[0]
    ids.flush()


def _mixplan_source(files: Files) -> None:
    ids = keyed.body(files.mixplan, "sources")
    ids[5] = 2  # k = 2
    ids.flush()


def _mixplan_moved(files: Files) -> None:
    ids = keyed.body(files.mixplan, "sources")
    ids[5] = 1 - ids[5]
    ids.flush()


def _mixplan_checkpoint(files: Files) -> None:
    table = keyed.body(files.mixplan, "checkpoints")
    table[2] += 1
    table.flush()


def _plan_duplicate(files: Files) -> None:
    body = keyed.body(files.plan, "plan")
    body[1] = body[0]
    body.flush()


ATTACKS: dict[str, tuple[str, Callable[[Files], None], str]] = {
    "packing-other-partition": ("packing", _packing_other_partition, "which has no tail in this partition"),
    "packing-duplicate-tail": ("packing", _packing_duplicate, "tail is packed more than once"),
    "mixplan-swap": ("mixplan", _mixplan_swap, ""),
    "mixplan-source-id": ("mixplan", _mixplan_source, "a source id 2, but the mixture has 2 sources"),
    "mixplan-moved": ("mixplan", _mixplan_moved, "do not agree with its checkpoint counts"),
    "mixplan-checkpoint": ("mixplan", _mixplan_checkpoint, "do not agree with its checkpoint counts"),
    "plan-duplicate": ("plan", _plan_duplicate, ""),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_a_data_error_by_default(fresh: Files, attack: str, capsys: pytest.CaptureFixture[str]) -> None:
    """API and CLI: DataError / exit 2, one line naming the file (not "remove the plan file"), no output written."""
    kind, damage, _ = ATTACKS[attack]
    path = fresh.path(kind)
    damage(fresh)
    with pytest.raises(DataError, match=re.escape(str(path)) + r": block 0 of its \w+ .* does not match its digest"):
        fresh.use(kind)
    out = fresh.root / "out.jsonl"
    out.write_text("before\n")
    status, text, err = _cli([*fresh.cli_args(kind), "-o", str(out)], capsys)
    assert (2, "", 1) == (status, text, len(err.splitlines())), err
    assert str(path) in err
    assert "does not match its digest" in err
    assert "before\n" == out.read_text()


@pytest.mark.parametrize("attack", [a for a, (_, _, message) in ATTACKS.items() if message])
def test_a_forged_attack_is_caught_by_the_kinds_own_check(fresh: Files, attack: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Digests recomputed to match: the packing's rows against the partition's documents, a mixture's source ids."""
    kind, damage, message = ATTACKS[attack]
    path = fresh.path(kind)
    damage(fresh)
    keyed.redigest(path)
    with pytest.raises(DataError, match=re.escape(str(path)) + ": .*" + message):
        fresh.use(kind)
    out = fresh.root / "out.jsonl"
    status, text, err = _cli([*fresh.cli_args(kind), "-o", str(out)], capsys)
    assert (2, "", 1) == (status, text, len(err.splitlines())), err
    assert str(path) in err
    assert re.search(message, err)
    assert not out.exists()


@pytest.mark.parametrize("attack", ["mixplan-swap"])
def test_audit_compares_a_forged_mixture_plan_with_tijdemans_order(
    fresh: Files, attack: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged .mixplan that the batches accept: `audit` recomputes Tijdeman's order from the weights and fails."""
    _, damage, _ = ATTACKS[attack]
    assert not audit_mixture(fresh.mixed())["failures"]
    damage(fresh)
    keyed.redigest(fresh.mixplan)
    failures = audit_mixture(fresh.mixed())["failures"]
    assert "tijdeman" in failures, failures
    argv = ["audit", str(fresh.mixture), "-T", "2", "-B", "3", "--seed", str(SEED), "--plan-dir", str(fresh.plans)]
    status, text, err = _cli(argv, capsys)
    assert 1 == status, (text, err)
    assert "FAIL" in text
    assert "tijdeman" in text


# -- unwritable plan folders and earlier layouts ---------------------------------------------------------------------


def _users(files: Files, plan_dir: Path) -> dict[str, Callable[[], Any]]:
    store = sb.open_store(files.store)
    web = sb.windows(sb.open_store(files.root / "web"), context_length=2)
    code = sb.windows(sb.open_store(files.root / "code"), context_length=2)
    return {
        "Epoch": lambda: list(sb.Epoch(store, context_length=T, batch_size=B, seed=SEED, keep_partition=True, plan_dir=plan_dir)),
        "pack": lambda: sb.pack(store, context_length=T, keep_partition=True, plan_dir=plan_dir),
        "mix": lambda: sb.mix([web, code], [3, 1], seed=SEED, plan_dir=plan_dir),
    }


@pytest.mark.parametrize("user", ["Epoch", "pack", "mix"])
def test_an_unwritable_plan_dir_is_a_store_error(fresh: Files, user: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan_dir that is a file, or a folder that refuses writes (even for root): StoreError naming it, nothing written."""
    a_file = fresh.root / "not-a-folder"
    a_file.write_text("x")
    with pytest.raises(StoreError, match=r"plan_dir='.*not-a-folder': cannot write the .* there"):
        _users(fresh, a_file)[user]()
    folder = fresh.root / "ro"
    folder.mkdir()
    real = os.open

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StoreError, match=r"plan_dir='.*ro': cannot write the .* there \(Permission denied\)"):
        _users(fresh, folder)[user]()
    assert [] == list(folder.iterdir())


def _old_layout(path: Path) -> None:
    """What streambatch 0.3 wrote: a 4 KiB JSON header at byte 0, then the body."""
    head = keyed.header(path)
    text = json.dumps({"format": head["format"], "version": head["version"], "key": head["key"]}).encode()
    path.write_bytes(text.ljust(4095) + b"\n" + bytes(64))


@pytest.mark.parametrize("kind", KINDS)
def test_an_earlier_layout_is_refused_with_the_replan_message(
    fresh: Files, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fresh.path(kind)
    _old_layout(path)
    message = (
        re.escape(str(path)) + r": a file of an earlier layout \(streambatch 0\.3, without block digests\); plan again: remove"
    )
    with pytest.raises(StoreError, match=message):
        fresh.use(kind)
    status, text, err = _cli(fresh.cli_args(kind), capsys)
    assert (2, "", 1) == (status, text, len(err.splitlines()))
    assert re.search(message, err)


def test_a_mixture_of_255_sources_has_a_plan_file(tmp_path: Path) -> None:
    """255 sources: a header far beyond 4 KiB, written and read; the order and batches are the in-memory mixture's."""
    parts = [sb.windows([sb.Document(f"s{i}", "train", [i % 7, i, i + 1, i + 2])], context_length=2) for i in range(255)]
    weights = list(range(1, 256))
    mapped = sb.mix(parts, weights, seed=SEED, length=600, plan_dir=tmp_path)
    (path,) = tmp_path.glob("*.mixplan")
    assert len(json.dumps(keyed.header(path))) > 4096
    plain = sb.mix(parts, weights, seed=SEED, length=600)
    assert mapped.sources().tolist() == plain.sources().tolist()
    assert mapped.counts(599).tolist() == plain.counts(599).tolist()
    first = [b.inputs.tolist() for b in sb.materialize(sb.chunk(mapped[:16], 16))]  # a source epoch plan file per source
    assert first == [b.inputs.tolist() for b in sb.materialize(sb.chunk(plain[:16], 16))]
    again = sb.mix(parts, weights, seed=SEED, length=600, plan_dir=tmp_path)  # mapped, not written again
    assert again.sources().tolist() == plain.sources().tolist()
