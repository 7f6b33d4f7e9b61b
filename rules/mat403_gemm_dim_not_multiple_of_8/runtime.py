"""MAT403 at runtime: half-precision GEMMs with dims that are not multiples of 8, and the timing
of the GEMM at padded dims. Imported only by the guard (needs torch)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import GEMM_OPS
from matlint.runtime_guard.checks import (common_evidence, dtype_str, finding, gemm_mnk, gemm_operands, gemm_total,
                                          gemm_weight)
from matlint.runtime_guard.registry import estimator, runtime_check

PAD_MIN_SHARE = 0.01         # a GEMM below this part of the step's GEMM work: quiet


class PadEstimate(NamedTuple):
    kind: str            # "pad"
    op: str
    sig: tuple           # the recorded signature: (shape, stride, dtype) per operand
    per_step: float


@runtime_check("MAT403", needs_gpu=True, drop_negligible=True)
def check_dims_multiple_of_8(rec, steps, ctx):
    if not ctx.tensor_cores:
        return
    total = gemm_total(rec, steps)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or key.device != "cuda":
            continue
        a, _ = gemm_operands(key)
        if a[2] not in (torch.bfloat16, torch.float16):
            continue
        m, n, k = gemm_mnk(key)
        bad = {name: d for name, d in (("M", m), ("N", n), ("K", k)) if d % 8}
        if not bad or max(m, n, k) < 64:
            continue
        if total and gemm_weight(key, stat, steps, rec) / total < PAD_MIN_SHARE:
            continue  # too small a part of the step's GEMM work for padding to matter
        dims = ", ".join(f"{name}={d}" for name, d in bad.items())
        msg = (f"{dtype_str(a[2])} GEMM with {dims} (not multiples of 8): tensor cores run it slowly; pad "
               f"the dimension to a multiple of 8 (vocab, hidden or head size)")
        per_step = stat.count / steps
        yield finding("MAT403", key.site, msg, common_evidence(key, per_step, [stat], rec),
                      PadEstimate("pad", key.op, key.sig, per_step))


def _replay_dense(op, sig, inputs):
    tensors = [inputs.tensor(shape, dtype) for shape, _, dtype in sig]
    fn = getattr(torch.ops.aten, op).default
    return lambda: fn(*tensors)


@estimator("pad", kernel_time_only=True)
def estimate_pad(spec: PadEstimate, budget):
    op, sig = spec.op, spec.sig
    device = "cuda"
    inputs = savings.Inputs(device)

    def pad(shape):
        return tuple(shape[:-2]) + tuple(-(-d // 8) * 8 for d in shape[-2:])

    padded = tuple((pad(s[0]), None, s[2]) for s in sig)
    key = ("pad", op, sig)

    def compute():
        plain = [(s[0], None, s[2]) for s in sig]
        return savings.time_pair(_replay_dense(op, plain, inputs), _replay_dense(op, padded, inputs), device,
                                 budget=budget)

    t = savings.cached(key, compute)
    t_obs, t_pad = t.slow_ms, t.fast_ms
    return t.scaled(spec.per_step), f"timed the GEMM at the observed ({t_obs:.3f} ms) and padded ({t_pad:.3f} ms) dims"
