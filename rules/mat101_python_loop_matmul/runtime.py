"""MAT101 at runtime: same-shape GEMMs issued one per item from a Python loop, and the timing of
one batched call against them. Imported only by the guard (needs torch)."""
from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import GEMM_OPS, _column_major
from matlint.runtime_guard.checks import common_evidence, dtype_str, finding, gemm_operands, shape_str
from matlint.runtime_guard.registry import estimator, runtime_check

LOOP_MIN_PER_STEP = 4        # same-shape GEMMs per step from one line


class LoopEstimate(NamedTuple):
    kind: str            # "loop"
    op: str
    a_shape: tuple
    b_shape: tuple
    dtype: str
    device: str
    n: int               # GEMMs per loop
    loops_per_step: float
    grad: bool
    shared: str | None   # "second" (one weight), "first" (one input), "both", None (neither)


@runtime_check("MAT101")
def check_loop_matmul(rec, steps, ctx):
    """Same-shape GEMMs from one line, many per step, that do not feed each other (a recurrence,
    a stack of layers or a decode loop feeds each call from the one before; so does a rollout whose
    next input the host makes from a value it read, `torch.tensor(state)` after `env.step(action.item())`:
    left alone). What to
    batch them into depends on what they share: one weight → one call on the stacked inputs; one
    input → one GEMM on the concatenated weights; neither → bmm."""
    groups = defaultdict(list)
    for key, stat in rec.ops.items():
        if key.op not in GEMM_OPS or key.backward or key.site in rec.chained_gemm_sites or stat.compiled:
            continue
        groups[(key.op, key.site, key.sig)].append((key, stat))
    for (op, site, sig), items in groups.items():
        per_step = sum(s.count for _, s in items) / steps
        if per_step < LOOP_MIN_PER_STEP:
            continue
        key = max(items, key=lambda e: e[1].count)[0]
        a, b = gemm_operands(key)
        n = round(per_step)
        use = rec.gemm_operands.get((op, site, sig))
        shared = ("both" if use.first == 1 and use.second == 1 else "second" if use.second == 1
                  else "first" if use.first == 1 else None) if use is not None else None
        modules = sorted({k.module for k, _ in items})
        head = f"{per_step:g} same-shape GEMMs per step from this line ({key.qualname} {shape_str(a[0])} @ {shape_str(b[0])})"
        if shared == "both":
            fix = "the same GEMM on the same operands each time: compute it once and reuse the result"
        elif shared == "second":
            fix = (f"one weight {shape_str(b[0])} on {n} independent inputs: stack the inputs (torch.cat along the "
                   f"batch dim) and make one call of the layer, then split its output")
        elif shared == "first" and len(b[0]) == 2 and _column_major(b):  # W.t() of (out, in) weights: nn.Linear
            fix = (f"one input on {n} different weights: concatenate the weights along their output dim "
                   f"(nn.Linear weights are (out, in): torch.cat(weights, dim=0), the biases likewise) and make "
                   f"one call (F.linear), then split its output")
        elif shared == "first":
            fix = (f"one input on {n} different weights: concatenate the weights along the output dim "
                   f"(torch.cat(weights, dim=-1)) and make one GEMM, then split its output")
        else:
            batched = f"({n}, {a[0][-2]}, {a[0][-1]}) @ ({n}, {b[0][-2]}, {b[0][-1]})"
            fix = (f"independent inputs and weights: issue one batched call instead, torch.bmm/torch.einsum on "
                   f"{batched}" + (" (per-module weights: torch.func.stack_module_state + torch.vmap, or a "
                                   "grouped GEMM)" if len(modules) > 1 else ""))
        grad = any(k.backward and k.site == site and k.op in GEMM_OPS for k in rec.ops)
        ev = common_evidence(key, per_step, [s for _, s in items], rec)
        ev["module"] = modules[0] if len(modules) == 1 else modules
        ev["shared_operand"] = shared
        ev["independent"] = True
        if shared is None:
            ev["batched_shapes"] = f"({n}, {a[0][-2]}, {a[0][-1]}) @ ({n}, {b[0][-2]}, {b[0][-1]})"
        yield finding("MAT101", site, f"{head}: {fix}", ev,
                      LoopEstimate("loop", key.op, a[0], b[0], dtype_str(a[2]), key.device, n, per_step / n, grad,
                                   shared))


@estimator("loop")
def estimate_loop(spec: LoopEstimate, budget):
    dt = savings.DTYPES.get(spec.dtype, torch.float32)
    inputs = savings.Inputs(spec.device)
    n, grad, device, shared = spec.n, spec.grad, spec.device, spec.shared
    m, k, cols = spec.a_shape[-2], spec.a_shape[-1], spec.b_shape[-1]
    key = spec._replace(loops_per_step=0.0)

    def compute():
        # gradients flow to the second operand (the weights), as in `x[i] @ w[i]` or a Linear; a
        # shared operand is one 2-d tensor used by every call, as the user's weight is
        a = inputs.tensor((m, k) if shared in ("first", "both") else (n, m, k), dt)
        b = inputs.tensor((k, cols) if shared in ("second", "both") else (n, k, cols), dt, requires_grad=grad)
        grad_out = torch.ones((n, m, cols), dtype=dt, device=device) if grad else None  # a dense incoming gradient

        def looped():
            out = torch.stack([(a if a.dim() == 2 else a[i]) @ (b if b.dim() == 2 else b[i]) for i in range(n)])
            if grad:
                out.backward(grad_out)

        def batched():
            if shared == "second":    # one call on the stacked inputs
                out = (a.reshape(n * m, k) @ b).view(n, m, cols)
            elif shared == "first":   # one GEMM on the concatenated weights
                out = (a @ b.permute(1, 0, 2).reshape(k, n * cols)).view(m, n, cols).transpose(0, 1)
            elif shared == "both":    # computed once
                out = (a @ b).expand(n, m, cols)
            else:
                out = torch.bmm(a, b)
            if grad:
                out.backward(grad_out)

        return savings.time_pair(looped, batched, device, budget=budget)

    t = savings.cached(key, compute)
    t_loop, t_one = t.slow_ms, t.fast_ms
    one = {"second": "one GEMM on the stacked inputs", "first": "one GEMM on the concatenated weights",
           "both": "one GEMM reused"}.get(shared, "one bmm")
    method = (f"timed {n} separate {'fwd+bwd ' if grad else ''}GEMMs ({t_loop:.3f} ms) against {one} "
              f"({t_one:.3f} ms) at the observed shapes on {device}")
    return t.scaled(spec.loops_per_step), method
