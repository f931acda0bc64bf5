"""`streambatch.hf.Trainer` at world size 2 on gloo: the one-process token mean, the plan's count, SIGKILL and resume.

One launch of two ranks (`hf_worker`, as subprocesses) trains every case: the
masked SFT corpus as windows and as packed rows, accumulation 2 and 3, each
with a batch that counts nothing, a rank whose rows are all masked, and a final
batch of one row (rank 1 has none).  The final weights equal a plain
one-process loop over the same global batches that divides by the counted
targets (1e-6 relative on every parameter's change; the same loop dividing by
every target position is 1e-2 away).  Then the kill run: SIGKILL on every rank
right after the checkpoint at step 3, resumed at world size 2 and at world size
1; both end where the uninterrupted run ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from streambatch.stages.chunk import part_share

from . import hf_worker
from .common import epoch, loss_sum, moved_error, one_process, tiny_llama

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6
TIMEOUT_S = 400


def launch(mode: str, world_size: int, out: Path, *extra: str, killed: bool = False) -> None:
    """Run *world_size* ranks of `hf_worker` as subprocesses; each must exit 0 (or by SIGKILL when *killed*)."""
    rendezvous = f"file://{out / f'rendezvous-{uuid.uuid4().hex}'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "tests.hf.hf_worker", mode]
    ranks = [
        subprocess.Popen([*command, str(r), str(world_size), rendezvous, str(out), *extra], cwd=ROOT, env=env)
        for r in range(world_size)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    assert codes == [-9 if killed else 0] * world_size


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf")
    launch("train", 2, out, killed=True)  # the cases, HF's own path, then the kill run (SIGKILL at its checkpoint)
    return out


def test_the_corpus_holds_every_hard_case() -> None:
    """A batch with no counted target, a rank whose rows are all masked, a last batch narrower than the world."""
    windows = epoch("windows")
    assert windows.batch(0).token_count == 0
    share0, share1 = (windows.batches(rank=r, world_size=2)[1] for r in range(2))
    assert share0.width > 0
    assert share0.token_count == 0 < share1.token_count
    for kind in ("windows", "packed"):
        assert epoch(kind).batch(len(epoch(kind)) - 1).width == 1


@pytest.mark.parametrize(("kind", "accumulation"), hf_worker.CASES)
def test_world_size_2_equals_the_one_process_token_mean(trained: Path, kind: str, accumulation: int) -> None:
    found = torch.load(trained / f"{kind}-{accumulation}.pt")
    expected = one_process(epoch(kind))
    assert moved_error(found, expected) <= TOLERANCE
    wrong = one_process(epoch(kind), denominator=lambda b: b.inputs.size)  # every target position counted
    assert moved_error(wrong, expected) > 1e-3  # so the check above can see a wrong denominator


@pytest.mark.parametrize(("kind", "accumulation"), hf_worker.CASES)
def test_every_micro_batch_carries_the_plan_count_and_nothing_is_gathered(trained: Path, kind: str, accumulation: int) -> None:
    name = f"{kind}-{accumulation}"
    reports = [json.loads((trained / f"report{r}.json").read_text())[name] for r in range(2)]
    whole = list(epoch(kind))
    for report in reports:
        assert report["loader"] == "RankLoader"  # the Trainer iterates the run's own loader, not an accelerate wrapper
        assert report["calls"] == {}  # no Python collective from the first step to the end of training
        assert [s["count"] for s in report["seen"]] == [max(b.token_count, 1) for b in whole]
        assert all(len(s["rows"]) == accumulation for s in report["seen"])
    for i, batch in enumerate(whole):  # each rank's share, by the share rule, split again into micro-batches
        for rank, report in enumerate(reports):
            micro = [len(range(*part_share(batch.width, rank, 2, k, accumulation))) for k in range(accumulation)]
            assert report["seen"][i]["rows"] == [max(m, 1) for m in micro]  # an empty one: one row that counts nothing
        assert sum(sum(r["seen"][i]["counted"]) for r in reports) == batch.token_count


@pytest.mark.parametrize(("kind", "accumulation"), hf_worker.CASES)
def test_eval_at_world_size_2_is_the_exact_token_mean(trained: Path, kind: str, accumulation: int) -> None:
    """Each rank sums the loss over its share of every batch; the sums are merged once; one division by the plan's count."""
    model = tiny_llama()
    model.load_state_dict(torch.load(trained / f"{kind}-{accumulation}.pt"))
    with torch.no_grad():
        total = sum(float(loss_sum(model, b)) for b in epoch("packed"))
    count = sum(b.token_count for b in epoch("packed"))
    for rank in range(2):
        found = json.loads((trained / f"report{rank}.json").read_text())[f"{kind}-{accumulation}"]["eval"]
        assert found["eval_tokens"] == count
        assert found["eval_loss"] == pytest.approx(total / count, rel=1e-6)  # (float32 loss sums, added in another order)


def test_the_counter_sees_hf_own_count_gather(trained: Path) -> None:
    """HF's own path gathers the label count every step: the counter that saw nothing above is not blind."""
    for rank in range(2):
        calls = json.loads((trained / f"hf_own{rank}.json").read_text())
        assert calls.get("all_gather", 0) + calls.get("all_gather_into_tensor", 0) >= 2


@pytest.mark.parametrize("world_size", [2, 1])
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_end(trained: Path, world_size: int) -> None:
    checkpoint = trained / "kill" / f"checkpoint-{hf_worker.KILL_AFTER}"
    assert (checkpoint / "streambatch_state.json").is_file()
    assert not (trained / "kill" / f"checkpoint-{hf_worker.KILL_AFTER + 1}").exists()  # killed right there
    out = trained / f"resume-{world_size}"
    out.mkdir()
    launch("resume", world_size, out, str(checkpoint))
    resumed, uninterrupted = torch.load(out / "resumed.pt"), torch.load(trained / "windows-2.pt")
    assert moved_error(resumed, uninterrupted) <= (0.0 if world_size == 2 else TOLERANCE)
