"""MAT503 at runtime: tensors a step makes on the host and copies to the device from one line, and
the timing of making them there instead. Imported only by the guard (needs torch).

Reported, as the static half reports them: a factory's fill or draw made on the host and moved
(`torch.ones(b, 1).to(device)`: make it on the device with `device=`), and Python values that are
the same at every upload (`torch.tensor([0.5, 0.5]).to(device)` each step: make it once). Quiet on
Python values that change from step to step (an environment's state, a batch assembled on the
host): the data comes from the host and has to be copied; on tensors made on the device; and on
copies into a buffer the program keeps (`buf.copy_(x)`)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import HOST_DATA
from matlint.runtime_guard.checks import dtype_str, finding, shape_str
from matlint.runtime_guard.registry import estimator, runtime_check

UPLOADS_MIN_PER_STEP = 0.25  # uploads a step from one line (a GAN's iteration holds two optimizer steps)
QUEUED_GEMM_SIZE = 1024      # the GEMMs queued around a timed upload: the GPU is busy when it syncs


class UploadEstimate(NamedTuple):
    kind: str          # "upload"
    shape: tuple
    dtype: str
    device: str
    per_step: float
    hoisted: bool      # the fix makes it once (same values each step), not on the device each step
    values: tuple = ()  # the Python values it is made from, when hoisted


@runtime_check("MAT503")
def check_uploads(rec, steps, ctx):
    for (site, module, origin, shape, dtype, device), upload in rec.uploads.items():
        per_step = upload.count / steps
        if per_step < UPLOADS_MIN_PER_STEP or upload.count < 2:
            continue  # made once in the window (a buffer set up lazily), or seldom
        constant = origin == HOST_DATA
        if constant and not upload.same_values:
            continue  # values from the host that change: data that has to be copied
        made = "from the same Python values" if constant else f"by `aten::{origin}`"
        fix = ("make it once before the loop and reuse it" if constant else
               f"make it on the device (`device=` on the factory, e.g. `torch.{origin}(..., device=...)`)")
        msg = (f"{per_step:g} tensor{'s' if per_step != 1 else ''} of {shape_str(shape)} per step made on the "
               f"host {made} and copied to the device from this line: {fix}")
        ev = {"per_step": round(per_step, 2), "module": module, "made_by": "python values" if constant else origin,
              "shapes": [shape_str(shape)], "dtypes": [dtype_str(dtype)], "device": device, "phase": "forward"}
        estimate = UploadEstimate("upload", shape, dtype_str(dtype), device, per_step, constant,
                                  upload.values if constant else ()) if device == "cuda" else None
        yield finding("MAT503", site, msg, ev, estimate)


@estimator("upload")
def estimate_upload(spec: UploadEstimate, budget):
    """A copy from pageable host memory (`.to(device)` without `non_blocking`) waits for the work
    queued on the stream before it and leaves the GPU idle until the host launches again: timed
    between two queued GEMMs, as it sits in a step, against the fix between the same two."""
    dtype = getattr(torch, spec.dtype)
    inputs = savings.Inputs(spec.device)
    a = inputs.tensor((QUEUED_GEMM_SIZE, QUEUED_GEMM_SIZE), torch.float32)
    b = inputs.tensor((QUEUED_GEMM_SIZE, QUEUED_GEMM_SIZE), torch.float32)

    def on_host():
        a @ b
        if spec.values:
            torch.tensor(spec.values, dtype=dtype).view(spec.shape).to(spec.device)
        else:
            torch.ones(spec.shape, dtype=dtype).to(spec.device)
        a @ b

    def fixed():
        a @ b
        if not spec.hoisted:
            torch.ones(spec.shape, dtype=dtype, device=spec.device)
        a @ b

    key = ("upload", spec.shape, spec.dtype, spec.device, spec.hoisted)
    t = savings.cached(key, lambda: savings.time_pair(on_host, fixed, spec.device, budget=budget))
    how = "nothing (made once)" if spec.hoisted else "the same fill made on the device"
    made = "tensor made from its Python values" if spec.values else "fill made"
    return t.scaled(spec.per_step), (f"timed a {shape_str(spec.shape)} {made} on the host and copied between two "
                                     f"queued GEMMs ({t.slow_ms:.3f} ms) against {how} between the same two "
                                     f"({t.fast_ms:.3f} ms) on this GPU")
