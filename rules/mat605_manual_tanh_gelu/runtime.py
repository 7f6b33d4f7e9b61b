"""MAT605 at run time: a `tanh` of sqrt(2 / pi) * (x + 0.044715 * x ** 3), computed every step from
a power or a square of x (the recorder follows the arithmetic as polynomials of x), and the
timing of `F.gelu(x, approximate="tanh")` against the formula on the same tensor. Imported only by
the guard (needs torch)."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from matlint.runtime_guard import savings
from matlint.runtime_guard.checks import dtype_str, finding, shape_str
from matlint.runtime_guard.registry import estimator, runtime_check


class GeluEstimate(NamedTuple):
    kind: str            # "tanh_gelu"
    shape: tuple
    dtype: str
    device: str
    grad: bool           # the formula ran with autograd recording: its backward is timed too
    autocast: bool       # ... inside an autocast region (which runs its power in float32)
    per_step: float


@runtime_check("MAT605")
def check_tanh_gelu(rec, steps, ctx):
    for (site, module, shape, dtype, grad, autocast), count in rec.tanh_gelu.items():
        per_step = count / steps
        msg = (f"the tanh approximation of GELU written out ({per_step:g}x per step, on a {shape_str(shape)} "
               f"{dtype_str(dtype)} tensor): about nine element-wise kernels forward, each reading and writing "
               f"the whole activation; use `F.gelu(x, approximate=\"tanh\")` (or `nn.GELU(approximate=\"tanh\")`), "
               f"one kernel")
        ev = {"per_step": round(per_step, 2), "module": module, "phase": "forward", "shapes": [shape_str(shape)],
              "dtypes": [dtype_str(dtype)], "backward": grad, "autocast": autocast}
        device = "cuda" if ctx.device_type == "cuda" else "cpu"
        yield finding("MAT605", site, msg, ev, GeluEstimate("tanh_gelu", shape, dtype_str(dtype), device, grad,
                                                            autocast, per_step))


def _written_out(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@estimator("tanh_gelu")
def estimate_tanh_gelu(spec: GeluEstimate, budget):
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    inputs = savings.Inputs(spec.device)
    key = ("tanh_gelu", spec.shape, dt, spec.device, spec.grad, spec.autocast)
    # x in half precision inside a region: the region was for that dtype (an fp32 x runs the same either way)
    region = spec.autocast and dt in (torch.bfloat16, torch.float16)

    def compute():
        x = inputs.tensor(spec.shape, dt, requires_grad=spec.grad)
        grad = inputs.tensor(spec.shape, dt)

        def run(fn):
            def call():
                with torch.autocast(spec.device, dtype=dt, enabled=region), torch.set_grad_enabled(spec.grad):
                    y = fn(x)
                if spec.grad:
                    torch.autograd.grad(y, x, grad.to(y.dtype))
            return call

        return savings.time_pair(run(_written_out), run(lambda t: F.gelu(t, approximate="tanh")), spec.device,
                                 budget=budget)

    t = savings.cached(key, compute)
    what = ("forward and backward" if spec.grad else "forward") + (" under autocast" if region else "")
    return t.scaled(spec.per_step), (f"timed the formula ({t.slow_ms:.4f} ms) against F.gelu(approximate='tanh') "
                                     f"({t.fast_ms:.4f} ms), {what}, on {spec.device}")
