"""MAT503: data that numpy makes on the host on every pass (a draw of `np.random`, a fill such as
`np.zeros`), as opposed to data from elsewhere (a loader's batch, an environment's state), which
has to be copied anyway."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic.flow import flow_of

# numpy factories that fill an array from sizes alone (torch has each, with `device=`).
_NUMPY_FILLS = {"zeros", "ones", "full", "empty", "eye", "arange"}


def numpy_made(ctx, expr: ast.AST, depth: int = 0) -> Optional[ast.Call]:
    """The numpy call that makes `expr` on this pass, directly, through `.astype(...)` or
    through a name assigned it in the same loop and not changed in place
    (`noise = np.random.normal(...)`)."""
    while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
           and expr.func.attr in ("astype", "copy") and ctx.qualname(expr.func) is None):
        expr = expr.func.value
    if isinstance(expr, ast.Name) and depth < 3 and ctx.function is not None:
        flow = flow_of(ctx, ctx.function)
        assign = flow.reaching(expr)
        if (assign is None or len(assign.targets) != 1 or flow.loops_around(assign) != flow.loops_around(expr)
                or flow.mutations.get(expr.id)):
            return None  # made elsewhere, or filled in afterwards (`adv[t] = a_t`): data, not a fill
        return numpy_made(ctx, assign.value, depth + 1)
    if not isinstance(expr, ast.Call):
        return None
    module, _, name = (ctx.qualname(expr.func) or "").rpartition(".")
    return expr if module == "numpy.random" or module == "numpy" and name in _NUMPY_FILLS else None
