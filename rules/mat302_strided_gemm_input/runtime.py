"""MAT302 at runtime: GEMM operands that cuBLAS (or matmul) copies because of their layout, and
the timing of that copy. Imported only by the guard (needs torch)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import GEMM_OPS
from matlint.runtime_guard.checks import (common_evidence, cublas_copies, dtype_str, finding, gemm_operands,
                                          attention_sites, shape_str)
from matlint.runtime_guard.registry import estimator, runtime_check


class CopyEstimate(NamedTuple):
    kind: str            # "copy"
    shape: tuple
    stride: tuple
    dtype: str
    device: str
    per_step: float      # copies per step


@runtime_check("MAT302")
def check_strided_gemm(rec, steps, ctx):
    at_attention = attention_sites(rec)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or stat.compiled or key.site in at_attention:
            continue
        for which, operand in zip(("first", "second"), gemm_operands(key)):
            shape, stride, dtype = operand
            if not cublas_copies(shape, stride):
                continue
            per_step = stat.count / steps
            msg = (f"{key.qualname}'s {which} operand {shape_str(shape)} has strides {list(stride)}, no unit "
                   f"stride in its last two dims: it is copied before every GEMM ({per_step:g}x per step); "
                   f"keep the layout the GEMM wants (make it contiguous once, outside the loop)")
            ev = common_evidence(key, per_step, [stat], rec)
            ev["copied_by"] = "cuBLAS (prepare_matrix_for_cublas)" if key.device == "cuda" else "the BLAS call"
            yield finding("MAT302", key.site, msg, ev,
                          CopyEstimate("copy", shape, stride, dtype_str(dtype), key.device, per_step))
    for (site, module, shape, stride, dtype, gemm), count in rec.layout_copies.items():
        if site in at_attention:
            continue
        per_step = count / steps
        if gemm in ("bmm", "baddbmm"):
            msg = (f"matmul copied a {shape_str(shape)} operand with strides {list(stride)} (clone before bmm) "
                   f"{per_step:g}x per step: produce it in the layout matmul wants, or permute the other operand")
            copied_by = "matmul (aten::clone before bmm)"
        else:
            msg = (f"a {shape_str(shape)} operand with strides {list(stride)} was copied to fold its leading dims "
                   f"into one GEMM ({per_step:g}x per step): its last dim is in place, only the leading dims are "
                   f"permuted; apply the layer (or matmul) before the permute and permute its output instead")
            copied_by = f"matmul / linear (aten::clone before {gemm})"
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward", "shapes": [shape_str(shape)],
              "strides": [list(stride)], "dtypes": [dtype_str(dtype)], "copied_by": copied_by}
        device = "cuda" if ctx.device_type == "cuda" else "cpu"
        yield finding("MAT302", site, msg, ev, CopyEstimate("copy", shape, stride, dtype_str(dtype), device, per_step))


@estimator("copy")
def estimate_copy(spec: CopyEstimate, budget):
    shape, stride, device = spec.shape, spec.stride, spec.device
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    inputs = savings.Inputs(device)
    key = ("copy", shape, stride, dt, device)

    def compute():
        if all(s > 0 for s in stride):
            storage = 1 + sum((d - 1) * s for d, s in zip(shape, stride))
            source = torch.as_strided(inputs.tensor((storage,), dt), shape, stride)
        else:
            source = inputs.tensor(shape, dt).t() if len(shape) == 2 else inputs.tensor(shape, dt)
        return savings.time_pair(lambda: source.clone(memory_format=torch.contiguous_format), savings.noop, device,
                                 budget=budget)

    t = savings.cached(key, compute)
    return t.scaled(spec.per_step), f"timed the forced copy ({t.saved_ms:.4f} ms) on {device}"
