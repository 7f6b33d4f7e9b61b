"""MAT501 at run time: a line that, every step, picks items out of a tensor one at a time, elements
(`x[i, j]`) or small rows (`x[i]`), and computes on each (a Python loop over the tensor's elements or
rows). Imported only by the guard (needs torch)."""
from __future__ import annotations

import math

from matlint.runtime_guard.checks import finding, per_item_sites
from matlint.runtime_guard.registry import runtime_check


@runtime_check("MAT501")
def check_per_element_loops(rec, steps, ctx):
    for (site, module), items in per_item_sites(rec, steps, ctx).items():
        per_step = sum(s.count for _, s in items) / steps
        ops = sorted({k.qualname for k, _ in items})
        rows = any(math.prod(s[0]) > 1 for k, _ in items for s in k.sig)
        if rows:
            msg = (f"{per_step:g} ops per step on rows picked one at a time out of a tensor from this line "
                   f"({', '.join(ops[:6])}): a Python loop over a tensor's rows, one launch and one dispatch per "
                   f"row and op; compute it as one op over the whole tensor (reduce or compare along a dim, "
                   f"broadcasting, boolean masks)")
        else:
            msg = (f"{per_step:g} ops per step on single elements from this line ({', '.join(ops[:6])}): a Python "
                   f"loop over a tensor's elements, one launch and one dispatch per element; compute it as one op "
                   f"over the whole tensor (slices, `torch.where`, `cumsum`, broadcasting)")
        ev = {"per_step": round(per_step, 2), "module": module, "ops": ops[:10], "device": ctx.device_type,
              "phase": "forward", "items": "rows" if rows else "elements"}
        yield finding("MAT501", site, msg, ev)
