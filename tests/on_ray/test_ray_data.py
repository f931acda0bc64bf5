"""streambatch.ray on a real local cluster: Tokenize and CorpusSink (read_json -> map_batches -> write_datasink -> Epoch),
read_corpus equal to open_source's documents, a failed write leaving no manifest, and nothing listening beyond loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from tests.read.test_read_tokenizers import CORPUS, train_bpe

from ..parts_corpus import PROMPTS, docs, epoch_rows, prompt_rows

pytest.importorskip("pyarrow")


@pytest.fixture
def ordered(ray_cluster: Any) -> Any:
    """Ray Data keeping the input order (a corpus's documents are in order)."""
    context = ray_cluster.data.DataContext.get_current()
    saved = context.execution_options.preserve_order
    context.execution_options.preserve_order = True
    yield ray_cluster
    context.execution_options.preserve_order = saved


def test_tokenize_and_corpus_sink_round_trip(ordered: Any, tmp_path: Path) -> None:
    """read_json -> map_batches(Tokenize) -> CorpusSink -> sb.Epoch on prompt/completion rows and a BPE: prepare's
    documents, masks, tokenizer and epoch (--workers 1); read_corpus gives back open_source's documents."""
    from streambatch.ray import CorpusSink, Tokenize, read_corpus

    ray = ordered
    tokenizer = str(train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"]))
    path = prompt_rows(tmp_path / "pairs.jsonl")
    read = {"tokenizer": tokenizer, "prompt_field": "q", "completion_field": "a"}
    ds = ray.data.read_json(str(path), override_num_blocks=3)
    ds = ds.map_batches(Tokenize, fn_constructor_kwargs=read, batch_format="pyarrow", batch_size=64, concurrency=1)
    ds.write_datasink(CorpusSink(tmp_path / "out", tokenizer=tokenizer))
    corpus = sb.open_corpus(tmp_path / "out")
    whole = sb.prepare_store([path], tmp_path / "store", workers=1, quiet=True, **read)  # type: ignore[arg-type]
    assert len(corpus.shards) > 1
    assert corpus.has_loss_mask
    assert len(corpus) == len(PROMPTS)
    assert docs(corpus) == docs(whole)
    assert epoch_rows(corpus) == epoch_rows(whole)
    assert corpus.tokenizer == whole.tokenizer
    rows = read_corpus(tmp_path / "out", documents_per_block=37).take_all()
    got = [(r["id"], r["partition"], list(r["tokens"]), None if r["loss_mask"] is None else list(r["loss_mask"])) for r in rows]
    assert got == docs(sb.open_source(tmp_path / "out").store)


def test_read_corpus_of_a_store_without_masks(ordered: Any, tmp_path: Path) -> None:
    """A plain store read through Ray Data: every document in order, loss_mask null."""
    from streambatch.ray import read_corpus

    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    store = sb.prepare_store([tmp_path / "t.jsonl"], tmp_path / "store", eos_id=0, quiet=True)
    rows = read_corpus(store, documents_per_block=64).take_all()
    assert [(r["id"], r["partition"], list(r["tokens"]), r["loss_mask"]) for r in rows] == docs(store)


def test_a_failed_write_leaves_no_manifest(ordered: Any, tmp_path: Path) -> None:
    """Rows without ids fail in Tokenize mid-write: the corpus folder's old corpus.json is gone, and none is written."""
    from streambatch.ray import CorpusSink, Tokenize

    ray = ordered
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    sb.prepare_store([tmp_path / "t.jsonl"], tmp_path / "out", parts=2, eos_id=0, quiet=True)
    assert (tmp_path / "out" / "corpus.json").exists()
    rows = [{"id": f"g{i}", "text": t} for i, t in enumerate(CORPUS[:50])] + [{"text": "no id here"}] * 5
    with pytest.raises(Exception, match=r"the rows have no id column"):
        ray.data.from_items(rows).map_batches(Tokenize, batch_format="pyarrow", batch_size=50).write_datasink(
            CorpusSink(tmp_path / "out")
        )
    assert not (tmp_path / "out" / "corpus.json").exists()
    with pytest.raises(sb.StreamBatchError):
        sb.open_source(tmp_path / "out")


def _listening(pids: set[int]) -> list[str]:
    """The local addresses (hex, as /proc/net shows them) of TCP sockets in LISTEN state that *pids* hold open."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    found.append(fields[1].split(":")[0])
    return found


def test_the_cluster_listens_on_loopback_only(ray_cluster: Any) -> None:
    """Every listening socket of this process and its descendants (GCS, raylet, workers) is on 127.0.0.1."""
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux's /proc")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    family, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        family.add(pid)
        todo += children.get(pid, [])
    addresses = _listening(family)
    assert addresses  # the GCS and raylet listen
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    assert [a for a in addresses if a not in loopback] == []
