"""MAT504 at runtime: many tiny kernel launches per step from one line, and the timing of one
fused foreach launch against them. Imported only by the guard (needs torch)."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

import torch

from matlint.runtime_guard import savings
from matlint.runtime_guard.capture import VIEW_OPS
from matlint.runtime_guard.checks import TINY_NUMEL, finding, kernel_share, per_item_sites, rollout_sites
from matlint.runtime_guard.registry import estimator, runtime_check

TINY_MIN_PER_STEP = 32       # launches per step from one line
TINY_KERNEL_US = 10.0


class TinyEstimate(NamedTuple):
    kind: str            # "tiny"
    numel: int           # elements per launch (their mean)
    launches: float      # per step


@runtime_check("MAT504", needs_gpu=True)
def check_tiny_ops(rec, steps, ctx):
    if ctx.device_type != "cuda":
        return
    # per line and module, forward only: the same line in every layer, or a layer's backward
    # kernels, are not a loop that one fused call could replace
    per_site = defaultdict(list)
    per_item = per_item_sites(rec, steps, ctx)  # a loop over a tensor's elements or rows: MAT501's
    rollout = rollout_sites(rec, steps)  # launches of a loop that runs through the host
    for key, stat in rec.ops.items():
        if key.device != "cuda" or key.backward or key.op in VIEW_OPS or stat.compiled or not key.out:
            continue
        if (key.site, key.module) not in per_item and key.site not in rollout:
            per_site[(key.site, key.module)].append((key, stat))
    for (site, module), items in _callee_ops_with_caller(per_site).items():
        if rec.profiled:
            tiny = [(k, s) for k, s in items if s.launches and s.kernel_us / s.launches < TINY_KERNEL_US]
            launches = sum(s.launches for _, s in tiny) / steps
            kernel_us = sum(s.kernel_us for _, s in tiny) / max(sum(s.launches for _, s in tiny), 1)
        else:
            tiny = [(k, s) for k, s in items if math.prod(k.out[0]) <= TINY_NUMEL]
            launches = sum(s.count for _, s in tiny) / steps
            kernel_us = None
        if launches < TINY_MIN_PER_STEP:
            continue
        size = f"< {TINY_KERNEL_US:g} µs each (avg {kernel_us:.1f} µs)" if kernel_us is not None else f"on ≤ {TINY_NUMEL} elements each"
        msg = (f"{launches:g} kernel launches per step {size} from this line: fuse them with torch.compile, "
               f"capture the step in a CUDA graph, or use torch._foreach_* ops for per-tensor loops")
        ev = {"per_step": round(launches, 2), "module": module, "device": "cuda",
              "ops": sorted({k.qualname for k, _ in tiny})[:10], "phase": "forward"}
        if kernel_us is not None:
            ev["avg_kernel_us"] = round(kernel_us, 2)
        share = kernel_share([s for _, s in tiny], rec)
        if share is not None:
            ev["share_of_kernel_time"] = round(share, 4)
        numel = max(1, int(sum(math.prod(k.out[0]) for k, _ in tiny) / len(tiny)))
        yield finding("MAT504", site, msg, ev, TinyEstimate("tiny", numel, launches))


def _callee_ops_with_caller(per_site: dict) -> dict:
    """The ops a line issues through a module it calls, counted with the line's own: where one line
    has ops in a module `A` and in its child `A.child`, the child's ops came from a module whose code
    is not the user's (a built-in `nn.Linear` that `A`'s forward calls on this line; a module of the
    user's would have its ops on lines of its own `forward`). Ops of modules nested deeper are the
    inside of a built-in model the line calls once (`nn.TransformerEncoder`'s layers), not the
    line's; modules with no such relation (the same line in each layer of a stack) stay apart."""
    modules_at: dict = defaultdict(set)
    for site, module in per_site:
        modules_at[site].add(module)
    merged: dict = defaultdict(list)
    for (site, module), items in per_site.items():
        parent = module.rpartition(".")[0]
        merged[(site, parent if parent and parent in modules_at[site] else module)].extend(items)
    return merged


@estimator("tiny")
def estimate_tiny(spec: TinyEstimate, budget):
    numel, launches = spec.numel, spec.launches
    device = "cuda"
    n = max(8, min(int(launches), 512))
    inputs = savings.Inputs(device)
    key = ("tiny", numel, n)

    def compute():
        xs = [inputs.tensor((numel,), torch.float32) for _ in range(n)]

        def eager():
            for x in xs:
                x.mul_(1.0)

        return savings.time_pair(eager, lambda: torch._foreach_mul_(xs, 1.0), device, budget=budget)

    t = savings.cached(key, compute)
    t_eager, t_fused = t.slow_ms, t.fast_ms
    return t.scaled(launches / n), (f"timed {n} eager launches of {numel} elements ({t_eager:.3f} ms) against one "
                                   f"fused foreach launch ({t_fused:.3f} ms) on this GPU")
