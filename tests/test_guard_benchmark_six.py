"""Smoke test of benchmarks/guard_overhead_six.py on CPU: one command, one table."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
from matlint.runtime_guard.slices import MAX_OBSERVATIONS, MAX_SLICES  # noqa: E402
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_six_model_benchmark_prints_one_table(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "guard_overhead_six.py"), "--quick", "--models", "mlp",
           "--runs", "2", "--steps", "12", "--no-mechanisms", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "guard_overhead_six_table.md").read_text()
    assert "| small MLP 256-256-10 (B64), bf16 |" in table and "| small MLP 256-256-10 (B64), fp32 |" in table
    res = json.loads((tmp_path / "guard_overhead_six.json").read_text())
    for row in res["rows"].values():
        assert len(row["runs"]) == 2 and row["errors"] == []
        assert row["bitwise"]["plain_vs_guard"]  # the guard never changes what the model computes
        # the default window: the warm-up step whole, then slices of the steps after it, one a step
        # (how many the cost decides; an optimizer's step with its state made is not observed again)
        assert all(2 <= n <= 1 + MAX_SLICES * MAX_OBSERVATIONS for n in row["observed_steps"])


def test_guard_cost_is_the_observed_steps_excess_over_the_same_runs_later_steps():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import guard_overhead_six as six
    finally:
        sys.path.pop(0)
    # two observed steps (3 and 2 ms) over after-window steps of 1 ms: 3 ms more than 6 plain steps
    assert six.guard_cost([3.0, 2.0, 1.0, 1.2, 0.8, 1.0], [True, True, False, False, False, False]) == 1.5
    assert six.guard_cost([3.0, 2.0], [True, True]) is None  # nothing after the window to compare with
