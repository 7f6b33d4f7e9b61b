"""MAT201 at runtime: an elementwise op whose (N, 1) and (N,) operands broadcast to (N, N).
Imported only by the guard (needs torch)."""
from __future__ import annotations

import math

from matlint.runtime_guard.checks import common_evidence, finding, is_tensor, shape_str
from matlint.runtime_guard.registry import runtime_check

ELEMENTWISE_BINARY = frozenset({"add", "sub", "mul", "div", "rsub", "pow", "maximum", "minimum", "eq", "ne", "lt", "gt", "le", "ge"})


def _trailing_one_pair(a, b) -> bool:
    return len(a) == len(b) + 1 and len(b) >= 1 and a[-1] == 1 and a[-2] > 1 and b[-1] == a[-2]


@runtime_check("MAT201")
def check_broadcast(rec, steps, ctx):
    seen = set()
    for key, stat in rec.ops.items():
        if key.op not in ELEMENTWISE_BINARY or key.backward or len(key.sig) < 2 or not key.out:
            continue
        if not (key.sig[0] and key.sig[1] and is_tensor(key.sig[0]) and is_tensor(key.sig[1])):
            continue
        a, b = key.sig[0][0], key.sig[1][0]
        out_numel = math.prod(key.out[0])
        if out_numel <= max(math.prod(a), math.prod(b)):
            continue
        if not (_trailing_one_pair(a, b) or _trailing_one_pair(b, a)):
            continue
        # A tensor set against itself with a singleton axis added (`s.unsqueeze(1) - s`, `p[:, None] > p`):
        # a pairwise (N, N) matrix on purpose.
        if (key.site, a, b) in seen or key.same_values:
            continue
        seen.add((key.site, a, b))
        msg = (f"{key.qualname} of {shape_str(a)} and {shape_str(b)} broadcasts to {shape_str(key.out[0])}: "
               f"make the shapes agree (squeeze(-1) / unsqueeze) or write the outer product explicitly")
        yield finding("MAT201", key.site, msg, common_evidence(key, stat.count / steps, [stat], rec))
