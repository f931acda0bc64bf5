"""Every road to a batch over a store in object storage (moto's S3 on loopback) gives the local store's bytes.

The roads: a list of chunks in any order, ``chunk.gather()``, ``items.gather(i)``, ``Epoch[i]``, a `Run` after a
resume, the torch datasets (0 and 2 workers), the command line's tools; the kinds: windows, packed rows, mixtures,
masked stores.  Reading a remote store's tokens outside a held range faults (never zeros), a closed store, epoch,
run or dataset refuses to be read again, and a process stopped in the middle of a remote epoch exits 0.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import ConfigError, StreamBatchError
from streambatch.items.mix.mixture import mix
from streambatch.stages.materialize import materialize_one
from tests.remote_server import BUCKET, documents, moto_server, uploaded

KINDS = ["windows", "packed", "mixture", "masked-windows", "masked-packed-mixture"]
FEW = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with moto_server() as port:
        yield port


def prompted(count: int, seed: int) -> list[sb.Document]:
    """Prompt/completion documents: the first third of each is prompt (no loss), the rest completion."""
    return [
        sb.Document(d.id, d.partition, d.tokens, loss_mask=np.arange(len(d.tokens)) >= max(1, len(d.tokens) // 3))
        for d in documents(count, seed=seed, prefix="m")
    ]


@pytest.fixture(scope="module")
def stores(server: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("roads")
    return {
        "web": uploaded(tmp, "roads-web", documents(30, seed=11)),
        "code": uploaded(tmp, "roads-code", documents(12, seed=12, high=70_000, prefix="c")),  # uint32
        "masked": uploaded(tmp, "roads-masked", prompted(20, seed=13)),
        "tmp": tmp,
    }


def items(stores: dict[str, Any], kind: str, which: int) -> Any:
    """The items of *kind* over the local (*which* 0) or the remote (1) stores, in their epoch order."""
    web, code, masked = (stores[name][which] for name in ("web", "code", "masked"))
    if kind == "windows":
        return sb.shuffle(sb.windows(web, context_length=16, stride=8), 3)
    if kind == "packed":
        return sb.shuffle(sb.pack(code, context_length=16), 4)
    if kind == "mixture":
        parts = [sb.windows(web, context_length=16, stride=16), sb.windows(code, context_length=16, stride=16)]
        return mix(parts, [3, 1], seed=11, names=["web", "code"])
    if kind == "masked-windows":
        return sb.shuffle(sb.windows(masked, context_length=16, stride=4), 5)
    assert kind == "masked-packed-mixture"
    return mix([sb.pack(masked, context_length=16), sb.pack(web, context_length=16)], [1, 1], seed=5, names=["m", "w"])


def epoch(stores: dict[str, Any], kind: str, which: int) -> sb.Epoch:
    return sb.Epoch(items(stores, kind, which), batch_size=8, seed=None)


def same(a: list[Any], b: list[Any]) -> None:
    """Byte for byte: the same batches, columns and counts."""
    assert len(a) == len(b)
    assert a, "nothing was compared"
    for x, y in zip(a, b, strict=True):
        assert (x.index, x.shape, x.token_count) == (y.index, y.shape, y.token_count)
        assert x.inputs.dtype == y.inputs.dtype
        assert x.inputs.tobytes() == y.inputs.tobytes()
        assert x.targets.tobytes() == y.targets.tobytes()
        for name in ("loss_mask", "segment_ids", "position_ids", "cu_seqlens", "sources"):
            mine, theirs = getattr(x, name, None), getattr(y, name, None)
            assert (mine is None) == (theirs is None), name
            if mine is not None:
                assert np.array_equal(np.asarray(mine), np.asarray(theirs)), name


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_lists_of_chunks_in_any_order(stores: dict[str, Any], kind: str, data: st.DataObject) -> None:
    """``sb.materialize`` of any sequence of chunks (a list, a tuple, a generator), in any order, repeats allowed."""
    local, remote = (sb.chunk(items(stores, kind, w), 8) for w in (0, 1))
    picked = data.draw(st.lists(st.integers(0, len(local) - 1), min_size=1, max_size=6), label="batches")
    shape = data.draw(st.sampled_from([list, tuple, iter]), label="sequence")
    same(list(sb.materialize(shape([local[i] for i in picked]))), list(sb.materialize(shape([remote[i] for i in picked]))))


@pytest.mark.parametrize("kind", KINDS)
@FEW
@given(data=st.data())
def test_single_gathers(stores: dict[str, Any], kind: str, data: st.DataObject) -> None:
    """``chunk.gather()``, ``items.gather(i)`` on any view, and `materialize_one`: one batch, fetched first."""
    local, remote = (items(stores, kind, w) for w in (0, 1))
    lo = data.draw(st.integers(0, len(local) - 1), label="lo")
    hi = data.draw(st.integers(lo, min(len(local), lo + 20)), label="hi")
    number = data.draw(st.integers(0, 1000), label="index")
    same([local[lo:hi].gather(number)], [remote[lo:hi].gather(number)])
    chunks = [sb.chunk(x, 8) for x in (local, remote)]
    b = data.draw(st.integers(0, len(chunks[0]) - 1), label="batch")
    same([chunks[0][b].gather(b)], [chunks[1][b].gather(b)])
    same([materialize_one(chunks[0][b])], [materialize_one(chunks[1][b])])


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_indexing_at_random(stores: dict[str, Any], kind: str) -> None:
    """``Epoch[i]`` at random indices, and ``batches()[i]`` (negative ones too) of one lazy sequence."""
    local, remote = epoch(stores, kind, 0), epoch(stores, kind, 1)
    picked = random.Random(kind).sample(range(len(local)), 6)
    same([local[i] for i in picked], [remote[i] for i in picked])
    here, there = local.batches(), remote.batches()
    same([here[-i - 1] for i in picked], [there[-i - 1] for i in picked])


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_after_a_resume(stores: dict[str, Any], kind: str) -> None:
    """A two-epoch `Run` resumed at a random position, and a strided range of its steps, equal the local run's."""
    runs = [sb.Run.from_epoch(epoch(stores, kind, w), epochs=2) for w in (0, 1)]
    total = 2 * runs[0].batches_per_epoch
    at = random.Random(kind).randrange(1, total - 1)
    state = runs[0].state_dict(runs[0].position_of(at))
    for run in runs:
        run.load_state_dict(state)
    here, there = list(runs[0]), list(runs[1])
    assert [(b.epoch, b.index) for b in here] == [(b.epoch, b.index) for b in there]
    assert len(here) == total - at
    same(here, there)
    same(list(runs[0].iter_steps(1, step=3)), list(runs[1].iter_steps(1, step=3)))


def _tensors(dataset: Any, workers: int) -> list[dict[str, Any]]:
    from torch.utils.data import DataLoader

    options: dict[str, Any] = {"multiprocessing_context": "spawn"} if workers else {}  # obstore refuses a fork
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, **options)
    out = []
    for batch in loader:
        row = {"at": (int(batch.epoch), int(batch.index)), "inputs": batch.inputs.numpy().tobytes()}
        row["targets"] = batch.targets.numpy().tobytes()
        mask = getattr(batch, "loss_mask", None)
        row["mask"] = None if mask is None else mask.numpy().tobytes()
        out.append(row)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_torch_datasets_without_workers(stores: dict[str, Any], kind: str) -> None:
    """`EpochDataset` and `RunDataset` in the main process: the local tensors, batch for batch."""
    sbt = pytest.importorskip("streambatch.torch")
    for make in (lambda e: sbt.EpochDataset(e), lambda e: sbt.RunDataset(sb.Run.from_epoch(e, epochs=2))):
        here, there = (_tensors(make(epoch(stores, kind, w)), 0) for w in (0, 1))
        assert here
        assert here == there


@pytest.mark.parametrize("kind", ["windows", "masked-packed-mixture"])
def test_torch_datasets_with_two_workers(stores: dict[str, Any], kind: str) -> None:
    """Two spawned DataLoader workers, each its strided share through the fast road: the local tensors."""
    sbt = pytest.importorskip("streambatch.torch")
    expected = _tensors(sbt.RunDataset(sb.Run.from_epoch(epoch(stores, kind, 0), epochs=2)), 0)
    run = sb.Run.from_epoch(epoch(stores, kind, 1), epochs=2)
    run.set_position(0, 3)  # a resumed run: the workers start at step 3
    assert _tensors(sbt.RunDataset(run), 2) == expected[3:]
    assert _tensors(sbt.EpochDataset(epoch(stores, kind, 1)), 2) == [r for r in expected if r["at"][0] == 0]


def _cli(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    status = main(args, out=out)
    return status, "".join(line for line in out.getvalue().splitlines(True) if not line.startswith("time:"))


@pytest.mark.parametrize(
    "command",
    [
        ["epoch", "{}", "-T", "16", "-B", "8", "--stride", "4", "--seed", "3"],
        ["epoch", "{}", "-T", "16", "-B", "8", "--seed", "3", "--pack"],
        ["audit", "{}", "-T", "16", "-B", "8", "--stride", "8", "--seed", "3", "--quiet"],
        ["audit", "{}", "-T", "16", "-B", "8", "--seed", "3", "--pack", "--quiet"],
        ["inspect", "{}", "-T", "16", "-B", "8", "--json"],
    ],
    ids=["epoch", "epoch-pack", "audit", "audit-pack", "inspect"],
)
def test_the_tools_read_what_the_local_store_holds(stores: dict[str, Any], command: list[str]) -> None:
    """The command line's epoch, audit and inspect over ``s3://`` give what they give over the local store."""
    here = str(stores["tmp"] / "roads-masked")
    there = f"s3://{BUCKET}/roads-masked"
    local = _cli([a.format(here) for a in command])
    remote = _cli([a.format(there) for a in command])
    assert local[0] == 0, local
    assert local[1].strip(), "the tool printed nothing"
    if command[0] == "inspect":  # a remote store is opened unverified (its blocks are checked as they are read)
        shown = [
            {k: v for k, v in json.loads(out).items() if k not in ("path", "verified", "object_storage")}
            for _, out in (local, remote)
        ]
        assert remote[0] == 0
        assert shown[0] == shown[1]
        return
    assert (remote[0], remote[1].replace(there, here)) == local
    if command[0] == "epoch":
        assert any(sum(sum(row) for row in json.loads(line)["inputs"]) for line in remote[1].splitlines())


def test_an_unheld_read_faults_instead_of_reading_zeros(stores: dict[str, Any]) -> None:
    """Structural: the remote tokens are unreadable outside held ranges, so going around every road (numpy's own
    view of the buffer) stops the process; the remote array itself fetches what it reads."""
    _, remote = stores["web"]
    assert int(remote.tokens[5]) == int(stores["web"][0].tokens[5])
    child = f"""
import numpy as np, streambatch as sb
import streambatch.io.remote.tokens as remote_tokens
remote_tokens.WHOLE = remote_tokens.KEEP = 0  # a small store is fetched whole and held: read it by blocks here
tokens = sb.open_store("s3://{BUCKET}/roads-web").tokens
print(int(tokens[5]), flush=True)
print(int(np.asarray(tokens)[tokens.size - 1]), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [str(int(stores["web"][0].tokens[5]))], done.stdout
    assert done.returncode < 0, (done.returncode, done.stderr[-500:])  # killed by the fault (SIGSEGV or SIGBUS)


def test_closed_objects_refuse_to_be_read_again(stores: dict[str, Any]) -> None:
    """close() and ``with``: a store, an epoch, a run and a dataset; using one again is a clear StreamBatchError."""
    url = f"s3://{BUCKET}/roads-web"
    with sb.open_store(url) as store:
        first = next(iter(sb.Epoch(store, context_length=16, batch_size=8, seed=1)))
        assert first.inputs.any()
    assert store.closed
    with pytest.raises(ConfigError, match="closed"):
        list(sb.Epoch(store, context_length=16, batch_size=8, seed=1))
    with pytest.raises(ConfigError, match="closed"):
        sb.windows(store, context_length=16)[0:3].gather(0)
    with pytest.raises(StreamBatchError, match="closed"):
        store.tokens[0:4]

    with sb.Epoch(sb.open_store(url), context_length=16, batch_size=8, seed=1) as made:
        made[0]
    with pytest.raises(ConfigError, match="closed"):
        made[1]
    run = sb.Run(sb.open_store(url), context_length=16, batch_size=8, seed=1, epochs=1)
    walking = iter(run)
    next(walking)
    run.close()
    with pytest.raises(ConfigError, match="closed"):
        next(iter(run))
    with pytest.raises(ConfigError, match="closed"):
        next(walking)
    sbt = pytest.importorskip("streambatch.torch")
    dataset = sbt.EpochDataset(sb.Epoch(sb.open_store(url), context_length=16, batch_size=8, seed=1))
    with dataset:
        next(iter(dataset))
    with pytest.raises(ConfigError, match="closed"):
        next(iter(dataset))
    local = sb.DocumentStore.from_arrays(np.arange(40) % 7, [0, 20, 40])
    local.close()
    with pytest.raises(ConfigError, match="closed"):
        list(sb.Epoch(local, context_length=4, batch_size=2, seed=1))


STOP = """
import sys
import streambatch as sb
url, stop, road, close = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "close"
run = sb.Run(sb.open_store(url), context_length=16, batch_size=4, stride=4, seed=7, epochs=3)
if road == "dataset":
    import streambatch.torch as sbt
    made = sbt.RunDataset(run)
else:
    made = run
for i, batch in enumerate(made):
    if i == stop:
        break
if close:
    made.close()
print("stopped", i, flush=True)
"""


@pytest.mark.slow
def test_a_run_stopped_at_any_batch_exits_0(stores: dict[str, Any]) -> None:
    """50 processes each stop a remote run at a random batch (a Run or a RunDataset, closed or not) with GETs of
    the batches ahead still in flight: every one exits 0 (they used to crash at exit, SIGSEGV or SIGABRT)."""
    url = f"s3://{BUCKET}/roads-web"
    batches = sb.Run(stores["web"][0], context_length=16, batch_size=4, stride=4, seed=7, epochs=3).batches_per_epoch
    rng = random.Random(50)
    cases = [(rng.randrange(0, 3 * batches), ("run", "dataset")[k % 2], ("open", "close")[(k // 2) % 2]) for k in range(50)]

    def one(case: tuple[int, str, str]) -> tuple[tuple[int, str, str], int, str]:
        stop, road, close = case
        done = subprocess.run(
            [sys.executable, "-c", STOP, url, str(stop), road, close], capture_output=True, text=True, timeout=300
        )
        return case, done.returncode, done.stdout + done.stderr[-300:]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, cases))
    failed = [(case, code, text) for case, code, text in results if code != 0 or "stopped" not in text]
    assert not failed, failed


def test_the_uploaded_stores_are_what_the_roads_compare(stores: dict[str, Any]) -> None:
    """The comparisons above are not vacuous: the remote stores hold tokens (not zeros), masks, two dtypes."""
    for name, dtype in (("web", np.uint16), ("code", np.uint32), ("masked", np.uint16)):
        local, remote = stores[name]
        assert remote.dtype == dtype
        assert remote.fingerprint == local.fingerprint
        assert np.asarray(local.tokens).any()
    assert stores["masked"][1].has_loss_mask
    assert not stores["web"][1].has_loss_mask
