"""Inputs of every reader for the part-plan and corpus-run tests (local and Ray), and what to compare stores by."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

import streambatch as sb
from tests.read.test_read_tokenizers import CORPUS

PROMPTS = [{"id": f"pc-{i}", "q": f"what is {i} plus {i}?", "a": f"it is {2 * i}, fox {i}"} for i in range(300)]


def every_reader(root: Path) -> Path:
    """A folder with text, JSONL (one large file, cut), gzip (whole), Parquet (many row groups), Arrow, a saved dataset,
    .npy and .bin inputs: every format a part can read."""
    pa = __import__("pyarrow")
    pq = __import__("pyarrow.parquet", fromlist=["x"])
    root.mkdir(parents=True)
    for i in range(5):
        (root / f"t{i:02d}.txt").write_text(CORPUS[i] * (i + 1))
    (root / "big.jsonl").write_text("".join(json.dumps({"text": t * (1 + i % 3)}) + "\n" for i, t in enumerate(CORPUS)))
    (root / "lines.txt.gz").write_bytes(gzip.compress("\n".join(CORPUS[:40]).encode()))
    pq.write_table(pa.table({"text": CORPUS[:120]}), root / "rows.parquet", row_group_size=9)
    with (
        pa.OSFile(str(root / "tab.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, pa.schema([("tokens", pa.list_(pa.int64()))])) as w,
    ):
        w.write_table(pa.table({"tokens": [[1, 2, 3], [4, 5]]}))
    datasets = __import__("datasets")
    datasets.Dataset.from_dict({"text": CORPUS[:60]}).save_to_disk(str(root / "ds"))
    np.save(root / "arr.npy", np.arange(40, dtype=np.uint16) % 7)
    np.save(root / "arr.offsets.npy", np.array([0, 10, 25, 40]))
    (np.arange(60, dtype="<u2") % 9).tofile(root / "nano.bin")
    return root


def prompt_rows(path: Path) -> Path:
    """One JSONL file of prompt/completion rows (cut into parts; masks)."""
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return path


def docs(source: Any) -> list[tuple[str, str, list[int], list[bool] | None]]:
    """Every document of a store or corpus: id, partition, tokens, loss mask (None without one)."""
    masked = source.has_loss_mask
    return [
        (d.id, d.partition.value, d.tokens.tolist(), source.loss_mask(i).tolist() if masked else None)
        for i, d in enumerate(source)
    ]


def epoch_rows(source: Any) -> list[Any]:
    """An epoch's batches as plain lists (inputs, targets, masks, ids), seeded."""
    epoch = sb.Epoch(source, context_length=3, batch_size=5, seed=7, keep_partition=True)
    return [
        (b.inputs.tolist(), b.targets.tolist(), None if b.loss_mask is None else b.loss_mask.tolist(), b.document_ids)
        for b in epoch
    ]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under *folder* (relative path -> bytes), markers left out."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith(".done.json")
    }


def part_stores(inputs: list[Path], folder: Path, count: int, **options: Any) -> Path:
    """What a Slurm array writes: ``prepare --part i/count`` into folder/part-0000i each, then ``sb.write_corpus``."""
    for i in range(count):
        sb.prepare_store(inputs, folder / f"part-{i:05d}", part=f"{i}/{count}", quiet=True, **options)
    sb.write_corpus(folder / "corpus.json", [folder / f"part-{i:05d}" for i in range(count)])
    return folder
