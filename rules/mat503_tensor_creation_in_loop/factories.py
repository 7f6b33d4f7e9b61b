"""MAT503: the tensor a call makes and the device it goes to: torch's factories (fills, random
draws, tensors from data, legacy constructors), the ops a made tensor keeps its place through,
the name that carries a host-made tensor to its copy, and what is surely a device."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.layout import unpacked_item
from matlint.semantic.loops import identifier
from matlint.semantic.project import imported_files, imported_function, parsed, read_text, while_unchanged
from matlint.semantic.steps import runs_once
from matlint.semantic.kinds import TENSOR, cuda_tensor_type, kind_of
from matlint.semantic.tree import dotted, walk_no_scopes

# Factories built from sizes alone (their values, to the last bit, in `same_values_on_device`).
FILLS = {"zeros", "ones", "full", "empty", "arange", "range", "eye", "linspace", "logspace", "tril_indices", "triu_indices"}
# Factories that take sizes: every positional argument, but only the first of `full` and the last of
# `randint` (the others are values).
SIZED_FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "eye"}
# Factories whose values come from the generator of the device they are created on.
RANDOM = {"rand", "randn", "randint", "randperm", "normal", "bernoulli"}
FROM_DATA = {"tensor", "as_tensor", "asarray", "Tensor"} | _kinds.TYPED_TENSORS.keys()
# Legacy constructors: `torch.Tensor(2, 4)` takes sizes (uninitialised memory), `torch.Tensor([2, 4])` data;
# the typed ones (`torch.IntTensor`) make their dtype.
LEGACY_CONSTRUCTORS = {"Tensor": "", **{name: f"dtype={dtype}, " for name, dtype in _kinds.TYPED_TENSORS.items()}}
# Ops whose result lives where their input does (`torch.tril(torch.ones(T, T)).to(device)`).
_SAME_DEVICE_FUNCTIONS = {"torch.tril", "torch.triu", "torch.autograd.Variable", "torch.autograd.variable.Variable"}
_SAME_DEVICE_METHODS = {"tril", "triu", "bool", "float", "half", "bfloat16", "long", "int"}
# ... and, in the expression that makes a tensor, the methods that reshape, retype, clamp or fill
# it where it is, whatever their arguments (`torch.arange(n).unsqueeze(0).repeat(b, 1)`,
# `torch.empty(1, 1).type_as(x).fill_(v)`, `torch.FloatTensor(b, 1).uniform_(0, 1)`; `type_as`
# may move it, after it was made on the host all the same).
_MAKING_METHODS = _SAME_DEVICE_METHODS | {
    "unsqueeze", "squeeze", "view", "reshape", "expand", "expand_as", "repeat", "transpose", "permute", "t",
    "flatten", "contiguous", "type", "type_as", "clamp", "fill_", "zero_", "uniform_", "normal_", "random_"}
# ... and those that fill it where a mask of its own values says (`mask.float().masked_fill(mask == 0,
# float("-inf"))`): a mask from elsewhere may be on the device, and then the fill cannot be made there.
_MASKED_FILLS = {"masked_fill", "masked_fill_"}
# ... and the torch functions of one tensor that compute on it where it is (`torch.exp(-c *
# torch.arange(half) / half)`): their values may round differently on the device.
_MAKING_FUNCTIONS = {"torch.exp", "torch.log", "torch.sin", "torch.cos", "torch.sqrt", "torch.rsqrt",
                     "torch.sigmoid", "torch.flip"}
# ... and those that give the same values on any device (`torch.clamp(noise, -c, c)`).
_EXACT_MAKING_FUNCTIONS = {"torch.clamp", "torch.clip"}
# Ops between a factory and its move after which the values on the device may differ from the
# host's (a random fill; a transcendental function, below), or whose result may sit on another
# device than the move's (`type_as(y)` goes to y's): the `device=` fix is not safe through them.
_UNSAFE_METHODS = {"uniform_", "normal_", "random_", "type_as", "type"}
# torch functions that join tensors: the result is made on the host when every part is.
_JOINS = {f"torch.{name}" for name in _kinds.JOINS}


def same_values_on_device(name: str, call: ast.Call) -> bool:
    """Whether the factory gives bit-identical values on any device: fills of one value, and
    `arange` stepping by a whole number. Interpolating factories round differently per device."""
    if name in ("linspace", "logspace") or name not in FILLS:
        return False
    if name in ("arange", "range"):
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


def legacy_sizes(ctx, name: str, call: ast.Call) -> bool:
    """`torch.Tensor(2, 4)`, `torch.FloatTensor(3)`, `torch.LongTensor(num, num_priors)`: sizes,
    not data (a legacy constructor takes data as its one argument; one size is a whole number)."""
    if name not in LEGACY_CONSTRUCTORS or not call.args or any(isinstance(a, ast.Starred) for a in call.args):
        return False
    if len(call.args) > 1:
        return True
    size = call.args[0]
    return isinstance(size, ast.Constant) and type(size.value) is int or _is_tensor_size(ctx, size) \
        or _whole_number(ctx, size)


def _whole_number(ctx, expr: ast.AST, named: bool = True) -> bool:
    """`len(x)`, `int(n)`, `x.size(0)`, `x.shape[0]`: spelled as a whole number; or a name that each
    of its bindings binds to one (`batch_size = input_char.size(0)`)."""
    if isinstance(expr, ast.Name) and named:
        entries = _kinds.bindings(ctx, expr.id) or []
        return bool(entries) and all(e[0] == "value" and _whole_number(ctx, e[1], False) for e in entries)
    if isinstance(expr, ast.Call) and expr.args and not expr.keywords:
        if isinstance(expr.func, ast.Name) and expr.func.id in ("len", "int") and ctx.qualname(expr.func) is None:
            return len(expr.args) == 1
        return isinstance(expr.func, ast.Attribute) and expr.func.attr == "size" and len(expr.args) == 1
    return isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape" \
        and isinstance(expr.slice, (ast.Constant, ast.UnaryOp))


def _is_tensor_size(ctx, expr: ast.AST) -> bool:
    """`x.shape` of a value not known to be other than a tensor, `x.size()`: a `torch.Size`,
    which a legacy constructor takes as sizes (`torch.Tensor(x.shape)` allocates, like
    `torch.empty(x.shape)`; the tuple of a numpy array's `.shape` would be data)."""
    if isinstance(expr, ast.Attribute):
        return expr.attr == "shape" and _kinds.kind_of(ctx, expr.value) not in _kinds.NON_TENSORS
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "size" \
        and not expr.args and not expr.keywords


def _is_number(ctx, expr: ast.AST, depth: int = 0) -> bool:
    """A Python number: a literal, a name or attribute of that kind, `math.log(p)`, `len(x)`,
    arithmetic of them (`-math.log(max_period)`, `n - 1`), a whole division of a name that is
    not a tensor (`dim // 2`), and a name assigned one of these (`half = dim // 2`)."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
    if isinstance(expr, ast.UnaryOp):
        return isinstance(expr.op, (ast.USub, ast.UAdd)) and _is_number(ctx, expr.operand, depth)
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.FloorDiv) and isinstance(expr.left, ast.Name) and isinstance(
                expr.right, ast.Constant) and type(expr.right.value) is int:
            return _kinds.kind_of(ctx, expr.left) not in _kinds.TENSORS
        return _is_number(ctx, expr.left, depth) and _is_number(ctx, expr.right, depth)
    if isinstance(expr, ast.Call):
        qualname = ctx.qualname(expr.func) or ""
        return qualname.startswith("math.") or isinstance(expr.func, ast.Name) and expr.func.id in (
            "len", "int", "float") and qualname in ("", "len", "int", "float", "builtins." + expr.func.id)
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    if _kinds.kind_of(ctx, expr) == _kinds.SCALAR:
        return True
    if isinstance(expr, ast.Name) and depth < 2:
        flow = flow_of(ctx, ctx.scope)
        assign = flow.reaching(expr) if expr in flow.parent else None
        return assign is not None and _is_number(ctx, assign.value, depth + 1)
    return False


def unwrapped(ctx, expr: ast.AST, making: bool = False) -> ast.AST:
    """`expr` without the calls that keep its device (`Variable(z)`, `z.float()`); `making`:
    also through what may follow a factory in the expression that makes a tensor
    (`torch.ones(T, T).tril(1)`, `torch.arange(n).unsqueeze(0).repeat(b, 1)`, arithmetic with a
    number: `torch.ones(n) * i`, `-c * torch.arange(h) / h`, `torch.exp(...)`, new axes:
    `torch.eye(d)[None]`), and into the first part of a join of tensors all made so (`torch.cat([torch.arange(b) for _ in views])`)."""
    while True:
        if isinstance(expr, ast.BinOp):
            if not (making and isinstance(expr.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))):
                return expr
            if _is_number(ctx, expr.right):
                expr = expr.left
            elif _is_number(ctx, expr.left):
                expr = expr.right
            elif _fills(ctx, expr.left) and _fills(ctx, expr.right):  # `torch.ones(n) - torch.eye(n)`
                expr = expr.left
            else:
                return expr
            continue
        if making and isinstance(expr, ast.Compare) and len(expr.comparators) == 1:
            # `labels.unsqueeze(0) == labels.unsqueeze(1)`, `t > 0`: where its operands are
            left, right = (unwrapped(ctx, side, making=True) for side in (expr.left, expr.comparators[0]))
            if not (_is_number(ctx, right) or isinstance(left, ast.Name) and isinstance(right, ast.Name)
                    and left.id == right.id):
                return expr
            expr = left
            continue
        if making and isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.Invert)):
            expr = expr.operand
            continue
        if making and isinstance(expr, ast.Subscript) and _new_axes_only(expr.slice):
            expr = expr.value  # `torch.eye(d)[None, :, :]`: every value, with a new axis
            continue
        if not isinstance(expr, ast.Call):
            return expr
        func = expr.func
        qualname = ctx.qualname(func)
        if making and isinstance(func, ast.Attribute) and qualname is None and func.attr in _MASKED_FILLS:
            receiver, mask = unwrapped(ctx, func.value, making=True), None
            if len(expr.args) == 2 and not expr.keywords and _is_number(ctx, expr.args[1]):
                mask = unwrapped(ctx, expr.args[0], making=True)
            if not (isinstance(mask, ast.Name) and isinstance(receiver, ast.Name) and mask.id == receiver.id):
                return expr
            expr = func.value
            continue
        if isinstance(func, ast.Attribute) and qualname is None and (
                func.attr in _SAME_DEVICE_METHODS and not expr.keywords and (
                    not expr.args or making and func.attr in ("tril", "triu"))
                or making and func.attr in _MAKING_METHODS):
            expr = func.value
        elif (qualname in _SAME_DEVICE_FUNCTIONS or making and (
                qualname in _MAKING_FUNCTIONS or qualname in _EXACT_MAKING_FUNCTIONS)) and expr.args \
                and not isinstance(expr.args[0], ast.Starred):
            expr = expr.args[0]
        elif making and qualname in _JOINS and expr.args:
            parts = _joined(expr.args[0])
            if not parts or not all(_fills(ctx, part) for part in parts):
                return expr
            expr = parts[0]
        else:
            return expr


def _new_axes_only(index: ast.AST) -> bool:
    """An index that keeps every value and only adds axes: `None`, `:` and `...` (`[None, :, :]`)."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return any(isinstance(p, ast.Constant) and p.value is None for p in parts) and all(
        isinstance(p, ast.Constant) and (p.value is None or p.value is Ellipsis)
        or isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None for p in parts)


def computed_number(ctx, expr: ast.AST) -> bool:
    """`i / self.n_T`, `-(t - 1)`: a Python number computed on this pass (arithmetic that only
    numbers do: a tuple or a string cannot be divided or subtracted); or the counter of a loop
    around it over `range(...)` (`for i in reversed(range(T))`)."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return computed_number(ctx, expr.operand)
    if isinstance(expr, (ast.List, ast.Tuple)) and len(expr.elts) == 1:  # `[i / n_T]`: a tensor of one
        return computed_number(ctx, expr.elts[0])
    if isinstance(expr, ast.Name):
        return any(isinstance(loop.node, (ast.For, ast.AsyncFor)) and isinstance(loop.node.target, ast.Name)
                   and loop.node.target.id == expr.id and _over_range(loop.node.iter) for loop in ctx.loops)
    return isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Div, ast.Sub, ast.FloorDiv, ast.Pow)) \
        and all(_is_number(ctx, side) or _range_bound(ctx, side) for side in (expr.left, expr.right))


def _over_range(it: ast.AST) -> bool:
    """`range(...)`, also through `reversed`, `tqdm` or `list`: the loop counts."""
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("reversed", "tqdm", "list") \
            and len(it.args) == 1:
        it = it.args[0]
    return isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"


def _range_bound(ctx, expr: ast.AST) -> bool:
    """`self.n_T` where the function also passes it to `range(...)` (`for i in range(self.n_T, 0,
    -1)`): a whole number, since `range` takes nothing else."""
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    key = ("range_bounds", id(ctx.scope))
    bounds = ctx.shared.get(key)
    if bounds is None:
        bounds = ctx.shared[key] = {
            ast.dump(arg) for call in ast.walk(ctx.scope) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name) and call.func.id == "range" and ctx.qualname(call.func) in (
                None, "range", "builtins.range") for arg in call.args}
    return ast.dump(expr) in bounds


def repeated_number(ctx, expr: ast.AST, depth: int = 0) -> Optional[tuple]:
    """(the number, the shape) of a nest of lists of one Python number (a loop variable over a
    range, arithmetic of numbers): `[i] * n` or `n * [i]` is `(n,)`, `[i for _ in range(n)]` too,
    `[[i]] * n` is `(n, 1)` and `[[i] * n]` is `(1, n)`; a shape holds count expressions and 1s.
    Repeated by a count, the one value may also be an attribute not known to hold anything else
    (`[self.vocab.SOS] * batch_size`, set up once); not alone (`[[self.token]]`, which may be a
    value read off a tensor), nor a name (`[box] * 4` of a loop's item may repeat a list).
    `torch.full(shape, i, device=d)` fills it on the device. None for anything else."""
    found = _repeated(ctx, expr, 0)
    if found is None or _is_number(ctx, found[0]):
        return found
    repeated = [d for d in found[1] if not (d == 1 if isinstance(d, int) else isinstance(d, ast.Constant) and d.value == 1)]
    return found if repeated else None


def _repeated(ctx, expr: ast.AST, depth: int) -> Optional[tuple]:
    if depth > 4:
        return None
    if depth and (_is_number(ctx, expr) or isinstance(expr, ast.Attribute)
                  and kind_of(ctx, expr) in (None, _kinds.SCALAR)):
        return expr, ()
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        for items, count in ((expr.left, expr.right), (expr.right, expr.left)):
            if isinstance(items, ast.List) and len(items.elts) == 1 and not isinstance(count, (ast.List, ast.Tuple)):
                inner = _repeated(ctx, items.elts[0], depth + 1)
                if inner is not None:
                    return inner[0], (count,) + inner[1]
        return None
    if isinstance(expr, ast.List) and len(expr.elts) == 1:
        inner = _repeated(ctx, expr.elts[0], depth + 1)
        # `[i]` alone is a constant or a number of the pass (see `computed_number`); inside a nest it is a row
        return (inner[0], (1,) + inner[1]) if inner is not None and (depth or inner[1]) else None
    if isinstance(expr, ast.ListComp) and len(expr.generators) == 1:
        gen = expr.generators[0]
        it = gen.iter
        if (gen.ifs or gen.is_async or not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                                             and it.func.id == "range" and len(it.args) == 1 and not it.keywords)):
            return None
        own = {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        if any(isinstance(n, ast.Name) and n.id in own for n in ast.walk(expr.elt)):
            return None  # `[t for t in range(n)]`: a range, not one value
        inner = _repeated(ctx, expr.elt, depth + 1)
        return (inner[0], (it.args[0],) + inner[1]) if inner is not None else None
    return None


# Conversions that keep a tensor's values (`.data`, `.detach()`, `.numpy()`, `.astype(np.int32)`), and
# those among them that copy the values to the host.
_CONVERSIONS = {"cpu", "detach", "numpy", "tolist", "astype", "long", "int", "float", "bool", "byte", "contiguous"}
_TO_HOST = {"cpu", "numpy", "tolist"}


def round_trip_source(ctx, data: ast.AST) -> Optional[ast.AST]:
    """The tensor whose values `data` only converts after copying them to the host
    (`mask.data.cpu().numpy().astype(np.int32).tolist()`, `np.asarray(x.cpu())`), when that
    tensor is not known to be on the host: a tensor made from `data` and moved back to the device
    is a round trip. None where `data` computes anything on the way."""
    expr, copied = data, False
    while True:
        if isinstance(expr, ast.Attribute) and expr.attr == "data":
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _CONVERSIONS \
                and ctx.qualname(expr.func) is None:
            copied = copied or expr.func.attr in _TO_HOST
            expr = expr.func.value
        elif isinstance(expr, ast.Call) and ctx.qualname(expr.func) in ("numpy.array", "numpy.asarray") \
                and len(expr.args) == 1:
            expr = expr.args[0]
        else:
            break
    if not copied or not isinstance(expr, (ast.Name, ast.Attribute, ast.Subscript)):
        return None
    return expr if _kinds.kind_of(ctx, expr) not in (_kinds.CPU_TENSOR,) + _kinds.NON_TENSORS else None


def set_once_attribute(ctx, expr: ast.AST) -> bool:
    """`self.max_action` of a class (an `nn.Module`, a noise scheduler) whose methods assign it
    only where they run once (`__init__`, `build`, `reset_parameters`...) and never change it in
    place: the same data on every call, a constant of the object."""
    cls = ctx.class_
    if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"
            and cls is not None and ctx.function is not None and len(ctx.functions) == 1):
        return False
    key = ("set_once_attribute", id(cls), expr.attr)
    found = ctx.shared.get(key)
    if found is None:
        values = _kinds.class_attribute_values(ctx, cls, expr.attr)
        found = ctx.shared[key] = bool(values) and all(
            runs_once(getattr(method, "name", "")) for method, _ in values) and (
            expr.attr not in _kinds.mutated_attributes(ctx, cls))
    return found


def constant_values(ctx, expr: ast.AST) -> bool:
    """Data that is the same on every pass: literals, a set-once attribute (`set_once_attribute`),
    a module constant (`module_constant`), the `len()` of one (`len(self.anchor_mask)`), or a
    list or tuple of them (`[self.gamma]`)."""
    if is_constant_data(expr) or set_once_attribute(ctx, expr) or module_constant(ctx, expr):
        return True
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "len" \
            and len(expr.args) == 1 and not expr.keywords and not ctx.names.binds_locally("len"):
        return constant_values(ctx, expr.args[0])
    return isinstance(expr, (ast.List, ast.Tuple)) and bool(expr.elts) and all(
        constant_values(ctx, e) for e in expr.elts)


def numpy_literal(ctx, expr: ast.AST) -> bool:
    """`np.array([1, 0, 0])`, also cast (`.astype(np.float32)`, `dtype=`): an array of literals,
    the same on every pass."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "astype" \
            and ctx.qualname(expr.func) is None:
        expr = expr.func.value
    return (isinstance(expr, ast.Call) and ctx.qualname(expr.func) in ("numpy.array", "numpy.asarray")
            and len(expr.args) == 1 and is_constant_data(expr.args[0]))


def range_data(ctx, expr: ast.AST) -> bool:
    """`range(n)`, `list(range(n))`: the values `torch.arange` makes."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "list" and len(
            expr.args) == 1 and not ctx.names.binds_locally("list"):
        expr = expr.args[0]
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "range"
            and not expr.keywords and 1 <= len(expr.args) <= 3 and not ctx.names.binds_locally("range"))


def _fills(ctx, expr: ast.AST) -> bool:
    """`expr` is made on the host by a fill or a random factory from sizes (not from data)."""
    made = host_made(ctx, expr)
    return made is not None and (made[0] in FILLS or made[0] in RANDOM)


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
    same values, on the move's device, when the factory makes it there: not through a random
    fill (`.uniform_(0, 1)`), a function whose rounding may differ (`torch.exp`), or a retype
    that may move it elsewhere (`.type_as(y)`)."""
    made = {id(node) for node in ast.walk(factory)}
    return not any(
        isinstance(node, ast.Call) and id(node) not in made and (
            isinstance(node.func, ast.Attribute) and node.func.attr in _UNSAFE_METHODS
            or ctx.qualname(node.func) in _MAKING_FUNCTIONS)
        for node in ast.walk(moved))


def host_attribute(ctx, expr: ast.AST, moved: ast.AST) -> Optional[tuple]:
    """(`self.<attr>`, (name, factory call)) when `expr` is that attribute, or a slice of it
    (`self.pe[:, :n]`), of an `nn.Module` whose set-up assigns it (never in place, never as a
    buffer or parameter) a tensor made on the host: a factory without `device=`, through a name
    (`pe = torch.zeros(...)`, ..., `self.pe = pe.unsqueeze(0)`) or a function of the file or
    project that returns one (`get_positional_encoding(d, n)`); or a tensor handed to the
    constructor (`self.pe = pe`, ("argument", None)), which the move in `forward` says is not on
    the device, where `moved` (the expression moved) shows it is a tensor: sliced over several
    dims (`self.pe[:, :n]`) or through tensor ops (`self.mask.repeat(b, 1, 1)`); a module or
    parameter handed in is registered, and its move is a no-op. `model.to(device)` leaves such a
    tensor where it is, so a move of it in `forward` copies it on every call."""
    tensor_use = moved is not expr
    while isinstance(expr, ast.Subscript):
        tensor_use = tensor_use or isinstance(expr.slice, ast.Tuple)
        expr = expr.value
    if not set_once_attribute(ctx, expr):
        return None
    made = _attribute_made_on_host(ctx, ctx.class_, expr.attr)
    if made is None or made[0] == "argument" and not tensor_use:
        return None
    return expr, made


def _attribute_made_on_host(ctx, cls: ast.ClassDef, attr: str, depth: int = 0) -> Optional[tuple]:
    """(name, factory call) of the host tensor every value of `self.<attr>` in `cls` holds (not a
    buffer or parameter): a factory without `device=`, through a name, a function that returns
    one, or another such attribute computed on the host (`self.alphas = 1. - self.betas` after
    `self.betas = torch.linspace(...)`); ("argument", None) for a tensor handed to the
    constructor."""
    key = ("host_attribute", id(cls), attr)
    made = ctx.shared.get(key, False)
    if made is not False:
        return made
    ctx.shared[key] = None  # while it is read: `self.a` made from `self.b` made from `self.a`
    made = None
    registers = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("register_buffer", "register_parameter") and n.args
                    and isinstance(n.args[0], ast.Constant) and n.args[0].value == attr
                    for n in ast.walk(cls))
    values = _kinds.class_attribute_values(ctx, cls, attr)
    if not registers and values:
        for method, value in values:
            inner = unwrapped(ctx, value, making=True)
            if isinstance(inner, ast.Name):
                assign = flow_of(ctx, method).reaching(inner)
                if assign is None and inner.id in _parameter_names(method):
                    made = made or ("argument", None)  # a tensor handed to the constructor
                    continue
                inner = unwrapped(ctx, assign.value, making=True) if assign is not None else None
            if (isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "self"
                    and depth < 4 and runs_once(getattr(method, "name", ""))):
                found = _attribute_made_on_host(ctx, cls, inner.attr, depth + 1)
                found = found if found is not None and found[0] != "argument" else None
            else:
                found = host_made(ctx, inner) if inner is not None else None
            if found is None and isinstance(inner, ast.Call):
                helper = helper_made(ctx, inner)
                found = helper[1] if helper is not None else None
            if found is None or any(k.arg in ("device", None) for k in found[1].keywords):
                made = None
                break
            made = made or found
    ctx.shared[key] = made
    return made


def _parameter_names(function) -> set:
    args = getattr(function, "args", None)
    if args is None:
        return set()
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}


def torch_factory(ctx, expr: ast.AST) -> Optional[tuple]:
    """(name, call) for a call of a function of `torch` (`torch.zeros(n)`: ("zeros", the call))."""
    if not isinstance(expr, ast.Call):
        return None
    qualname = ctx.qualname(expr.func) or ""
    module, _, name = qualname.rpartition(".")
    return (name, expr) if module == "torch" else None


def host_made(ctx, expr: ast.AST) -> Optional[tuple]:
    """The factory call that makes `expr`, directly or through ops that keep its device
    (`torch.ones(T, T).tril().bool()`), as `torch_factory` gives it; ("sample", the call) for
    a draw from a distribution of Python numbers (`host_sample`); ("random_fill", the call) for
    random values written over a tensor a factory made on the host (`random_fill_on_host`)."""
    outer = unwrapped(ctx, expr)
    if random_fill_on_host(ctx, outer):
        return "random_fill", outer
    inner = unwrapped(ctx, expr, making=True)
    made = torch_factory(ctx, inner)
    if made is None and host_sample(ctx, inner):
        return "sample", inner
    return made


# Methods that overwrite every element of their tensor with random values, in place.
RANDOM_FILLS = frozenset({"normal_", "uniform_", "bernoulli_", "exponential_", "random_", "geometric_", "cauchy_",
                          "log_normal_"})


def random_fill_on_host(ctx, expr: ast.AST) -> bool:
    """`torch.FloatTensor(action).data.normal_(0, s)`: a tensor made on the host from data, whose
    values the fill then draws there (the data counts only for its shape). A fill of a tensor
    made from sizes (`torch.Tensor(n, d).normal_()`) is the factory's finding."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in RANDOM_FILLS
            and ctx.qualname(expr.func) is None):
        return False
    base = expr.func.value
    while isinstance(base, ast.Attribute) and base.attr == "data":
        base = base.value
    made = torch_factory(ctx, unwrapped(ctx, base, making=True))
    return (made is not None and made[0] in FROM_DATA | {"from_numpy"} and not legacy_sizes(ctx, *made)
            and not any(k.arg in ("device", None, "out") for k in made[1].keywords))


def host_sample(ctx, expr: ast.AST) -> bool:
    """`Normal(0, 1).sample(shape)`, or `normal.sample()` after `normal = Normal(0, 1)`: a
    distribution of `torch.distributions` given Python numbers holds CPU tensors, and draws there."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in ("sample", "rsample")):
        return False
    made = expr.func.value
    if isinstance(made, ast.Name):
        flow = flow_of(ctx, ctx.scope)
        assign = flow.reaching(made) if made in flow.parent else None
        made = assign.value if assign is not None else None
    return (isinstance(made, ast.Call) and (ctx.qualname(made.func) or "").startswith("torch.distributions.")
            and bool(made.args) and all(_is_number(ctx, a) for a in made.args)
            and all(_is_number(ctx, k.value) for k in made.keywords if k.arg != "validate_args"))


def carried_to_move(ctx, name: ast.Name) -> Optional[tuple]:
    """(factory, its call) when `name` holds a tensor made on the host by the one assignment
    that reaches this move, at the same loop depth, and every read of it is a move to the
    device (`z = torch.randn(b, 100)` ... `z = z.cuda()`), the CPU path's copy of it (`if
    x.is_cuda: z = z.cuda()`, then `z` read on either path), or the next step of making it
    (`alpha = torch.rand(n, 1)`, `alpha = alpha.expand_as(x)`, then the move): the names only
    carry the tensor to the copy."""
    flow = flow_of(ctx, ctx.scope)
    within = None  # the value of the assignment the name is read in, on a later step
    for _ in range(4):
        assign = flow.reaching(name)
        if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
            return None
        made = host_made(ctx, assign.value)
        inner = unwrapped(ctx, assign.value, making=True) if made is None else None
        if made is None and not isinstance(inner, ast.Name):
            return None  # the cheap test first: most names hold what no factory made
        if not _carried_at_depth(ctx, flow, assign, name, within):
            return None
        if made is not None:
            return made, made[1]
        name, within = inner, assign.value
    return None


def carried_from_helper(ctx, name: ast.Name) -> Optional[ast.Call]:
    """The call of a helper of the file or the project whose result `name` holds, by the one
    assignment that reaches this move at the same loop depth, every read of it a move
    (`src_mask = generate_square_subsequent_mask(n)`, then `model(x, src_mask.cuda())`)."""
    flow = flow_of(ctx, ctx.scope)
    assign = flow.reaching(name)
    if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name) \
            or not isinstance(assign.value, ast.Call) or not _carried_at_depth(ctx, flow, assign, name, None):
        return None
    return assign.value


def carried_from_branches(ctx, name: ast.Name) -> list:
    """[(factory, its call)], one per assignment, when several assignments reach this move of
    `name` (`if done: bit = torch.Tensor([0])` / `else: bit = torch.Tensor([1])`, then
    `bit = bit.cuda()`), each makes a tensor on the host at the move's loop depth, and every
    read of what each stores is a move (as `carried_to_move` asks of one)."""
    flow = flow_of(ctx, ctx.scope)
    reaching = flow.reaching_all(name)
    if len(reaching) < 2 or not all(simple for _, simple in reaching):
        return []
    found = []
    for assign, _ in reaching:
        if len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
            return []
        made = host_made(ctx, assign.value)
        if made is None or not _carried_at_depth(ctx, flow, assign, name, None):
            return []
        found.append((made, made[1]))
    return found


def carried_through_join(ctx, name: ast.Name) -> list:
    """[(factory, its call)], one per part, when the one assignment that reaches this move of
    `name` joins tensors (`lbl = torch.cat((lbl_1, lbl_2), 1)`, then `lbl.cuda()`), each part a
    name that an assignment at the move's loop depth made on the host and that goes only into the
    join (`lbl_1 = torch.ones(b, n)`), and the joined value only goes on to the copy. Empty
    otherwise."""
    flow = flow_of(ctx, ctx.scope)
    assign = flow.reaching(name)
    if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
        return []
    join = assign.value
    parts = _joined(join.args[0]) if isinstance(join, ast.Call) and join.args and ctx.qualname(join.func) in _JOINS else []
    if not parts or not _carried_at_depth(ctx, flow, assign, name, None):
        return []
    found = []
    for part in parts:
        made = None
        if isinstance(part, ast.Name):
            made_by = flow.reaching(part)
            if made_by is not None and len(made_by.targets) == 1 and isinstance(made_by.targets[0], ast.Name) \
                    and flow.loops_around(made_by) == flow.loops_around(name) \
                    and all(any(use is sub for sub in ast.walk(join)) for use in flow.uses(made_by)):
                made = host_made(ctx, made_by.value)
        if made is None:
            return []
        found.append((made, made[1]))
    return found


def _carried_at_depth(ctx, flow, assign: ast.Assign, name: ast.Name, within: Optional[ast.AST]) -> bool:
    """`assign` sits in the same loops as the read `name` of what it stores, and that value
    only goes on to the copy (`_only_carried`)."""
    return flow.loops_around(assign) == flow.loops_around(name) and _only_carried(ctx, flow, assign, within)


def _only_carried(ctx, flow, assign: ast.Assign, within: Optional[ast.AST]) -> bool:
    """Every read of the value `assign` stores moves it to the device, leaves a wrapped copy on
    the CPU path (`Variable(z)`), is a read on the CPU path of a conditional move (`if cuda: z =
    z.cuda()`), or lies in `within` (the next step of making it); at the last step (`within`
    None), one read is a move."""
    moved = False
    inside = {id(node) for node in ast.walk(within)} if within is not None else set()
    uninitialised = _uninitialised(ctx, assign.value)
    for use in flow.uses(assign):
        if id(use) in inside:
            continue
        while isinstance(flow.parent.get(use), ast.Call) and unwrapped(ctx, flow.parent.get(use)) is use:
            use = flow.parent.get(use)  # `Variable(z)`: the same tensor
        made = _made_further(ctx, flow.parent, use)  # `alpha.expand_as(x).to(d)`
        if moved_by(ctx, flow.parent, use) is not None or moved_by(ctx, flow.parent, made) is not None:
            moved = True
        elif isinstance(use, ast.Call):
            continue  # a wrapped copy left on the CPU path reads nothing
        elif uninitialised and _passed(flow.parent, use):
            continue  # `match(..., conf_t, idx)`: filled where it was made
        elif _constant_fill(flow, assign, use):
            continue  # `attr[:, 0] = 4`: the device fills it alike
        elif not _moved_on_other_path(ctx, flow, assign, use) and not _moved_in_other_arm(ctx, flow, assign, use):
            return False  # read as it is, on the host
    return moved or within is not None


def _constant_fill(flow, assign: ast.Assign, use: ast.Name) -> bool:
    """`use` is the tensor of a store of a number into part of it (`attr[:, 0] = 4`), in the same
    loops as `assign`: one fill, which the device does alike once the tensor is made there. A
    fill in a loop of its own (element by element) is not."""
    target = flow.parent.get(use)
    statement = flow.parent.get(target)
    if not (isinstance(target, ast.Subscript) and target.value is use and isinstance(target.ctx, ast.Store)
            and isinstance(statement, ast.Assign) and any(t is target for t in statement.targets)):
        return False
    value = statement.value.operand if isinstance(statement.value, ast.UnaryOp) else statement.value
    return (isinstance(value, ast.Constant) and isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
            and flow.loops_around(statement) == flow.loops_around(assign))


def _uninitialised(ctx, value: ast.AST) -> bool:
    """`value` allocates a tensor without values (`torch.empty(n)`, `torch.LongTensor(n, m)`):
    a function it is passed to fills it."""
    made = torch_factory(ctx, value)
    return made is not None and (made[0] == "empty" or legacy_sizes(ctx, *made))


def _passed(parent: dict, use: ast.Name) -> bool:
    """`use` is an argument of a call (`fill(out)`), not its receiver."""
    call = parent.get(use)
    return isinstance(call, ast.Call) and any(a is use for a in call.args)


def _made_further(ctx, parent: dict, use: ast.AST) -> ast.AST:
    """The largest expression around `use` that `unwrapped(..., making=True)` goes back into
    `use` from (`alpha.expand_as(x)` around `alpha`): what makes the tensor further."""
    node = use
    while True:
        up = parent.get(node)
        if isinstance(up, ast.Attribute) and up.value is node:
            up = parent.get(up)
            if not (isinstance(up, ast.Call) and isinstance(up.func, ast.Attribute) and up.func.value is node):
                return node
        if not isinstance(up, (ast.Call, ast.BinOp, ast.UnaryOp, ast.Compare)) or unwrapped(
                ctx, up, making=True) is not use:
            return node
        node = up


def _moved_on_other_path(ctx, flow, assign: ast.Assign, use: ast.Name) -> bool:
    """`use` reads `assign`'s tensor or its copy on the device, stored by a conditional `z =
    z.cuda()` that reads `assign` (`if x.is_cuda: z = z.cuda()`): without the device, the
    tensor stays where it was made, and the copy is the device's cost."""
    # The move reaches `use` (`if cuda: z = z.cuda()` then `f(z)`), or stands in the other arm
    # (`if cuda: z = z.cuda()` / `else: z = z`).
    stores = flow.reaching_all(use) + [(store, simple) for store, simple in flow.stores.get(use.id, ())
                                       if store is not None and flow.in_exclusive_arms(store, use)]
    for store, simple in stores:
        if store is assign:
            continue
        value = store.value if simple else unpacked_item(store, use.id)
        moved = moved_expression(ctx, value)
        inner = unwrapped(ctx, moved) if moved is not None else None
        if isinstance(inner, ast.Name) and inner.id == use.id and any(
                reaching is assign for reaching, _ in flow.reaching_all(inner)):
            return True
    return False


def _moved_in_other_arm(ctx, flow, assign: ast.Assign, use: ast.Name) -> bool:
    """`use` reads `assign`'s tensor as it is in one arm of an `if` whose other arm moves it (`if
    self.gpu: return h.cuda()` / `else: return h`): the CPU path's copy."""
    return any(other is not use and moved_by(ctx, flow.parent, other) is not None and flow.in_exclusive_arms(other, use)
               for other in flow.uses(assign))


def moved_by(ctx, parent: dict, expr: ast.AST) -> Optional[ast.Call]:
    """The call that copies `expr` to the device where it stands: `expr.cuda()`, `expr.to(d)`,
    `expr.type(torch.cuda.FloatTensor)`, or a helper of this file that returns its argument
    moved (`self.get_torch_variable(expr)`); None elsewhere."""
    up = parent.get(expr)
    call = parent.get(up)
    if isinstance(up, ast.Attribute) and up.value is expr and isinstance(call, ast.Call) and call.func is up \
            and moved_expression(ctx, call) is expr:
        return call
    if isinstance(up, ast.Call) and moved_expression(ctx, up) is expr:
        return up
    return None


def moved_expression(ctx, call: ast.AST) -> Optional[ast.AST]:
    """The expression `call` copies to the device: the receiver of `.cuda(...)`, `.to(...)`,
    `.type(<a CUDA tensor type>)` or `.type_as(<a tensor not known to be on the CPU>)`, or the
    argument of a call of a helper of this file that returns its argument moved (`mover_helper`);
    None for other calls."""
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if isinstance(func, ast.Attribute) and (func.attr in ("cuda", "to") or len(call.args) == 1 and not call.keywords and (
            func.attr == "type" and cuda_tensor_type(ctx, call.args[0]) is not None
            or func.attr == "type_as" and kind_of(ctx, call.args[0]) == TENSOR)):
        return func.value
    if len(call.args) == 1 and has_mover_helpers(ctx) and mover_helper(ctx, func) is not None:
        return call.args[0]
    return None


def mover_helper(ctx, func: ast.AST) -> Optional[ast.AST]:
    """The function of this file, or of a project module it imports (`from utils import *`),
    that `func` calls (`to_device(x)`, `self.get_torch_variable(x)`, `tensor2var(x)`) when it
    takes one argument (others have defaults) and returns it moved to the device on some path
    (`return x.cuda()`, or `x = x.cuda()` then `return Variable(x)`) and as it is (or wrapped,
    `Variable(x)`) on the others: a copy to the device spelled as a call."""
    found = file_function(ctx, func)
    if found is None:
        imported = imported_function(ctx, func)
        found = (imported[0], False) if imported is not None else None
    if found is None:
        return None
    target, bound = found
    key = ("mover_helper", id(target))
    moves = ctx.shared.get(key)
    if moves is None:
        moves = ctx.shared[key] = _returns_argument_moved(ctx, target, bound)
    return target if moves else None


def file_function(ctx, func: ast.AST) -> Optional[tuple]:
    """(the function of this file that `func` calls, whether its first parameter is bound): a
    module-level `f(...)`, a method `self.m(...)` of the class around, or a method of a class of
    the file through a name the function assigns an instance of it (`diffusion =
    Diffusion(...)`, then `diffusion.sample_timesteps(n)`)."""
    table = _definitions(ctx)
    if isinstance(func, ast.Name):
        target = table.get(func.id)
        return (target, False) if isinstance(target, _FUNCTIONS) else None
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    cls = ctx.class_ if func.value.id == "self" else None
    if cls is None and any(
            isinstance(d, ast.ClassDef) and any(isinstance(m, _FUNCTIONS) and m.name == func.attr for m in d.body)
            for d in table.values()):
        flow = flow_of(ctx, ctx.scope)
        assign = flow.reaching(func.value) if func.value in flow.parent else None
        made = assign.value if assign is not None else None
        if isinstance(made, ast.Call) and isinstance(made.func, ast.Name):
            cls = table.get(made.func.id)
    if not isinstance(cls, ast.ClassDef):
        return None
    target = next((s for s in cls.body if isinstance(s, _FUNCTIONS) and s.name == func.attr), None)
    if target is None:
        return None
    return target, not any(dotted(d) == "staticmethod" for d in target.decorator_list)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _definitions(ctx) -> dict:
    """name -> the module-level function or class of this file bound to it (once)."""
    found = ctx.shared.get("mat503_definitions")
    if found is None:
        found = ctx.shared["mat503_definitions"] = {
            s.name: s for s in ctx.tree.body if isinstance(s, _FUNCTIONS + (ast.ClassDef,))}
    return found


def helper_made(ctx, expr: ast.AST) -> Optional[tuple]:
    """(the function, (name, factory call), the path of its module if not this file's) when `expr` calls a function of this file
    (`file_function`) or of a project module it imports (`from dataset import causal_mask`)
    every `return` of which gives a tensor its factory makes on the host
    (`return torch.randint(1, T, (n,))`, `out = torch.zeros(b, d); out[i, j] = 1; return out`)."""
    if not isinstance(expr, ast.Call):
        return None
    found, path = file_function(ctx, expr.func), None
    if found is None:
        found = imported_function(ctx, expr.func)
        path = found[1] if found is not None else None
    if found is None:
        return None
    target = found[0]
    key = ("host_made_return", id(target))
    made = ctx.shared.get(key, False)
    if made is False:
        made = ctx.shared[key] = _returned_host_made(ctx, target)
    return (target, made, path) if made is not None else None


def _returned_host_made(ctx, function: ast.AST) -> Optional[tuple]:
    flow = None
    made = None
    for ret in (n for n in walk_no_scopes(function) if isinstance(n, ast.Return)):
        value = ret.value
        for _ in range(4):
            # `return mask == 0` after `mask = torch.triu(...)`, also over several steps
            # (`mask = mask.float().masked_fill(mask == 0, -inf)`)
            inner = unwrapped(ctx, value, making=True) if value is not None else None
            if not isinstance(inner, ast.Name):
                break
            flow = flow or flow_of(ctx, function)
            assign = flow.reaching(inner)
            value = assign.value if assign is not None else None
        returned = host_made(ctx, value) if value is not None else None
        if returned is None:
            return None
        made = made or returned
    return made


def _returns_argument_moved(ctx, function: ast.AST, bound: bool) -> bool:
    args = function.args
    params = (args.posonlyargs + args.args)[1 if bound else 0:]
    if not params or len(params) - len(args.defaults) > 1 or args.vararg or args.kwarg or args.kwonlyargs:
        return False
    param = params[0].arg
    moved = False
    returns = []
    for node in walk_no_scopes(function):
        if isinstance(node, ast.Return):
            returns.append(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == param:
            if not _moves(ctx, node.value, param):
                return False  # the parameter rebound to something else
            moved = True  # `x = x.cuda()`, then returned
    for ret in returns:
        value = ret.value
        if value is None:
            return False
        if _moves(ctx, value, param):
            value, moved = value.func.value, True
        inner = unwrapped(ctx, value)
        if not (isinstance(inner, ast.Name) and inner.id == param):
            return False
    return moved and bool(returns)


def _moves(ctx, value: ast.AST, param: str) -> bool:
    """`value` is `param.cuda(...)` or `param.to(<something>)`, also of `param` wrapped in calls
    that keep its device (`Variable(param).cuda()`)."""
    func = value.func if isinstance(value, ast.Call) else None
    if not (isinstance(func, ast.Attribute) and func.attr in ("cuda", "to")
            and not (func.attr == "to" and not value.args and not value.keywords)):
        return False
    moved = unwrapped(ctx, func.value)
    return isinstance(moved, ast.Name) and moved.id == param


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


_MOVE_CALL = re.compile(r"\.(?:cuda|to)\(")
_RETURN_WORD = re.compile(r"\breturn\b")
_WORD_BEFORE = re.compile(r"\w+")
_REBOUND_WORD = re.compile(r"(?<!\w)(\w+) = \Z")


def _returns_moved(text: str) -> bool:
    """A line of `text` spells a `.cuda(`/`.to(` after `return`, or `x = x.cuda(` (a name moved
    and bound to itself). Scans for the move call and reads its line backwards from there."""
    for match in _MOVE_CALL.finditer(text):
        start = match.start()
        line = text.rfind("\n", 0, start) + 1
        if _RETURN_WORD.search(text, line, start):
            return True
        receiver = _WORD_BEFORE.match(text[start - 1:line - 1 if line else None:-1]) if start > line else None
        if receiver is not None:
            name = receiver.group(0)[::-1]
            begin = start - len(name)
            rebound = _REBOUND_WORD.search(text, line, begin)
            if rebound is not None and rebound.group(1) == name:
                return True
    return False


def has_mover_helpers(ctx) -> bool:
    """The file, or a project module it imports, defines a helper that returns its argument
    moved to the device (`mover_helper`): calls of it are moves. Only a file with a `return ...
    .cuda(` or `.to(` line, or an `x = x.cuda(` one, can."""
    found = ctx.shared.get("has_mover_helpers")
    if found is None:
        found = False
        if _returns_moved(ctx.source):
            found = any(_returns_argument_moved(ctx, d, False) if isinstance(d, _FUNCTIONS) else any(
                _returns_argument_moved(ctx, m, not any(dotted(x) == "staticmethod" for x in m.decorator_list))
                for m in d.body if isinstance(m, _FUNCTIONS)) for d in _definitions(ctx).values())
        if not found:
            found = any(_module_has_movers(ctx, path) for path in imported_files(ctx))
        ctx.shared["has_mover_helpers"] = found
    return found


_MODULE_MOVERS: dict = {}  # path -> (size, mtime, whether the module defines a move helper)


def _module_has_movers(ctx, path: str) -> bool:
    """The project module at `path` defines a function that returns its argument moved to the
    device (`from utils import *` then `tensor2var(z)`); worked out once per process while the
    file is unchanged, and only for a module whose text has such a line."""
    def movers(path: str) -> bool:
        text = read_text(path)
        module = parsed(path) if text is not None and _returns_moved(text) else None
        return module is not None and any(
            isinstance(d, _FUNCTIONS) and _returns_argument_moved(ctx, d, False) for d in module.body)

    return while_unchanged(_MODULE_MOVERS, path, movers, False)


# Factories that make index tensors (`x[torch.arange(b), idx]`).
INDEX_FACTORIES = {"arange", "randint", "randperm"}
# numpy's calls that make such an index, and the torch factory that makes it on the device.
NUMPY_INDEX_FACTORIES = {"numpy.arange": "arange", "numpy.random.randint": "randint",
                         "numpy.random.permutation": "randperm"}
# numpy's index tricks, subscripted: `np.r_[:2, 4:n]` builds an index array on the host.
NUMPY_INDEX_TRICKS = frozenset({"numpy.r_", "numpy.c_"})
_INDEX_RESHAPES = {"unsqueeze", "view", "reshape", "expand", "expand_as", "repeat", "long"}


def indexed_tensors(ctx, node: ast.Call) -> list:
    """(the tensor, the subscript) for each subscript that `node` (a factory, as it stands or
    reshaped: `torch.arange(b)[:, None]`, `torch.arange(n).unsqueeze(1)`) indexes, as an item of
    the subscript (`q[torch.arange(b), idx]`), directly or through a name that is only read so
    (`index = torch.randint(n, (m,))`, then `k[:, index]` and `v[:, index]`), when the code uses
    what it indexes as a tensor not known to be on the CPU, or it is what a module computes;
    else empty."""
    parents = ctx.parents
    statement = index_binding(ctx, node)
    if statement is None:
        found = _indexed_from(ctx, node, reversed(parents))
        return [found] if found is not None else []
    flow = flow_of(ctx, ctx.scope)
    uses = flow.uses(statement) if statement in flow.parent else []
    found = [_indexed_from(ctx, use, flow.enclosing(use)) for use in uses]
    return found if found and all(found) else []


def index_binding(ctx, node: ast.Call) -> Optional[ast.Assign]:
    """The assignment of `node` to one name, as it is or with reshapes and casts written on it
    (`index = torch.randint(n, (m,))`, `batch_idx = torch.arange(n).long()`); None where the
    index is not bound to a name."""
    top = node
    for parent in reversed(ctx.parents):
        reshaped = _reshaped(parent, top)
        if reshaped is not None:
            top = reshaped
            continue
        if isinstance(parent, ast.Assign) and parent.value is top and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Name):
            return parent
        return None
    return None


def _reshaped(parent: ast.AST, child: ast.AST) -> Optional[ast.AST]:
    """What holds the index `child` once `parent`, a reshape or cast of it, is applied
    (`child.unsqueeze` names the method: still `child`; `child.unsqueeze(1)` is the call), or None
    where `parent` is something else."""
    if isinstance(parent, ast.Attribute) and parent.value is child and parent.attr in _INDEX_RESHAPES:
        return child
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.value is child \
            and parent.func.attr in _INDEX_RESHAPES:
        return parent
    return None


def _indexed_from(ctx, node: ast.AST, ancestors) -> Optional[tuple]:
    child = node
    for parent in ancestors:
        if isinstance(parent, ast.Subscript):
            if parent.value is child:
                child = parent  # `torch.arange(b)[:, None, None]`: the index, reshaped
                continue
            if parent.slice is not child:
                return None
            value = parent.value
            return (value, parent) if (_kinds.kind_of(ctx, value) == _kinds.TENSOR
                                       or _kinds.module_output(ctx, value)) else None
        reshaped = _reshaped(parent, child)
        if reshaped is not None:
            child = reshaped
            continue
        if isinstance(parent, ast.Tuple) and any(e is child for e in parent.elts):
            child = parent
            continue
        return None
    return None


# Methods that change an array or a list in place.
_IN_PLACE_METHODS = {"fill", "sort", "append", "extend", "insert", "pop", "remove", "clear", "resize", "put",
                     "itemset", "setflags", "update", "reverse", "partition"}


def module_constant(ctx, expr: ast.AST) -> bool:
    """`QUANTS` where the module binds it once, at its top level, to data computed from numbers
    and other such names (`QUANTS = (np.linspace(0.0, 1.0, N + 1)[:-1] + 0.5 / N)`, not drawn
    by `np.random`), and no code of the file stores, deletes or changes it in place: the same
    data on every pass, a constant."""
    return isinstance(expr, ast.Name) and expr.id in _module_constants(ctx)


def _module_constants(ctx) -> frozenset:
    found = ctx.shared.get("module_constants")
    if found is not None:
        return found
    stores, changed = {}, set()
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            stores[node.arg] = stores.get(node.arg, 0) + 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            changed.update(node.names)
        elif isinstance(node, (ast.Subscript, ast.Attribute)) and not isinstance(node.ctx, ast.Load) \
                and isinstance(node.value, ast.Name):
            changed.add(node.value.id)  # `QUANTS[0] = 0.0`, `del QUANTS[0]`
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(
                node.func.value, ast.Name) and (node.func.attr in _IN_PLACE_METHODS or node.func.attr.endswith("_")):
            changed.add(node.func.value.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                changed.add((alias.asname or alias.name).split(".")[0])
    values = {stmt.targets[0].id: stmt.value for stmt in ctx.tree.body
              if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
              and stores.get(stmt.targets[0].id) == 1 and stmt.targets[0].id not in changed}
    constants = set()
    for name, value in values.items():  # in the module's order: a constant reads those bound before it
        if _constant_expression(ctx, value, constants):
            constants.add(name)
    found = ctx.shared["module_constants"] = frozenset(constants)
    return found


def _constant_expression(ctx, expr: ast.AST, constants: set) -> bool:
    """Numbers, names of `constants`, and arithmetic, slices and numpy/math calls of them."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool) or expr.value is None
    if isinstance(expr, ast.Name):
        return expr.id in constants
    if isinstance(expr, (ast.List, ast.Tuple)):
        return all(_constant_expression(ctx, e, constants) for e in expr.elts)
    if isinstance(expr, ast.UnaryOp):
        return _constant_expression(ctx, expr.operand, constants)
    if isinstance(expr, ast.BinOp):
        return _constant_expression(ctx, expr.left, constants) and _constant_expression(ctx, expr.right, constants)
    if isinstance(expr, ast.Subscript):
        return _constant_expression(ctx, expr.value, constants) and _constant_expression(ctx, expr.slice, constants)
    if isinstance(expr, ast.Slice):
        return all(part is None or _constant_expression(ctx, part, constants)
                   for part in (expr.lower, expr.upper, expr.step))
    if isinstance(expr, ast.Call):
        qualname = ctx.qualname(expr.func) or ""
        return (qualname.startswith(("numpy.", "math.")) and not qualname.startswith("numpy.random")
                and all(_constant_expression(ctx, a, constants) for a in expr.args)
                and all(k.arg is not None and _constant_expression(ctx, k.value, constants) for k in expr.keywords))
    return False
