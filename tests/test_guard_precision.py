"""MAT401 / MAT403 from the autocast state at each GEMM and from its part of the step: a GEMM kept
in fp32 on purpose (`torch.autocast(..., enabled=False)`) is not "no autocast", GEMMs that are a
sliver of the step's GEMM work are not reported, and MAT403 is dropped where its measured saving
is negligible. Recorded on CPU, read as if run on an sm_90 GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from matlint.diagnostics import Finding  # noqa: E402
from matlint.runtime_guard import guard  # noqa: E402
from matlint.runtime_guard.capture import autocast_state  # noqa: E402
from matlint.runtime_guard.checks import DeviceContext, negligible, run_checks  # noqa: E402

HOPPER = DeviceContext("cuda", (9, 0), tf32=False)


def recording(fn, steps=3):
    g = guard(json_path=None, report=False, estimate_savings=False, warmup=1, window=steps - 1, select=["MAT1"])
    with g:
        for _ in range(steps):
            fn()
            g.step()
    rec = g.recorder.rec
    rec.ops = {k._replace(device="cuda"): v for k, v in rec.ops.items()}
    rec.device_types = {"cuda"}
    return rec


def found(rec, code):
    return [f for f in run_checks(rec, ctx=HOPPER) if f.code == code]


class Rotary(nn.Module):
    """A model under bf16 autocast whose position GEMM is kept in fp32, as rotary embeddings do."""

    def __init__(self, d=128, how="off"):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.freqs = torch.randn(d, d)
        self.how = how

    def angles(self, x):
        return x.float() @ self.freqs  # <- the fp32 GEMM

    def forward(self, x):
        if self.how == "off":
            with torch.autocast("cpu", enabled=False):
                a = self.angles(x)
        else:
            a = self.angles(x)
        return self.body(x) + a


def test_autocast_state_is_read_at_the_op():
    assert autocast_state() == ""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_state() == "region"
        with torch.autocast("cpu", enabled=False):
            assert autocast_state() == "region"
    with torch.autocast("cpu", enabled=False):
        assert autocast_state() == "region"
    assert autocast_state() == ""


def test_gemm_kept_in_fp32_inside_autocast_is_not_no_autocast():
    model = Rotary(how="off")
    x = torch.randn(256, 128)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()

    rec = recording(step)
    fp32 = {k.amp for k in rec.ops if k.op in ("mm", "addmm") and k.sig[0][2] == torch.float32}
    bf16 = {k.amp for k in rec.ops if k.op in ("mm", "addmm") and k.sig[0][2] == torch.bfloat16}
    assert fp32 == {"region"} and bf16 == {"region"}
    assert found(rec, "MAT401") == []


def test_same_gemm_outside_the_autocast_region_is_reported():
    model = Rotary(d=512, how="outside")
    x = torch.randn(2048, 512)  # the fp32 GEMM: 1 GFLOP, more than autocast's casts would cost

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.body(x)
        (out.float() + model.angles(x)).sum().backward()

    [f] = found(recording(step), "MAT401")
    assert "outside the step's autocast region" in f.message
    # 1 of 6 equal GEMMs: 2 forward Linears, their backward (dW twice, dX once), the fp32 one
    assert f.evidence["share_of_gemm_flops"] == pytest.approx(1 / 6, abs=0.001)
    assert "fp32_on_purpose_per_step" not in f.evidence


def test_fp32_gemm_that_is_a_sliver_of_the_step_is_not_reported():
    big = nn.Linear(512, 512)
    small = nn.Linear(16, 4)
    x, y = torch.randn(512, 512), torch.randn(8, 16)

    def step(y=y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = big(x).float().sum()
        (out + small(y).sum()).backward()  # fp32, outside autocast, ~1e-5 of the GEMM FLOPs

    assert found(recording(step), "MAT401") == []
    # the same small GEMM as the whole step: too little work for bf16 to shorten the step
    assert found(recording(lambda: small(y).sum().backward()), "MAT401") == []


def test_fp32_gemms_of_a_small_model_are_not_reported_and_of_a_larger_one_are():
    """All of the step's GEMM work, but less than autocast's casts would cost even at a rate above
    any GPU's fp32 one: a step of a small model is bound by its launches, not its GEMMs."""
    small = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    x = torch.randn(128, 13)
    assert found(recording(lambda: small(x).sum().backward()), "MAT401") == []
    larger = nn.Linear(512, 512)
    y = torch.randn(2048, 512)  # 1 GFLOP a GEMM
    [f] = found(recording(lambda: larger(y).sum().backward()), "MAT401")
    assert "with no autocast" in f.message and f.evidence["share_of_gemm_flops"] == 1.0


def test_mat403_not_on_a_gemm_that_is_a_sliver_of_the_step():
    odd = nn.Linear(64, 100).bfloat16()
    big = nn.Linear(1024, 1024).bfloat16()
    x, xb = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
    assert found(recording(lambda: (odd(x), big(xb))), "MAT403") == []
    [f] = found(recording(lambda: odd(x)), "MAT403")
    assert "N=100" in f.message


def _finding(code, ms):
    return Finding(code=code, message="", filename="m.py", row=1, column=1, end_row=1, end_column=1,
                   estimated_savings_ms=ms)


@pytest.mark.parametrize("ms,step_ms,dropped", [(0.0001, None, True), (0.005, 100.0, True), (0.05, 10.0, True),
                                                (0.5, 10.0, False), (0.02, None, False), (None, 10.0, False)])
def test_mat403_with_a_negligible_measured_saving_is_dropped(ms, step_ms, dropped):
    assert negligible(_finding("MAT403", ms), step_ms) is dropped
    assert not negligible(_finding("MAT101", ms), step_ms)
