"""MAT501 at run time: a line that, every step, picks single elements out of a tensor and computes on
them one at a time (a Python loop over elements). Imported only by the guard (needs torch)."""
from __future__ import annotations

from matlint.runtime_guard.checks import finding, per_element_sites
from matlint.runtime_guard.registry import runtime_check


@runtime_check("MAT501")
def check_per_element_loops(rec, steps, ctx):
    for (site, module), items in per_element_sites(rec, steps, ctx).items():
        per_step = sum(s.count for _, s in items) / steps
        ops = sorted({k.qualname for k, _ in items})
        msg = (f"{per_step:g} ops per step on single elements from this line ({', '.join(ops[:6])}): a Python "
               f"loop over a tensor's elements, one launch and one dispatch per element; compute it as one op "
               f"over the whole tensor (slices, `torch.where`, `cumsum`, broadcasting)")
        ev = {"per_step": round(per_step, 2), "module": module, "ops": ops[:10], "device": ctx.device_type,
              "phase": "forward"}
        yield finding("MAT501", site, msg, ev)
