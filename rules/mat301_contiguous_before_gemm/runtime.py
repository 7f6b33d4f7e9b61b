"""MAT301 at runtime: a copy the user made (`.contiguous()`, `.clone()`) of a tensor that a GEMM
on another line then reads, where the GEMM would have read the tensor as it was: the copy only
costs. Imported only by the guard (needs torch)."""
from __future__ import annotations

from matlint.rules.mat302_strided_gemm_input.runtime import CopyEstimate  # the copy's estimator lives with MAT302
from matlint.runtime_guard.checks import cublas_copies, dtype_str, finding, shape_str
from matlint.runtime_guard.registry import runtime_check


def _batch_dims_fold(shape, stride) -> bool:
    """The dims before the last two are laid out one after another (a GEMM folds them into one
    batch dim without a copy)."""
    batch = len(shape) - 2
    return all(shape[i] == 1 or stride[i] == stride[i + 1] * shape[i + 1] for i in range(batch - 1)) and (
        batch < 1 or shape[batch - 1] == 1 or stride[batch - 1] == max(stride[-2] * shape[-2], stride[-1] * shape[-1]))


@runtime_check("MAT301")
def check_explicit_copies(rec, steps, ctx):
    for (site, module, shape, stride, dtype, gemm_site), count in rec.explicit_copies.items():
        if cublas_copies(shape, stride) or not _batch_dims_fold(shape, stride):
            continue  # a layout the GEMM would copy itself: the copy is the right fix (MAT302's)
        per_step = count / steps
        where = "on this line" if gemm_site == site else f"on line {gemm_site.lineno}"
        msg = (f"this copy of a {shape_str(shape)} tensor with strides {list(stride)} ({per_step:g}x per step) "
               f"feeds the GEMM {where}, which reads that layout (a transpose of the last two "
               f"dims) as it is: drop the `.contiguous()` where the GEMM is the copy's only reader")
        device = "cuda" if ctx.device_type == "cuda" else "cpu"
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward", "shapes": [shape_str(shape)],
              "strides": [list(stride)], "dtypes": [dtype_str(dtype)], "gemm": str(gemm_site)}
        yield finding("MAT301", site, msg, ev, CopyEstimate("copy", shape, stride, dtype_str(dtype), device, per_step))
