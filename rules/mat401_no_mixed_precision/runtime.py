"""MAT401 at runtime: fp32 GEMMs outside autocast on a tensor-core GPU with TF32 off, and the
timing of those GEMMs in bf16. Imported only by the guard (needs torch)."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import GEMM_OPS
from matlint.runtime_guard.checks import finding, gemm_flops, gemm_operands, gemm_total, gemm_weight, kernel_share
from matlint.runtime_guard.registry import estimator, runtime_check

PRECISION_MIN_SHARE = 0.05   # fp32 GEMMs outside autocast below this part of the step's GEMM work: quiet
# fp32 GEMM work a step too small for bf16 to shorten it: even at FP32_TFLOPS_BOUND (above any GPU's fp32
# rate, so the time is a lower bound) the GEMMs take less than the cast kernels autocast would add, one of
# CAST_LAUNCH_US at least per GEMM (its weight's)
FP32_TFLOPS_BOUND = 100.0
CAST_LAUNCH_US = 2.0


class Bf16Gemm(NamedTuple):
    op: str
    sig: tuple           # the recorded signature: (shape, stride, dtype) per operand
    per_step: float


class Bf16Estimate(NamedTuple):
    kind: str            # "bf16"
    gemms: list          # [Bf16Gemm]: the fp32 GEMMs, timed against bf16 ones
    added_launches: int  # the casts autocast adds per step, at least: two per forward GEMM (input, weight)


def _not_reported(gpu_wait_ms, step_ms) -> str:
    """Why a MAT401 finding with a negligible measured saving is dropped."""
    why = (f"a step's host waited only {gpu_wait_ms:.3f} ms of {step_ms:.3f} ms for the GPU"
           if gpu_wait_ms is not None and step_ms is not None else "the measured saving is negligible")
    return (f"MAT401 not reported: fp32 GEMMs ran, but {why}, so bf16 GEMMs would not shorten the "
            f"step (autocast's casts can lengthen it); the host's own work bounds it: larger "
            f"batches, CUDA graphs or torch.compile come first")


@runtime_check("MAT401", needs_gpu=True, drop_negligible=True, dropped_note=_not_reported)
def check_precision(rec, steps, ctx):
    """fp32 GEMMs run outside any autocast region, on a tensor-core GPU with TF32 off, when they are a
    real part of the step's GEMM work. fp32 GEMMs inside an autocast region (one turned off with
    enabled=False: kept in fp32 on purpose) are left alone."""
    if not ctx.tensor_cores or ctx.tf32:
        return
    fp32 = [(k, s) for k, s in rec.ops.items()
            if k.op in GEMM_OPS and k.device == "cuda" and gemm_operands(k)[0][2] == torch.float32]
    plain = [(k, s) for k, s in fp32 if k.amp == ""]
    if not plain:
        return
    total = gemm_total(rec, steps)
    share = sum(gemm_weight(k, s, steps, rec) for k, s in plain) / total if total else 1.0
    if share < PRECISION_MIN_SHARE:
        return
    by_site = defaultdict(float)
    for k, s in plain:
        by_site[k.site] += gemm_flops(k) * s.count / steps
    top_site = max(by_site, key=by_site.get)
    total_flops = sum(by_site.values())
    count = sum(s.count for _, s in plain) / steps
    if total_flops / (FP32_TFLOPS_BOUND * 1e6) < count * CAST_LAUNCH_US:
        return  # a small model's step: its launches bound it, and autocast's casts would lengthen it
    autocast_elsewhere = any(k.amp and gemm_operands(k)[0][2] in (torch.bfloat16, torch.float16)
                             for k in rec.ops if k.op in GEMM_OPS)
    where = "outside the step's autocast region" if autocast_elsewhere else "with no autocast"
    measure = "kernel time" if rec.profiled and rec.kernel_us_total > 0 else "FLOPs"
    msg = (f"{count:g} fp32 GEMMs per step ({total_flops / 1e9:.3g} GFLOP, {share:.0%} of the step's GEMM "
           f"{measure}) {where} on a tensor-core GPU (sm_{ctx.capability[0]}{ctx.capability[1]}) with TF32 off: "
           f"run them under torch.autocast('cuda', dtype=torch.bfloat16) or "
           f"torch.set_float32_matmul_precision('high')")
    ev = {"per_step": round(count, 2), "gflop_per_step": round(total_flops / 1e9, 3), "device": "cuda",
          "share_of_gemm_" + ("time" if measure == "kernel time" else "flops"): round(share, 4),
          "top_sites": [{"site": str(s), "gflop": round(f / 1e9, 3)}
                        for s, f in sorted(by_site.items(), key=lambda kv: -kv[1])[:5]],
          "phase": "forward+backward" if any(k.backward for k, _ in plain) else "forward"}
    kept = sum(s.count for k, s in fp32 if k.amp) / steps
    if kept:
        ev["fp32_on_purpose_per_step"] = round(kept, 2)  # in autocast(enabled=False) regions: not counted
    kshare = kernel_share([s for _, s in plain], rec)
    if kshare is not None:
        ev["share_of_kernel_time"] = round(kshare, 4)
    gemms = [Bf16Gemm(k.op, k.sig, s.count / steps) for k, s in plain]
    casts = round(2 * sum(s.count for k, s in plain if not k.backward) / steps)
    yield finding("MAT401", top_site, msg, ev, Bf16Estimate("bf16", gemms, casts))


def _replay_gemm(op: str, sig, dtype, inputs: savings.Inputs):
    tensors = []
    for shape, stride, _ in sig:
        # keep the layout; a zero or overlapping stride would alias, so densify those
        dense = all(s > 0 for s in stride)
        tensors.append(inputs.tensor(shape, dtype, stride if dense else None))
    fn = getattr(torch.ops.aten, op).default
    return lambda: fn(*tensors)


def _flops(op, sig):
    a, b = (sig[1], sig[2]) if op in ("addmm", "baddbmm", "addbmm") else (sig[0], sig[1])
    return 2.0 * math.prod(a[0]) * b[0][-1]


@estimator("bf16", kernel_time_only=True)
def estimate_bf16(spec: Bf16Estimate, budget):
    gemms = spec.gemms
    device = "cuda"
    inputs = savings.Inputs(device)
    saved = [0.0, 0.0, 0.0]
    pairs = savings.MAX_PAIRS
    timed = 0
    total = sum(g.per_step for g in gemms)
    covered = 0.0
    for op, sig, per_step in sorted(gemms, key=lambda g: -g.per_step * _flops(g.op, g.sig)):
        if not budget.left:
            break
        if not all(isinstance(s[0], torch.Size) for s in sig):
            continue
        key = ("bf16", op, sig)

        def compute():
            return savings.time_pair(_replay_gemm(op, sig, torch.float32, inputs),
                                     _replay_gemm(op, sig, torch.bfloat16, inputs), device, budget=budget)

        t = savings.cached(key, compute)
        saved = [total_ms + part for total_ms, part in zip(saved, t.scaled(per_step))]
        pairs = min(pairs, t.pairs)
        covered += per_step
        timed += 1
    scale = total / covered if covered else 0.0
    method = (f"timed {timed} distinct fp32 GEMM shapes against bf16 on this GPU "
              f"({covered:g} of {total:g} GEMMs per step; the rest scaled alike); GEMMs only")
    return tuple(v * scale for v in saved) + (pairs,), method
