"""MAT202 at runtime: a loss whose input and target were broadcast (a stride-0 dimension in the
recorded operands). Imported only by the guard (needs torch)."""
from __future__ import annotations

from matlint.runtime_guard.capture import LOSS_OPS
from matlint.runtime_guard.checks import common_evidence, finding, shape_str
from matlint.runtime_guard.registry import runtime_check


@runtime_check("MAT202")
def check_loss_shape(rec, steps, ctx):
    for key, stat in rec.ops.items():
        if key.op not in LOSS_OPS or key.backward or len(key.sig) < 2:
            continue
        expanded = [i for i, s in enumerate(key.sig[:2])
                    if any(st == 0 and sz > 1 for sz, st in zip(s[0], s[1]))]
        if not expanded:
            continue
        msg = (f"{key.qualname}: input and target had different shapes and were broadcast to "
               f"{shape_str(key.sig[0][0])} (strides {list(key.sig[0][1])} and {list(key.sig[1][1])}): "
               f"reshape the target to the input's shape")
        yield finding("MAT202", key.site, msg, common_evidence(key, stat.count / steps, [stat], rec))
