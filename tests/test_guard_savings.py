"""Honest savings: estimates come from alternating paired timings with an interval, are labelled
unreliable (and kept out of the table) when the interval is wide or reaches 0, and never exceed
the measured step time."""
from __future__ import annotations

import io
import json
import random
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from matlint.runtime_guard import guard  # noqa: E402
from matlint.runtime_guard import registry, savings  # noqa: E402
from matlint.runtime_guard.report import print_report  # noqa: E402
from matlint.runtime_guard.session import PLAIN_STEPS  # noqa: E402
from matlint.runtime_guard.slices import MAX_OBSERVATIONS, MAX_SLICES  # noqa: E402


def _inject(monkeypatch, kind, fn):
    """The estimator of `kind` replaced by `fn` (its registration's other declarations kept)."""
    estimators = registry.estimators()
    monkeypatch.setitem(estimators, kind, replace(estimators[kind], fn=fn))


def busy(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def test_a_clear_saving_is_measured_with_a_tight_interval():
    t = savings.time_pair(lambda: busy(2.0), lambda: busy(0.5), "cpu")
    assert t.saved_ms == pytest.approx(1.5, abs=0.2)
    assert t.lo_ms <= t.saved_ms <= t.hi_ms
    assert t.reliable


def test_a_saving_lost_in_noise_is_unreliable():
    rng = random.Random(0)
    t = savings.time_pair(lambda: busy(0.5 + rng.uniform(0, 2)), lambda: busy(0.5 + rng.uniform(0, 2)), "cpu",
                          max_s=0.3)
    assert abs(t.saved_ms) < 0.5  # equal on average, ±1 ms of noise per call
    assert not t.reliable


@pytest.mark.parametrize("max_s", [0.021, 0.023, 0.5])  # stops after 11 or 12 pairs, or when tight
def test_alternating_order_cancels_an_order_effect(monkeypatch, max_s):
    """Whichever function runs first in a pair pays 1 ms more (a cold cache, a clock ramp): timed in
    alternating order, two equal functions save nothing, wherever the timing stops. The clock is
    simulated (time passes only in the timed calls), so the test is deterministic."""
    now, calls = [0.0], []

    def clock(fn, device):
        fn()
        calls.append(1)
        ms = 1.5 if len(calls) % 2 else 0.5  # the first of each pair is slower
        now[0] += ms / 1e3
        return ms

    monkeypatch.setattr(savings, "_clock", clock)
    monkeypatch.setattr(savings, "perf_counter", lambda: now[0])
    t = savings.time_pair(savings.noop, savings.noop, "cpu", max_s=max_s)
    assert t.saved_ms == 0.0 and t.pairs % 2 == 0
    assert not t.reliable


@pytest.mark.parametrize("limit", ["max_s", "budget"])
def test_slow_calls_are_timed_within_the_time_allowed(limit):
    """Calls of 40 and 20 ms, 0.1 s allowed (by max_s or by what is left of the budget): fewer
    pairs than usual and fewer warm-up calls, not 3 warm-up calls each and MIN_PAIRS pairs (0.8 s)."""
    options = {"max_s": 0.1} if limit == "max_s" else {"budget": savings._Budget(0.1)}
    start = time.perf_counter()
    t = savings.time_pair(lambda: busy(40), lambda: busy(20), "cpu", **options)
    assert time.perf_counter() - start < 0.45
    assert 2 <= t.pairs < savings.MIN_PAIRS
    assert t.saved_ms == pytest.approx(20, abs=5)
    assert not t.reliable  # too few pairs for its interval to be one at ~95%


class SharedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, xs):
        return torch.stack([self.lin(x) for x in xs])


def train(g, steps=1 + MAX_SLICES * MAX_OBSERVATIONS + PLAIN_STEPS):  # the longest default window, then plain steps
    model = SharedLinear()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = [torch.randn(16, 64) for _ in range(12)]
    with g:
        for _ in range(steps):
            model(xs).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return g


def quiet(**options):
    return guard(**{"json_path": None, "report": False, **options})


def test_estimates_carry_an_interval_and_are_capped_by_the_plain_step_time():
    from torch.optim.optimizer import _global_optimizer_post_hooks

    g = train(quiet())
    step_ms, source = g.step_ms
    assert source == "plain" and len(g.plain_step_ms) == PLAIN_STEPS
    assert not _global_optimizer_post_hooks  # the hook left after timing the plain steps
    assert step_ms < max(g.observed_step_ms)  # the guard's observed steps are slower
    [f] = [f for f in g.findings if f.code == "MAT101"]
    lo, hi = f.evidence["estimate_interval_ms"]
    assert lo <= hi and isinstance(f.evidence["estimate_reliable"], bool)
    assert f.estimated_savings_ms <= step_ms


def test_an_estimate_above_the_step_is_capped(monkeypatch):
    _inject(monkeypatch, "loop", lambda spec, budget: ((1e6, 0.9e6, 1.1e6, 100), "injected"))
    g = train(quiet())
    step_ms, _ = g.step_ms
    [f] = [f for f in g.findings if f.code == "MAT101"]
    assert step_ms - 1e-4 < f.estimated_savings_ms <= step_ms  # the step, to 4 decimals, never above it
    assert f.evidence["estimate_capped_at_step_ms"] == round(step_ms, 4)
    assert f.evidence["estimate_interval_ms"] == [round(step_ms, 4)] * 2  # both ends capped too
    assert f.evidence["estimate_reliable"] is False  # a tight interval, but about a number it was not
    assert any("savings capped by the step time" in note for note in g.notes)


def test_an_unreliable_estimate_is_labelled_in_json_and_kept_out_of_the_table(monkeypatch, tmp_path):
    _inject(monkeypatch, "loop", lambda spec, budget: ((0.0123, -0.02, 0.05, 100), "injected"))
    path = tmp_path / "runtime.json"
    g = train(quiet(json_path=str(path)))
    [entry] = [e for e in json.loads(path.read_text()) if e["code"] == "MAT101"]
    assert entry["estimated_savings_ms"] == 0.0123 and entry["evidence"]["estimate_reliable"] is False
    from rich.console import Console

    out = io.StringIO()
    print_report(g, Console(file=out, width=200))
    text = out.getvalue()
    assert "unsure" in text and "0.012" not in text


def _finding_with_spec(code: str, kind: str):
    from matlint.diagnostics import Finding

    f = Finding(code, "m", "t.py", 1, 1, 1, 2, evidence={})
    f.extra["estimate"] = SimpleNamespace(kind=kind)
    return f


def test_a_kernel_time_only_saving_is_capped_by_how_long_the_host_waited_for_the_gpu(monkeypatch):
    """bf16 GEMMs shorten kernels, not the host's work: a step whose host waited 2 ms for the GPU
    saves at most 2 ms, whatever the GEMMs alone would; a fix that also saves launches is not
    capped so."""
    _inject(monkeypatch, "bf16", lambda spec, budget: ((27.0, 25.0, 29.0, 100), "injected"))
    _inject(monkeypatch, "loop", lambda spec, budget: ((6.0, 5.5, 6.5, 100), "injected"))
    bf16, loop = _finding_with_spec("MAT401", "bf16"), _finding_with_spec("MAT101", "loop")
    savings.estimate([bf16, loop], step_ms=60.0, gpu_wait_ms=2.0)
    assert bf16.estimated_savings_ms == 2.0 and bf16.evidence["estimate_capped_at_gpu_wait_ms"] == 2.0
    assert bf16.evidence["estimate_reliable"] is False
    assert loop.estimated_savings_ms == 6.0 and "estimate_capped_at_gpu_wait_ms" not in loop.evidence


def test_where_the_host_bounds_the_step_the_casts_a_fix_adds_are_taken_off(monkeypatch):
    """A host-bound step (the GPU-wait cap binds) is lengthened by every kernel the fix adds: 40
    casts at 0.01 ms each take 0.4 ms off a 2 ms cap; 400 make the step slower, which saves 0
    and is negligible. Where the GPU bounds the step, the casts hide behind it."""
    from matlint.runtime_guard.checks import negligible

    _inject(monkeypatch, "bf16", lambda spec, budget: ((27.0, 25.0, 29.0, 100), "injected"))
    monkeypatch.setattr(savings, "launch_ms", lambda device: 0.01)
    few, many, gpu_bound = (_finding_with_spec("MAT401", "bf16") for _ in range(3))
    few.extra["estimate"].added_launches = 40
    many.extra["estimate"].added_launches = 400
    gpu_bound.extra["estimate"].added_launches = 400
    savings.estimate([few, many], step_ms=60.0, gpu_wait_ms=2.0)
    assert few.estimated_savings_ms == 1.6 and few.evidence["estimate_less_added_launches_ms"] == 0.4
    assert few.evidence["estimate_interval_ms"] == [1.6, 1.6]
    assert many.estimated_savings_ms == 0.0 and negligible(many, step_ms=60.0)
    savings.estimate([gpu_bound], step_ms=60.0, gpu_wait_ms=40.0)
    assert gpu_bound.estimated_savings_ms == 27.0 and "estimate_less_added_launches_ms" not in gpu_bound.evidence


def test_the_host_time_of_one_launch_is_measured_once_and_small():
    first = savings.launch_ms("cpu")
    assert 0 < first < 1.0 and savings.launch_ms("cpu") == first


def test_mat401_is_negligible_where_the_host_bounds_the_step():
    from matlint.runtime_guard.checks import negligible

    host_bound = _finding_with_spec("MAT401", "bf16")
    host_bound.estimated_savings_ms = 0.2
    assert negligible(host_bound, step_ms=50.0)  # under 1% of the step
    gpu_bound = _finding_with_spec("MAT401", "bf16")
    gpu_bound.estimated_savings_ms = 9.0
    assert not negligible(gpu_bound, step_ms=60.0)


def test_plain_steps_record_how_long_the_host_waited():
    g = train(quiet())
    assert len(g.plain_wait_ms) == len(g.plain_step_ms) == PLAIN_STEPS
    assert all(0 <= wait <= step for wait, step in zip(g.plain_wait_ms, g.plain_step_ms))
    assert g.gpu_wait_ms is not None


def test_a_lines_findings_in_several_modules_merge_with_their_savings_capped_as_each_was():
    """Twelve layers' padding findings at one line: one finding, savings summed, and as padding only
    shortens kernels, the sum capped by the host's wait for the GPU as each one was."""
    from matlint.diagnostics import Finding
    from matlint.rules.mat403_gemm_dim_not_multiple_of_8.runtime import PadEstimate
    from matlint.runtime_guard.checks import merge_modules

    def layer(i):
        f = Finding("MAT403", "bfloat16 GEMM with N=100 (not multiples of 8): pad it", "t.py", 7, 1, 7, 9,
                    evidence={"module": f"blocks.{i}", "per_step": 3, "estimate_interval_ms": [0.2, 0.4],
                              "estimate_reliable": True}, estimated_savings_ms=0.3)
        f.extra["estimate"] = PadEstimate("pad", ())
        return f

    other = Finding("MAT403", "bfloat16 GEMM with N=100 (not multiples of 8): pad it", "t.py", 9, 1, 9, 9,
                    evidence={"module": "head"}, estimated_savings_ms=0.1)
    [merged, kept] = merge_modules([layer(i) for i in range(12)] + [other], step_ms=50.0)
    assert merged.estimated_savings_ms == 3.6 and merged.evidence["per_step"] == 36
    assert merged.evidence["module"] == sorted(f"blocks.{i}" for i in range(12))
    assert merged.message == "bfloat16 GEMM with N=100 (not multiples of 8), in 12 modules: pad it"
    assert merged.evidence["estimate_interval_ms"] == [2.4, 4.8] and merged.evidence["estimate_reliable"]
    assert kept is other
    [capped, _] = merge_modules([layer(i) for i in range(12)] + [other], step_ms=50.0, gpu_wait_ms=1.5)
    assert capped.estimated_savings_ms == 1.5 and capped.evidence["estimate_capped_at_gpu_wait_ms"] == 1.5
    assert capped.evidence["estimate_interval_ms"] == [1.5, 1.5] and not capped.evidence["estimate_reliable"]
