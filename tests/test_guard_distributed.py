"""The guard under torch.distributed: two ranks on the CPU (gloo) under `torchrun`, with DDP and
FSDP2 (`fully_shard`). Each rank observes its own steps; rank 0 prints one merged report (a finding
of every rank once, with `ranks 0-1`; a finding of some ranks with their ranks) and writes the
merged JSON; rank 1 prints nothing; nothing hangs when the ranks differ, raise, or one never
reports; the wrappers' own ops are not recorded; the training is the same as without the guard."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from matlint.runtime_guard.ranks import RankReport, merge_findings, merge_lines, rank_label  # noqa: E402

FIXTURES = Path(__file__).parent / "guard_fixtures"
SCRIPT = FIXTURES / "distributed_steps.py"
TIMEOUT_S = 40  # a hang fails the test instead of stalling the suite


def torchrun(*args, cwd):
    # The ranks run on the CPU: with a GPU visible, FSDP2 would put rank 1 on a second GPU.
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    proc = torchrun(SCRIPT, out, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def line_of(text: str, path: Path = SCRIPT) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


EVERY_RANK = line_of("# every rank")
RANK_1_ONLY = line_of("# rank 1 only")
UNEVEN = line_of("for _ in range(3)")


def report(out, name, rank=0) -> str:
    """What the rank printed, its lines joined (the report wraps them at the console's width)."""
    return " ".join((out / f"{name}.rank{rank}.txt").read_text().split())


def findings(out, name) -> list:
    return [(f["code"], f["location"]["row"], f["ranks"]) for f in json.loads((out / f"{name}.json").read_text())]


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_one_merged_report_on_rank_0(out, kind):
    assert findings(out, kind) == [("MAT502", EVERY_RANK, [0, 1]), ("MAT502", RANK_1_ONLY, [1])]
    text = report(out, kind)
    assert text.startswith("matlint guard, 2 ranks: rank 0: 2 step(s) observed")
    assert text.count("MAT502 host-sync-in-loop") == 2
    assert text.index(f"distributed_steps.py:{EVERY_RANK}") < text.index("ranks 0-1, 2 per step") \
        < text.index(f"distributed_steps.py:{RANK_1_ONLY}") < text.index("rank 1, 2 per step")
    assert report(out, kind, rank=1) == ""  # rank 0 reports for it
    assert not list(out.glob(f"{kind}.rank*.json"))


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_wrapper_ops_are_not_recorded_and_training_is_unchanged(out, kind):
    """DDP's buffer broadcast (cat, broadcast_, copy_) and FSDP2's all-gathers (all_gather_copy_in,
    _allgather_base_, split_with_sizes_copy) are the wrappers' work: each rank records the ops the
    unwrapped model runs, no more."""
    for rank in (0, 1):
        seen = json.loads((out / f"{kind}.seen.rank{rank}.json").read_text())
        assert seen["ops"] == seen["plain_ops"]
        assert not [op for op in seen["ops"] if op.startswith(("c10d", "fsdp"))]
        assert seen["parameters_equal"]  # bitwise, against the same training without the guard


def test_each_rank_reports_on_its_own_when_asked(out):
    assert report(out, "each").startswith("matlint guard, rank 0 of 2:")
    assert report(out, "each", rank=1).startswith("matlint guard, rank 1 of 2:")
    assert f"distributed_steps.py:{RANK_1_ONLY}" in report(out, "each", rank=1)
    assert f"distributed_steps.py:{RANK_1_ONLY}" not in report(out, "each")
    assert [f["location"]["row"] for f in json.loads((out / "each.rank1.json").read_text())] == [EVERY_RANK, RANK_1_ONLY]
    assert not (out / "each.json").exists()


def test_ranks_with_different_step_counts(out):
    text = report(out, "uneven")
    assert "rank 0: 3 step(s) observed" in text and "rank 1: 6 step(s) observed" in text
    assert findings(out, "uneven") == [("MAT502", UNEVEN, [1])]


@pytest.mark.parametrize("name,raised", [("rank1_raises", 1), ("rank0_raises", 0)])
def test_a_rank_that_raises_inside_the_window_still_reports(out, name, raised):
    text = report(out, name)
    assert re.search(rf"rank {raised}: [^;]* \(left with an exception\)", text)
    assert text.count("left with an exception") == 1
    assert findings(out, name) == [("MAT502", UNEVEN, [1])]
    assert report(out, name, rank=1) == ""


def test_a_rank_that_never_reports_is_named_after_the_timeout(out):
    text = report(out, "rank0_only")
    assert "rank 1 sent no report within 1 s" in text
    assert findings(out, "rank0_only") == []


def test_matlint_run_under_torchrun_merges_after_the_group_is_destroyed(tmp_path):
    script = FIXTURES / "distributed_script.py"
    proc = torchrun("-m", "matlint", "run", "--no-estimate", script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    merged = json.loads((tmp_path / ".matlint" / "runtime.json").read_text())
    assert [(f["location"]["row"], f["ranks"]) for f in merged] == [(line_of("# rank 1 only", script), [1])]
    assert proc.stderr.count("matlint guard, 2 ranks") == 1


def test_rank_label():
    assert rank_label([1]) == "rank 1"
    assert rank_label([1, 0]) == "ranks 0-1"
    assert rank_label([0, 2, 3, 5]) == "ranks 0,2-3,5"


def test_merge_keeps_findings_with_other_counts_apart():
    from matlint.diagnostics import Finding

    def f(per_step, rank, saving=None):
        return Finding("MAT502", f"{per_step} host syncs per step", "t.py", 3, 1, 3, 9,
                       evidence={"per_step": per_step}, estimated_savings_ms=saving)

    reports = [RankReport(0, 2, 10, [f(2, 0, 0.5)], notes=["a", "b"]),
               RankReport(1, 2, 10, [f(2, 1, 0.7), f(3, 1)], notes=["a"])]
    merged = merge_findings(reports)
    assert [(m.message, m.extra["ranks"]) for m in merged] == [("2 host syncs per step", [0, 1]),
                                                               ("3 host syncs per step", [1])]
    assert merged[0].extra["savings_by_rank"] == {0: 0.5, 1: 0.7}
    assert merge_lines(reports, "notes") == ["a", "rank 0: b"]


def test_an_op_from_a_thread_without_python_outside_backward_is_not_recorded():
    """DDP's reducer copies the reduced buckets into each `.grad` at the end of a backward pass on
    autograd's device thread: no Python frame, no autograd node, no line of the user's code."""
    from matlint.runtime_guard.capture import Recorder

    recorder = Recorder(profile_cuda=True)
    x = torch.ones(3)
    add = torch.ops.aten.add.Tensor
    recorder.record(add, (x, x), {}, x + x, None, node=None)
    assert not recorder.rec.ops
    recorder.record(add, (x, x), {}, x + x, sys._getframe(), node=None)
    assert [key.site.function for key in recorder.rec.ops] == [
        "test_an_op_from_a_thread_without_python_outside_backward_is_not_recorded"]
