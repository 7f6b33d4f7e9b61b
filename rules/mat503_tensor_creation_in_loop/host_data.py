"""MAT503: data that numpy makes on the host on every pass (a draw of `np.random`, a fill such as
`np.zeros`), as opposed to data from elsewhere (a loader's batch, an environment's state), which
has to be copied anyway."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic.flow import flow_of

# numpy factories that fill an array from sizes alone (torch has each, with `device=`).
_NUMPY_FILLS = {"zeros", "ones", "full", "empty", "eye", "arange"}
# numpy fills shaped like another array (`np.ones_like(rewards)`): torch's fill of its shape.
NUMPY_LIKE_FILLS = {"zeros_like", "ones_like", "full_like", "empty_like"}


def numpy_made(ctx, expr: ast.AST, depth: int = 0) -> Optional[ast.Call]:
    """The numpy call that makes `expr` on this pass, directly, through `.astype(...)`, a copy
    or a new layout (`np.eye(k).flatten()`), or through a name assigned it in the same loop and
    not changed in place (`noise = np.random.normal(...)`)."""
    while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
           and expr.func.attr in ("astype", "copy", "flatten", "ravel", "reshape") and ctx.qualname(expr.func) is None):
        expr = expr.func.value
    if isinstance(expr, ast.Name) and depth < 3:
        flow = flow_of(ctx, ctx.scope)
        reaching = flow.reaching_all(expr)  # `w = ...`, or an unpacking: `w, idx = np.ones_like(r), None`
        assign = reaching[0][0] if len(reaching) == 1 and isinstance(reaching[0][0], ast.Assign) else None
        if (assign is None or len(assign.targets) != 1 or flow.loops_around(assign) != flow.loops_around(expr)
                or flow.mutations.get(expr.id)):
            return None  # made elsewhere, or filled in afterwards (`adv[t] = a_t`): data, not a fill
        return numpy_made(ctx, _assigned_to(assign.targets[0], assign.value, expr.id), depth + 1)
    if not isinstance(expr, ast.Call):
        return None
    module, _, name = (ctx.qualname(expr.func) or "").rpartition(".")
    if module == "numpy" and name in NUMPY_LIKE_FILLS:
        return expr if expr.args and not any(isinstance(a, ast.Starred) for a in expr.args) else None
    return expr if module == "numpy.random" or module == "numpy" and name in _NUMPY_FILLS else None


def _assigned_to(target: ast.AST, value: ast.AST, name: str) -> Optional[ast.AST]:
    """What `name` gets from `target = value`: the value, or its item in an unpacking of a tuple
    of the same length (`w, idx = np.ones_like(r), None`)."""
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in value.elts):
        for item, part in zip(target.elts, value.elts):
            if isinstance(item, ast.Name) and item.id == name:
                return part
    return None


def same_data_every_iteration(ctx, loops: list, data: ast.AST) -> bool:
    """`data` is a name that holds the same host data on every iteration of the innermost of
    `loops` (the repeating loops around the copy): every value that reaches it is bound before
    that loop (or passed in) and nothing changes it in place, so copying it each time copies the
    same values again (`grid_x = np.linspace(...)` before `for i in range(num_anchors):`, then
    `torch.tensor(grid_x, device=d)` inside)."""
    if not loops or not isinstance(data, ast.Name) or loops[-1].depends_on_iteration(data):
        return False  # not a name, or the loop's own item (`for states in all_states`)
    flow = flow_of(ctx, ctx.scope)
    loop = loops[-1].node
    if loop not in flow.loops_around(data) or flow.mutations.get(data.id):
        return False
    reaching = flow.reaching_all(data)
    return bool(reaching) and all(stmt is None or loop not in flow.loops_around(stmt) and stmt is not loop
                                  for stmt, _ in reaching)
