"""``prepare --executor ray`` on a real local cluster: the bytes of ``--part i/n``, the epoch of one store, and faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import DataError
from streambatch.parts.corpus import CorpusJob, inputs_keys
from streambatch.parts.on_ray import RayRunner
from streambatch.read.parts import sizes_of
from streambatch.read.select import select_inputs
from tests.read.test_prepare import cli
from tests.read.test_read_tokenizers import CORPUS, train_bpe

from ..parts_corpus import docs, epoch_rows, every_reader, folder_bytes, part_stores, prompt_rows
from .conftest import ROOT
from .helpers import Hold, Trap

pytest.importorskip("pyarrow")


def _wait_for(path: Path, what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def _wait_gone(pid: int, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process {pid} of the killed driver's task is still running"
        time.sleep(0.05)


def _inputs(kind: str, root: Path) -> tuple[list[Path], dict[str, Any]]:
    """Text + BPE (a folder of text files and a large JSONL), prompt/completion rows, or one Parquet file of row groups."""
    root.mkdir()
    if kind == "text-bpe":
        for i in range(6):
            (root / f"t{i}.txt").write_text(CORPUS[i] * (i + 3))
        (root / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
        return [root], {"tokenizer": str(train_bpe(root.parent / "tokenizer.json", ["<|endoftext|>"]))}
    if kind == "prompt-completion":
        return [prompt_rows(root / "pc.jsonl")], {"prompt_field": "q", "completion_field": "a", "eos_id": 0}
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [f"{CORPUS[i % len(CORPUS)]} {i}" for i in range(900)]
    pq.write_table(pa.table({"text": texts}), root / "rows.parquet", row_group_size=50, compression="none")
    return [root / "rows.parquet"], {"eos_id": 0}


@pytest.mark.parametrize("kind", ["text-bpe", "prompt-completion", "parquet-row-groups"])
def test_ray_parts_are_the_bytes_of_part_i_of_n(ray_cluster: Any, tmp_path: Path, kind: str) -> None:
    """Every file of the Ray corpus folder (each part's store and corpus.json) equals --part i/3 + sb.write_corpus."""
    inputs, options = _inputs(kind, tmp_path / "in")
    corpus = sb.prepare_store(inputs, tmp_path / "ray", executor="ray", parts=3, quiet=True, **options)
    reference = part_stores(inputs, tmp_path / "ref", 3, **options)
    assert folder_bytes(tmp_path / "ray") == folder_bytes(reference)
    assert all(len(s) > 0 for s in corpus.shards)
    whole = sb.prepare_store(inputs, tmp_path / "whole", quiet=True, **options)
    assert docs(corpus) == docs(whole)
    assert corpus.has_loss_mask == (kind == "prompt-completion")


def test_ray_corpus_gives_the_epoch_of_one_store(ray_cluster: Any, tmp_path: Path) -> None:
    """Every reader (text, JSONL, gzip, Parquet, Arrow, datasets, .npy, .bin) through the CLI on Ray: the documents and
    epoch of `prepare --workers 1`; a re-run keeps every part; Megatron parts read back with the same tokens."""
    pytest.importorskip("datasets")
    inputs = every_reader(tmp_path / "c")
    status, text = cli("prepare", str(inputs), "-o", str(tmp_path / "ray"), "--executor", "ray", "--parts", "4", "--eos-id", "0")
    assert status == 0
    assert text.startswith(f"wrote {tmp_path / 'ray'}: ")
    whole = sb.prepare_store([inputs], tmp_path / "whole", eos_id=0, workers=1, quiet=True)
    corpus = sb.open_source(tmp_path / "ray").store
    assert docs(corpus) == docs(whole)
    assert epoch_rows(corpus) == epoch_rows(whole)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("*.done.json")}
    assert cli("prepare", str(inputs), "-o", str(tmp_path / "ray"), "--executor", "ray", "--parts", "4", "--eos-id", "0")[0] == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("*.done.json")}
    sb.prepare_store([inputs], tmp_path / "mega", executor="ray", parts=3, format="megatron", eos_id=0, quiet=True)
    sb.prepare_store([inputs], tmp_path / "mega-local", parts=3, format="megatron", eos_id=0, quiet=True)
    assert folder_bytes(tmp_path / "mega") == folder_bytes(tmp_path / "mega-local")


def test_the_tokenizer_loads_once_per_worker_process(ray_cluster: Any, tmp_path: Path) -> None:
    """Six parts on two worker processes: each process unpickles the options (loads the tokenizer) once."""
    inputs = [prompt_rows(tmp_path / "pc.jsonl")]
    job = _job(inputs, tmp_path / "out", 6, {"prompt_field": "q", "completion_field": "a", "eos_id": 0})
    runner = RayRunner(None)
    results = list(runner.run(job, list(range(6))))
    assert sorted(r.index for r in results) == list(range(6))
    by_pid: dict[int, set[int]] = {}
    for r in results:
        by_pid.setdefault(r.pid, set()).add(r.loads)
    assert len(by_pid) < len(results)  # processes were reused
    assert all(len(loads) == 1 for loads in by_pid.values())  # no process loaded it again within the job


def _job(inputs: list[Path], output: Path, count: int, read: dict[str, Any]) -> CorpusJob:
    import pickle

    from streambatch.read.blocks import read_options

    files = select_inputs(inputs)
    options = pickle.dumps(read_options(**read))
    keys = inputs_keys(files, sizes_of(files))
    return CorpusJob(
        tuple(map(str, inputs)), str(output), count, (), (), False, "streambatch", options, str(hash(options)), *keys
    )


def _flagged_inputs(tmp_path: Path, count: int, word: str, at: int) -> Path:
    """*count* text files in tmp_path/in, file *at* starting with *word* (what a `Pause` tokenizer waits on); the
    empty folder its flags go to."""
    (tmp_path / "in").mkdir()
    for i in range(count):
        (tmp_path / "in" / f"f{i}.txt").write_text((f"{word} " if i == at else "") + CORPUS[i] * 20)
    flags = tmp_path / "flags"
    flags.mkdir()
    return flags


def test_a_worker_killed_mid_part_is_retried_with_the_same_bytes(ray_cluster: Any, tmp_path: Path) -> None:
    """The task reading TRAP writes its pid and waits; the test SIGKILLs that worker; Ray runs the part again: the
    corpus is byte-identical to --part i/n, and no partial store is left in the folder."""
    flags = _flagged_inputs(tmp_path, 6, "TRAP", 4)
    trap = Trap(str(flags))

    def kill() -> None:
        _wait_for(flags / "pid", "the trapped task")
        os.kill(int((flags / "pid").read_text()), signal.SIGKILL)
        (flags / "sprung").touch()

    killer = threading.Thread(target=kill)
    killer.start()
    corpus = sb.prepare_store([tmp_path / "in"], tmp_path / "ray", executor="ray", parts=3, tokenizer=trap, quiet=True)
    killer.join()
    assert (flags / "sprung").exists()
    reference = part_stores([tmp_path / "in"], tmp_path / "ref", 3, tokenizer=trap)
    assert folder_bytes(tmp_path / "ray") == folder_bytes(reference)
    assert sorted(os.listdir(tmp_path / "ray")) == ["corpus.json"] + [
        f"part-{i:05d}{e}" for i in range(3) for e in ("", ".done.json")
    ]
    assert len(corpus) == 6


def test_a_killed_driver_reruns_the_missing_parts_only(ray_cluster: Any, tmp_path: Path, capsys: Any) -> None:
    """A driver (its own process, on the test's cluster) is SIGKILLed while the last part waits; the re-run keeps the
    three finished parts (their markers untouched) and writes the fourth: the bytes of --part i/4."""
    flags = _flagged_inputs(tmp_path, 8, "HOLD", 7)
    hold = Hold(str(flags))
    script = (
        "import sys, ray, streambatch as sb\n"
        "from tests.on_ray.helpers import Hold\n"
        "ray.init(address=sys.argv[1], log_to_driver=False)\n"
        "sb.prepare_store([sys.argv[2]], sys.argv[3], executor='ray', parts=4, tokenizer=Hold(sys.argv[4]), quiet=True)\n"
    )
    address = ray_cluster.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "ray"
    driver = subprocess.Popen(
        [sys.executable, "-c", script, address, str(tmp_path / "in"), str(out), str(flags)], env=env, cwd=str(ROOT)
    )
    try:
        for i in range(3):
            _wait_for(out / f"part-{i:05d}.done.json", f"part {i}")
        _wait_for(flags / "held", "the held part")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    _wait_gone(int((flags / "held").read_text()))  # Ray stops a dead driver's tasks: the held part never finishes
    assert not (out / "corpus.json").exists()
    assert not (out / "part-00003.done.json").exists()
    stamps = {i: (out / f"part-{i:05d}.done.json").stat().st_mtime_ns for i in range(3)}
    (flags / "release").touch()
    capsys.readouterr()
    sb.prepare_store([tmp_path / "in"], out, executor="ray", parts=4, tokenizer=hold)
    assert "4 parts (3 already complete, 1 prepared by ray)" in capsys.readouterr().err
    assert stamps == {i: (out / f"part-{i:05d}.done.json").stat().st_mtime_ns for i in range(3)}
    assert folder_bytes(out) == folder_bytes(part_stores([tmp_path / "in"], tmp_path / "ref", 4, tokenizer=hold))


def test_bad_and_unreachable_inputs_are_one_error_naming_the_part(ray_cluster: Any, tmp_path: Path, capsys: Any) -> None:
    """A bad file follows --skip-bad (named with its part); an input a worker cannot see, or sees otherwise, is one error."""
    (tmp_path / "in").mkdir()
    rows = [json.dumps({"id": f"r{i:02d}", "text": f"row {i}"}) for i in range(60)]
    rows[31] = "{broken"
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(rows) + "\n")
    corpus = sb.prepare_store([tmp_path / "in"], tmp_path / "skip", executor="ray", parts=2, skip_bad=True, eos_id=0, quiet=True)
    err = capsys.readouterr().err
    assert "prepare: skipped " in err
    assert "(part 1/2, bytes " in err
    assert [len(s) for s in corpus.shards] == [len(sb.open_store(tmp_path / "skip" / "part-00000")), 0]
    with pytest.raises(DataError, match=r"^part 1/2 \(on .+\): .*a.jsonl"):
        sb.prepare_store([tmp_path / "in"], tmp_path / "bad", executor="ray", parts=2, eos_id=0, quiet=True)
    assert not (tmp_path / "bad" / "corpus.json").exists()
    job = _job([tmp_path / "in"], tmp_path / "gone", 2, {"eos_id": 0})
    runner = RayRunner(None)
    moved = CorpusJob(("/nonexistent/corpus",), *list(job.__dict__.values())[1:])
    with pytest.raises(DataError, match=r"^part [01]/2 \(on .+\): input '/nonexistent/corpus' does not exist"):
        list(runner.run(moved, [0, 1]))
    other = CorpusJob(*list(job.__dict__.values())[:-2], "blake2b-256:another-listing", job.stamps_key)
    with pytest.raises(DataError, match=r"the inputs differ from what the driver saw .*shared filesystem"):
        list(runner.run(other, [0, 1]))
