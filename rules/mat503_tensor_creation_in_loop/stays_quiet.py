"""MAT503: where a tensor made on every pass is not the waste the rule reports (the docs' "Stays
quiet on"): a branch the data chooses, a branch of one iteration, a cache filled on the first
call, a tensor each pass needs of its own, one tensor per listed shape, a device that changes
with the loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.shapes import self_name_of
from matlint.semantic.tree import code_scope, fills_own_cache, stored_targets
from matlint.semantic.steps import (PerStep, configuration_test, guards_empty_selection, is_step_loop, per_step,
                                    plain_class, step_of)

from .factories import SIZED_FACTORIES

# Tests that read a tensor's values on the host: the branch under them handles what the data says
# (an empty mask, a NaN, an out-of-range loss), not the work of every call.
_VALUE_CHECKS = {"item", "any", "all", "isnan", "isinf", "isfinite", "equal", "allclose", "is_nonzero"}
# Reductions whose result, compared on the host (`if mask.sum() > 0:`), reads the tensor's values.
_REDUCTIONS = {"sum", "count_nonzero", "max", "min", "amax", "amin", "mean", "prod", "norm", "nansum"}


def in_value_checked_branch(ctx) -> bool:
    """Under `if not torch.any(mask):`, `if loss.item() > 1.0:`, `if total == 0:` (a tensor), or
    in the `else` of `if mask.sum() > 0:`: a branch the data chooses (an empty batch, an
    out-of-range value), not work of every call. The body of a guard against an empty selection
    (`if pos.sum() > 0: ... x[pos]`, `guards_empty_selection`) is the usual path."""
    parents = ctx.parents
    for k in range(len(parents) - 2, -1, -1):
        parent = parents[k]
        if parent is ctx.function:
            break
        if not isinstance(parent, ast.If) or not _reads_tensor_values(ctx, parent.test):
            continue
        branch = parent.orelse if guards_empty_selection(ctx, parent) else parent.body
        if any(s is parents[k + 1] for s in branch):
            return True
    return False


def _reads_tensor_values(ctx, test: ast.AST) -> bool:
    """The test reads a tensor's values on the host: `.item()`, `.any()`, `torch.isnan(...)`, a
    reduction compared (`mask.sum() > 0`, `(z < -1).sum() == 0`), a tensor compared (`total ==
    0`) or tested for truth. `x is None` reads no values: it is the optional argument's default."""
    operands = [test.operand if isinstance(test, ast.UnaryOp) else test]
    for sub in ast.walk(test):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _VALUE_CHECKS:
            return True
        if isinstance(sub, ast.Compare) and not any(isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops):
            compared = [sub.left, *sub.comparators]
            if any(_is_reduction(ctx, o) for o in compared):
                return True
            operands.extend(compared)
    return any(isinstance(o, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and _kinds.kind_of(ctx, o) in _kinds.TENSORS
               for o in operands)


def _is_reduction(ctx, expr: ast.AST) -> bool:
    """`mask.sum()`, `(z < -1).sum()`, `torch.count_nonzero(m)`: a tensor method or a torch
    function that reduces values (not `len(x)`, `sum(lengths)` or `x.size(0)`)."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _REDUCTIONS):
        return False
    qualname = ctx.qualname(expr.func)
    if qualname is not None:
        return qualname.rpartition(".")[0] == "torch"
    return _kinds.kind_of(ctx, expr.func.value) not in _kinds.NON_TENSORS


def _changes_in_place(name: str, stmt: ast.AST) -> bool:
    """`stmt` changes the tensor held by `name` in place: `name += ...`, `name[i] = ...`, `name.add_(...)`,
    `out=name`."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.AugAssign):
            target = node.target
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            target = node
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_")
              and not node.func.attr.startswith("_")):
            target = node.func.value
        elif isinstance(node, ast.keyword) and node.arg == "out":
            target = node.value  # `torch.add(a, b, out=name)`
        else:
            continue
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        if isinstance(target, ast.Name) and target.id == name:
            return True
    return False


def kept_apart(ctx, node: ast.Call) -> bool:
    """Each pass needs a tensor of its own: the new one is returned, yielded, added to a
    collection (`.append(...)`), an item of a comprehension (`[torch.tensor(...) for _ in
    range(world)]`, an `all_gather` receive list), stored in another object (`data.edge_index
    = ...`, `out["mask"] = ...`), or changed in place later (`buf.copy_(x)`, `buf[i] = ...`,
    `out=buf`), directly or through the name it is assigned to: a tensor made once would be
    shared by every result, or changed by every pass."""
    scope = code_scope(ctx)
    if scope is None:
        return False
    flow = flow_of(ctx, scope)
    if _kept(ctx, node, flow.parent):
        return True
    statement = flow.statement(node)
    if not (isinstance(statement, ast.Assign) and statement.value is node and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)):
        return False
    name = statement.targets[0].id
    return (any(_changes_in_place(name, stmt) for stmt in scope.body)
            or any(_kept(ctx, use, flow.parent) for use in flow.uses(statement)))


def _kept(ctx, expr: ast.AST, parent: dict) -> bool:
    """The tensor `expr` holds outlives this pass where it stands (see `kept_apart`)."""
    up = parent.get(expr)
    if isinstance(up, ast.Tuple):
        expr, up = up, parent.get(up)
    if isinstance(up, (ast.Return, ast.Yield, ast.YieldFrom)):
        return True
    if isinstance(up, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        return up.elt is expr
    if isinstance(up, ast.DictComp):
        return up.value is expr
    if isinstance(up, ast.keyword):
        return up.arg == "out"
    if isinstance(up, ast.Call):
        return (isinstance(up.func, ast.Attribute) and up.func.attr in ("append", "extend", "insert", "add")
                and any(a is expr for a in up.args))
    if not isinstance(up, ast.Assign) or up.value is not expr:
        return False
    for target in up.targets:
        if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name) and target.value.id == "self"):
            return True
        if isinstance(target, ast.Subscript) and _kinds.kind_of(ctx, target.value) not in _kinds.TENSORS:
            return True
    return False


def sized_by_loop_item(ctx, name: str, call: ast.Call) -> bool:
    """`torch.randn(1, *shape).to(device) for shape in input_shapes`: one tensor per listed
    shape (dummy inputs built once), not the same work on every iteration. Only the size
    arguments count: in `torch.full((b,), t)` for `t in timesteps`, `t` is the fill value."""
    if not ctx.loops or name not in SIZED_FACTORIES:
        return False
    loop = ctx.loops[-1]
    it = loop.iter
    if isinstance(it, ast.Call) and getattr(it.func, "id", None) in ("range", "enumerate"):
        return False
    if name == "full":
        sizes = call.args[:1]
    elif name == "randint":  # randint(high, size), randint(low, high, size)
        sizes = call.args[-1:] if len(call.args) >= 2 else []
    else:
        sizes = call.args
    sizes = [*sizes, *(k.value for k in call.keywords if k.arg == "size")]
    for size in sizes:
        for arg in size.elts if isinstance(size, (ast.Tuple, ast.List)) else [size]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            if isinstance(arg, ast.Name) and arg.id in loop.targets:
                return True
    return False


def repeated_step(ctx) -> Optional[PerStep]:
    """Where the node runs on every step (`per_step`), unless it sits in a first- or
    last-iteration branch of a loop (`_once_branch`), which runs once per loop. In a function
    that itself runs on every step (a module's `forward` decoding token by token), such a branch
    on the loop's own variable (`if i == 0:` making the start token) runs once per call of that
    function, which is once per step: that call is where it runs. (A branch on the data, `if
    boxes.shape[0] == 0:`, may run on none.)"""
    step = per_step(ctx)
    if step is None or not _once_branch(ctx):
        return step
    return _function_step(ctx) if _tests_loop_variable(ctx) else None


def _tests_loop_variable(ctx) -> bool:
    """An `if` around the node compares the variable of a loop around it (`if i == 0:` in `for i
    in range(n)`)."""
    targets = set()
    for loop in ctx.loops:
        if isinstance(loop.node, (ast.For, ast.AsyncFor)):
            targets |= {n.id for n in ast.walk(loop.node.target) if isinstance(n, ast.Name)}
    return any(isinstance(parent, ast.If) and isinstance(parent.test, ast.Compare)
               and any(isinstance(n, ast.Name) and n.id in targets for n in ast.walk(parent.test))
               for parent in ctx.parents)


def _function_step(ctx) -> Optional[PerStep]:
    """The call of the function around the node, where that function runs on every step (a
    module's `forward`, or a step function) and no step loop around the node is inside it."""
    function = ctx.function
    if function is None or any(is_step_loop(ctx, loop) for loop in ctx.loops):
        return None
    if getattr(function, "name", "") == "forward" and ctx.class_ is not None and len(ctx.functions) == 1:
        return None if plain_class(ctx, ctx.class_) else PerStep([], None, function)
    step = step_of(ctx, ctx.functions)
    if step is None:
        return None
    return PerStep([], None if getattr(function, "name", "") == "forward" else step, function)


def _once_branch(ctx) -> bool:
    """Under `if i == last:`, `if x is None:`, `if len(state) == 0:` inside a loop: a first- or
    last-iteration branch, not per-iteration work; also where loops nested in the branch run it
    (`if i == maxlen - 1: for hyp in hyps: ...`), unless one of them is a step loop. A test of
    the run's configuration (`if self.adv_loss == 'wgan-gp':`, `configuration_test`) is no
    such branch: it takes the same arm on every iteration."""
    if not ctx.loops:
        return False
    loops = {id(loop.node): loop for loop in ctx.loops}
    parents = ctx.parents
    inside = once = False
    for k, parent in enumerate(parents[:-1]):
        loop = loops.get(id(parent))
        if loop is not None:
            inside = True
            once = once and not is_step_loop(ctx, loop)
        elif inside and isinstance(parent, ast.If) and any(s is parents[k + 1] for s in parent.body):
            test = parent.test  # its `else:` runs on the other iterations
            if isinstance(test, ast.Compare) and all(isinstance(op, (ast.Eq, ast.Is)) for op in test.ops) \
                    and not configuration_test(ctx, ctx.function, test, ctx.class_):
                once = True
    return once


def fills_a_cache(ctx) -> bool:
    """`self._mask = ...` under `if self._mask is None or ...:` or `if not hasattr(self,
    "_mask"):`, also through a name (`mask = ...`, then `self._mask = mask` in that `if`): a
    cache filled on the first call (or when it grows), not per-call work. So is anything after
    `if n == self.cached_n and self.cached is not None: return self.cached` in a function that
    stores `self.cached`: it runs when the cache misses."""
    if isinstance(ctx.function, (ast.FunctionDef, ast.AsyncFunctionDef)) and _after_a_cache_hit(ctx, ctx.function):
        return True
    statement = ctx.statement()
    stored = {target.attr for target in stored_targets(statement) if isinstance(target, ast.Attribute)} \
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) else set()
    receiver = self_name_of(ctx.functions[0]) if ctx.class_ is not None and ctx.functions else None
    for parent in reversed(ctx.parents):
        if parent is ctx.function:
            break
        if isinstance(parent, ast.If):
            read = {sub.attr if isinstance(sub, ast.Attribute) else sub.value for sub in ast.walk(parent.test)
                    if isinstance(sub, ast.Attribute) or isinstance(sub, ast.Constant) and isinstance(sub.value, str)}
            if read & stored or receiver is not None and fills_own_cache(parent, receiver):
                return True
    return False


def _after_a_cache_hit(ctx, function: ast.AST) -> bool:
    """The statement being visited follows, in `function`'s body, an `if` whose body returns
    `self.<attr>` (or a tuple of such) that the function stores later: a cache hit returns early."""
    key = ("mat503_cache_hit", id(function))
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = _cache_hit_line(function)
    statement = ctx.statement()
    return found is not None and statement is not None and statement.lineno > found


def _cache_hit_line(function: ast.AST) -> Optional[int]:
    """The last line of the first top-level `if ...: return self.<attr>` of `function` whose
    attributes the function stores (`self.<attr> = ...`) after it; None where there is none."""
    stored = {target.attr for node in ast.walk(function) if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Attribute)
              and isinstance(target.value, ast.Name) and target.value.id == "self"}
    for stmt in function.body:
        if not (isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[-1], ast.Return)):
            continue
        value = stmt.body[-1].value
        returned = value.elts if isinstance(value, ast.Tuple) else [value]
        if returned and all(isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self"
                            and v.attr in stored for v in returned):
            return stmt.end_lineno
    return None


def varies_per_iteration(ctx, expr: ast.AST) -> bool:
    """The device (or the whole expression) changes with the loop variable: one tensor per
    device, e.g. initializing every GPU. The CUDA index of a tensor of the iteration (`device =
    g_norm.get_device()`) is where that iteration's data is, not a device of its own."""
    if isinstance(expr, ast.Name) and ctx.function is not None:
        assign = flow_of(ctx, ctx.scope).reaching(expr)
        if assign is not None and _cuda_index_of_a_tensor(assign.value):
            return False
    return not _cuda_index_of_a_tensor(expr) and not _place_of_device_data(ctx, expr) and any(
        loop.depends_on_iteration(expr) for loop in ctx.loops)


def _cuda_index_of_a_tensor(expr: ast.AST) -> bool:
    """`x.get_device()`: the index of the GPU that holds `x` (-1, which no move takes, on the
    host); `x.device` may name the host."""
    return (isinstance(expr, ast.Call) and not expr.args and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "get_device")


def _place_of_device_data(ctx, expr: ast.AST) -> bool:
    """`loss_mat.device` of a tensor not known to be on the host (the model's output on the
    iteration's batch): where each iteration's data is, the same place on every pass."""
    return (isinstance(expr, ast.Attribute) and expr.attr == "device"
            and _kinds.kind_of(ctx, expr.value) == _kinds.TENSOR)
