"""MAT503: the tensor a call makes and the device it goes to: torch's factories (fills, random
draws, tensors from data, legacy constructors), the ops a made tensor keeps its place through,
the name that carries a host-made tensor to its copy, and what is surely a device."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.loops import identifier

# Factories built from sizes alone (their values, to the last bit, in `same_values_on_device`).
FILLS = {"zeros", "ones", "full", "empty", "arange", "eye", "linspace", "logspace", "tril_indices", "triu_indices"}
# Factories that take sizes: every positional argument, but only the first of `full` and the last of
# `randint` (the others are values).
SIZED_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "eye"}
# Factories whose values come from the generator of the device they are created on.
RANDOM = {"rand", "randn", "randint", "randperm", "normal", "bernoulli"}
FROM_DATA = {"tensor", "as_tensor", "asarray", "Tensor", "FloatTensor", "LongTensor"}
# Legacy constructors: `torch.Tensor(2, 4)` takes sizes (uninitialised memory), `torch.Tensor([2, 4])` data.
LEGACY_CONSTRUCTORS = {"Tensor": "", "FloatTensor": "dtype=torch.float32, ", "LongTensor": "dtype=torch.long, "}
# Ops whose result lives where their input does (`torch.tril(torch.ones(T, T)).to(device)`).
_SAME_DEVICE_FUNCTIONS = {"torch.tril", "torch.triu", "torch.autograd.Variable", "torch.autograd.variable.Variable"}
_SAME_DEVICE_METHODS = {"tril", "triu", "bool", "float", "half", "bfloat16", "long", "int"}
# ... and, in the expression that makes a tensor, the methods that reshape, retype, clamp or fill
# it where it is, whatever their arguments (`torch.arange(n).unsqueeze(0).repeat(b, 1)`,
# `torch.empty(1, 1).type_as(x).fill_(v)`, `torch.FloatTensor(b, 1).uniform_(0, 1)`; `type_as`
# may move it, after it was made on the host all the same).
_MAKING_METHODS = _SAME_DEVICE_METHODS | {
    "unsqueeze", "squeeze", "view", "reshape", "expand", "expand_as", "repeat", "transpose", "permute", "t",
    "flatten", "contiguous", "type", "type_as", "clamp", "fill_", "uniform_", "normal_", "random_"}
# ... and the torch functions of one tensor that compute on it where it is (`torch.exp(-c *
# torch.arange(half) / half)`): their values may round differently on the device.
_MAKING_FUNCTIONS = {"torch.exp", "torch.log", "torch.sin", "torch.cos", "torch.sqrt", "torch.rsqrt",
                     "torch.sigmoid", "torch.flip"}
# Ops between a factory and its move after which the values on the device may differ from the
# host's (a random fill, a transcendental function): the `device=` fix is not safe through them.
_INEXACT_METHODS = {"uniform_", "normal_", "random_"}
# torch functions that join tensors: the result is made on the host when every part is.
_JOINS = {"torch.cat", "torch.stack"}


def same_values_on_device(name: str, call: ast.Call) -> bool:
    """Whether the factory gives bit-identical values on any device: fills of one value, and
    `arange` stepping by a whole number. Interpolating factories round differently per device."""
    if name in ("linspace", "logspace") or name not in FILLS:
        return False
    if name == "arange":
        step = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "step"), None)
        return step is None or (isinstance(step, ast.Constant) and type(step.value) is int)
    return True


def is_constant_data(expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float, bool)) and expr.value is not None
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        return is_constant_data(expr.operand)
    if isinstance(expr, (ast.List, ast.Tuple)):
        return bool(expr.elts) and all(is_constant_data(e) for e in expr.elts)
    return False


def is_false(expr: ast.AST) -> bool:
    """`requires_grad=False`, `pin_memory=False`: the default, as if the keyword were not there."""
    return isinstance(expr, ast.Constant) and expr.value is False


def _is_scalar_data(expr: ast.AST) -> bool:
    return is_constant_data(expr) and not isinstance(expr, (ast.List, ast.Tuple))


def _scalar_value(expr: ast.AST):
    """The number a scalar literal (`_is_scalar_data`) spells: `-1.0`, `+2`, `True`."""
    if isinstance(expr, ast.UnaryOp):
        value = _scalar_value(expr.operand)
        return -value if isinstance(expr.op, ast.USub) else value
    return expr.value


def one_value(expr: ast.AST) -> Optional[tuple]:
    """(the number, the shape) of constant data that repeats one number (`[0.0, 0.0]`, `[[1, 1],
    [1, 1]]`): a fill, not data. None for ragged or mixed data."""
    if _is_scalar_data(expr):
        return _scalar_value(expr), ()
    if not isinstance(expr, (ast.List, ast.Tuple)) or not expr.elts:
        return None
    items = [one_value(e) for e in expr.elts]
    first = items[0]
    if first is None or any(i is None or i != first or type(i[0]) is not type(first[0]) for i in items):
        return None
    return first[0], (len(items),) + first[1]


def takes_device(name: str, call: ast.Call) -> bool:
    """`torch.bernoulli(p)` and `torch.normal(mean_tensor, std)` sample from a tensor, with no
    `device=`; `torch.normal(mean, std, size)` and the other factories take one."""
    if name == "bernoulli":
        return False
    if name == "normal":
        return len(call.args) >= 3 or any(k.arg == "size" for k in call.keywords)
    return True


def legacy_sizes(name: str, call: ast.Call) -> bool:
    """`torch.Tensor(2, 4)`, `torch.FloatTensor(3)`: sizes, not data."""
    return name in LEGACY_CONSTRUCTORS and bool(call.args) and all(
        isinstance(a, ast.Constant) and type(a.value) is int for a in call.args)


def _is_number(ctx, expr: ast.AST) -> bool:
    """A Python number: a literal, a name or attribute of that kind, `math.log(p)`, and arithmetic
    of them (`-math.log(max_period)`, `n - 1`)."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
    if isinstance(expr, ast.UnaryOp):
        return isinstance(expr.op, (ast.USub, ast.UAdd)) and _is_number(ctx, expr.operand)
    if isinstance(expr, ast.BinOp):
        return _is_number(ctx, expr.left) and _is_number(ctx, expr.right)
    if isinstance(expr, ast.Call):
        return (ctx.qualname(expr.func) or "").startswith("math.")
    return isinstance(expr, (ast.Name, ast.Attribute)) and _kinds.kind_of(ctx, expr) == _kinds.SCALAR


def unwrapped(ctx, expr: ast.AST, making: bool = False) -> ast.AST:
    """`expr` without the calls that keep its device (`Variable(z)`, `z.float()`); `making`:
    also through what may follow a factory in the expression that makes a tensor
    (`torch.ones(T, T).tril(1)`, `torch.arange(n).unsqueeze(0).repeat(b, 1)`, arithmetic with a
    number: `torch.ones(n) * i`, `-c * torch.arange(h) / h`, `torch.exp(...)`), and into the
    first part of a join of tensors all made so (`torch.cat([torch.arange(b) for _ in views])`)."""
    while True:
        if isinstance(expr, ast.BinOp):
            if not (making and isinstance(expr.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))):
                return expr
            if _is_number(ctx, expr.right):
                expr = expr.left
            elif _is_number(ctx, expr.left):
                expr = expr.right
            else:
                return expr
            continue
        if making and isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.Invert)):
            expr = expr.operand
            continue
        if not isinstance(expr, ast.Call):
            return expr
        func = expr.func
        qualname = ctx.qualname(func)
        if isinstance(func, ast.Attribute) and qualname is None and (
                func.attr in _SAME_DEVICE_METHODS and not expr.keywords and (
                    not expr.args or making and func.attr in ("tril", "triu"))
                or making and func.attr in _MAKING_METHODS):
            expr = func.value
        elif (qualname in _SAME_DEVICE_FUNCTIONS or making and qualname in _MAKING_FUNCTIONS) and expr.args \
                and not isinstance(expr.args[0], ast.Starred):
            expr = expr.args[0]
        elif making and qualname in _JOINS and expr.args:
            parts = _joined(expr.args[0])
            if not parts or not all(host_made(ctx, part) for part in parts):
                return expr
            expr = parts[0]
        else:
            return expr


def _joined(tensors: ast.AST) -> list:
    """The tensors a `torch.cat` / `torch.stack` joins, as written: the items of a list or tuple,
    the item of a comprehension."""
    if isinstance(tensors, (ast.List, ast.Tuple)):
        return [] if any(isinstance(e, ast.Starred) for e in tensors.elts) else list(tensors.elts)
    if isinstance(tensors, (ast.ListComp, ast.GeneratorExp)):
        return [tensors.elt]
    return []


def exact_on_device(ctx, moved: ast.AST, factory: ast.Call) -> bool:
    """Whether the ops between `factory` and its move (`moved` is the moved expression) give the
    same values on the device: not through a random fill (`.uniform_(0, 1)`) or a function
    whose rounding may differ (`torch.exp`)."""
    made = {id(node) for node in ast.walk(factory)}
    return not any(
        isinstance(node, ast.Call) and id(node) not in made and (
            isinstance(node.func, ast.Attribute) and node.func.attr in _INEXACT_METHODS
            or ctx.qualname(node.func) in _MAKING_FUNCTIONS)
        for node in ast.walk(moved))


def torch_factory(ctx, expr: ast.AST) -> Optional[tuple]:
    """(name, call) for a call of a function of `torch` (`torch.zeros(n)`: ("zeros", the call))."""
    if not isinstance(expr, ast.Call):
        return None
    qualname = ctx.qualname(expr.func) or ""
    module, _, name = qualname.rpartition(".")
    return (name, expr) if module == "torch" else None


def host_made(ctx, expr: ast.AST) -> Optional[tuple]:
    """The factory call that makes `expr`, directly or through ops that keep its device
    (`torch.ones(T, T).tril().bool()`), as `torch_factory` gives it."""
    return torch_factory(ctx, unwrapped(ctx, expr, making=True))


def carried_to_move(ctx, name: ast.Name) -> Optional[tuple]:
    """(factory, its call) when `name` holds a tensor made on the host by the one assignment
    that reaches this move, at the same loop depth, and every read of it is a move to the
    device (`z = torch.randn(b, 100)` ... `z = z.cuda()`): the name only carries the tensor
    to the copy."""
    function = ctx.function
    if function is None:
        return None
    flow = flow_of(ctx, function)
    assign = flow.reaching(name)
    if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
        return None
    made = host_made(ctx, assign.value)
    if made is None:
        return None
    if flow.loops_around(assign) != flow.loops_around(name):
        return None
    moved = False
    for use in flow.uses(assign):
        while isinstance(flow.parent.get(use), ast.Call) and unwrapped(ctx, flow.parent.get(use)) is use:
            use = flow.parent.get(use)  # `Variable(z)`: the same tensor
        move = flow.parent.get(use)
        call = flow.parent.get(move)
        if isinstance(move, ast.Attribute) and move.value is use and move.attr in ("to", "cuda") \
                and isinstance(call, ast.Call) and call.func is move:
            moved = True
        elif not isinstance(use, ast.Call):
            return None  # read as it is, on the host (a wrapped copy left on the CPU path reads nothing)
    return (made, made[1]) if moved else None


def device_target(ctx, call: ast.Call, method: str):
    """The device the tensor moves to (an expression, or '"cuda"' for `.cuda()`), or None
    when it is not surely a device."""
    extra = [k for k in call.keywords if k.arg not in ("device", "non_blocking")]
    if extra:
        return None
    if method == "cuda":
        # `.cuda(i)`, `.cuda(self.gpu_id)`: whatever `.cuda()` is given is a CUDA device
        # (an index `device=` takes as one too).
        given = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
        return '"cuda"' if not given else given[0]
    else:
        given = list(call.args) + [k.value for k in call.keywords if k.arg == "device"]
        if len(given) != 1:
            return None
        target = given[0]
    return target if is_device(ctx, target) else None


def is_device(ctx, expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant):
        if isinstance(expr.value, str):
            return expr.value.split(":")[0] in ("cuda", "mps", "xpu", "hpu", "npu", "meta") or expr.value == "cuda"
        return type(expr.value) is int
    if isinstance(expr, ast.Call):
        if ctx.qualname(expr.func) != "torch.device" or not expr.args:
            return False
        return not (isinstance(expr.args[0], ast.Constant) and expr.args[0].value == "cpu")
    name = (identifier(expr) or "").lower()
    return name == "dev" or "device" in name and "cpu" not in name
