"""MAT101's per-item analysis: which operand of a GEMM in a loop is one item of a tensor or sequence
the loop runs over (`x[i]`, `xs` iterated, a slice or a split), through elementwise transforms,
and what the one batched operand would be."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.layout import assigned_value
from matlint.semantic.loops import LoopInfo, loaded_names, walk_no_scopes
from matlint.semantic.torch_api import as_gemm


# Methods that keep a per-item operand batchable (the batched tensor gets the same call).
_SHAPE_KEEPING_METHODS = {"float", "half", "bfloat16", "double", "to", "contiguous", "detach", "clone",
                          "t", "transpose", "unsqueeze", "squeeze", "view", "reshape", "permute", "flatten"}
_SHAPE_KEEPING_ATTRS = {"T", "mT", "H", "mH"}
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)

# Transforms of an item that act on each element, or on each row along its last dims, alike for
# every item: the batched tensor gets the same transform (`relu(x[i]) @ W` -> `relu(x) @ W`).
_ELEMENTWISE_METHODS = {"relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "rsqrt", "square", "neg",
                        "softmax", "log_softmax", "clamp", "clip", "pow", "sin", "cos", "erf"}
_ELEMENTWISE_FUNCTIONS = frozenset(
    [f"torch.{name}" for name in ("relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "rsqrt", "square",
                                  "neg", "softmax", "log_softmax", "clamp", "clip", "sin", "cos", "erf")]
    + [f"torch.nn.functional.{name}" for name in (
        "relu", "relu6", "gelu", "silu", "elu", "selu", "celu", "leaky_relu", "mish", "hardswish", "sigmoid",
        "tanh", "softplus", "softsign", "dropout", "softmax", "log_softmax", "layer_norm", "rms_norm",
        "normalize", "embedding")])

# Modules that transform each element or each row along the last dims (not BatchNorm, whose
# statistics span the batch, nor GroupNorm/InstanceNorm, which read a channel dim).
_ELEMENTWISE_MODULE_CLASSES = frozenset(f"torch.nn.{name}" for name in (
    "LayerNorm", "RMSNorm", "Embedding", "Dropout", "Identity", "ReLU", "ReLU6", "GELU", "SiLU", "ELU", "SELU",
    "CELU", "LeakyReLU", "Mish", "Hardswish", "Sigmoid", "Tanh", "Softplus", "Softsign"))
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
_JOINS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})

# Calls whose items are the tensor's slices along a dim: `x.unbind(1)`, `torch.unbind(x, dim=1)`;
# `x.split(1, 1)` keeps the dim (size 1).
_SLICING_CALLS = {"unbind": ("dim",), "split": ("split_size_or_sections", "dim"), "chunk": ("chunks", "dim")}


class _Batched:
    """A per-iteration operand and the tensor that holds all iterations."""

    def __init__(self, base: ast.AST, dim: Optional[int], plain: bool, index: str, keeps_dim: bool = False,
                 sources: tuple = ()):
        self.base = base      # the tensor indexed or iterated over
        self.dim = dim        # which dim the loop walks (0 for `x[i]` and `for xi in x`)
        self.plain = plain    # the operand is exactly base[i] (no wrapping calls)
        self.index = index    # the loop variable that walks it (`i`)
        self.keeps_dim = keeps_dim  # the item keeps the walked dim, of size 1 (`x[i:i + 1]`, `x.split(1)`)
        self.sources = sources or (base,)  # every tensor whose items it is computed from

    def wrapped(self, *others: "_Batched") -> "_Batched":
        """The same item seen through a call or an operation: no longer exactly base[i]."""
        sources = tuple(s for b in (self,) + others for s in b.sources)
        return _Batched(self.base, self.dim, False, self.index, self.keeps_dim, sources)


class _PerItemOperands:
    """PythonLoopMatmul's analysis of per-item operands."""

    def _index_var(self, loop: LoopInfo, name: str) -> bool:
        """`name` walks 0..n-1 one step at a time: a plain range/enumerate counter or a while counter."""
        if name not in loop.targets:
            return False
        it = loop.iter
        if it is None:  # while loop counter
            return True
        if isinstance(it, ast.Name):  # `steps = range(T)` ... `for t in steps`
            it = assigned_value(self.ctx, it)
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
            if it.func.id == "range":
                return len(it.args) in (1, 2) and isinstance(loop.node, (ast.For, ast.AsyncFor, ast.ListComp,
                                                                        ast.GeneratorExp, ast.SetComp, ast.DictComp))
            if it.func.id == "enumerate" and isinstance(self._target_node(loop), ast.Tuple):
                first = self._target_node(loop).elts[0]
                return isinstance(first, ast.Name) and first.id == name
        return False

    @staticmethod
    def _target_node(loop: LoopInfo):
        node = loop.node
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return node.target
        if loop.is_comprehension:
            return node.generators[0].target
        return None

    def _batched(self, loop: LoopInfo, op: ast.AST, depth: int, transforms: bool = False,
                 held: tuple = ()) -> Optional[_Batched]:
        """The loop's item that `op` is (`x[i]`, `x[:, t]`, `xt` for `xt` in `x.unbind(1)`, `x[i:i + 1]`,
        `x[i].float()`), or with `transforms`, computes from items of one index and values fixed
        in the loop, element by element or row by row (`(x[i] - mean)`, `torch.relu(x[b])`,
        `self.norm(x[:, t])`, `softmax(q[i] @ k[i].T)`): the batched tensor takes the same steps.
        `held`: loops nested in `loop` whose items the GEMM also reads; a value that changes only
        with their items holds still for each of them (`T_k @ x[:, :, t]` in `for k` inside
        `for t`)."""
        if depth > 6:
            return None
        if isinstance(op, ast.Subscript):
            return self._indexed_item(loop, op)
        if (isinstance(op, ast.Call) and isinstance(op.func, ast.Attribute) and op.func.attr == "select"
                and not loop.depends_on_iteration(op.func.value) and self._tensor_base(op.func.value)):
            # `x.select(0, i)`, `x.select(dim=1, index=i)`
            given = dict(zip(("dim", "index"), op.args))
            given.update((k.arg, k.value) for k in op.keywords)
            dim, index = given.get("dim"), given.get("index")
            if (len(given) == 2 and isinstance(dim, ast.Constant) and type(dim.value) is int and dim.value >= 0
                    and isinstance(index, ast.Name) and self._index_var(loop, index.id)):
                return _Batched(op.func.value, dim.value, True, index.id)
            return None
        if isinstance(op, ast.Name):
            if op.id in loop.targets:
                walked = self._iterated_tensor(loop, op.id)
                return _Batched(walked[0], walked[1], True, op.id, walked[2]) if walked is not None else None
            assignment = self._assigned_value(loop, op)
            if assignment is not None:
                inner = self._batched(loop, assignment, depth + 1, transforms, held)
                return inner.wrapped() if inner else None
            return None
        if (isinstance(op, ast.Call) and isinstance(op.func, ast.Attribute) and self.ctx.qualname(op.func) is None
                and (op.func.attr in _SHAPE_KEEPING_METHODS or transforms and op.func.attr in _ELEMENTWISE_METHODS)):
            if any(loop.depends_on_iteration(a) for a in op.args):
                return None
            if op.func.attr in _ELEMENTWISE_METHODS and any(
                    self._varies(loop, a, held) for a in op.args + [k.value for k in op.keywords]):
                return None
            inner = self._batched(loop, op.func.value, depth + 1, transforms, held)
            return inner.wrapped() if inner else None
        if isinstance(op, ast.Attribute) and op.attr in _SHAPE_KEEPING_ATTRS:
            inner = self._batched(loop, op.value, depth + 1, transforms, held)
            return inner.wrapped() if inner else None
        return self._transformed_item(loop, op, depth, held) if transforms else None

    def _indexed_item(self, loop: LoopInfo, op: ast.Subscript) -> Optional[_Batched]:
        """`x[i]`, `x[:, t]`, `x[i, ...]`, `x[i:i + 1]`; `q[b, h]` and `hidden[b, 0]` in the loop
        over `h` and `b` (the other index holds still: not exactly base[i]); `inputs[i]` after
        `inputs = x.unbind(0)`."""
        base = op.value
        if loop.depends_on_iteration(base):
            return None
        elems = op.slice.elts if isinstance(op.slice, ast.Tuple) else [op.slice]
        if not self._tensor_base(base):
            sliced = self._sliced_sequence(loop, base)
            elem = elems[0]
            if (sliced is not None and len(elems) == 1 and isinstance(elem, ast.Name)
                    and self._index_var(loop, elem.id)):
                return _Batched(sliced[0], sliced[1], True, elem.id, sliced[2])
            return None
        dim, found, index, keeps_dim, plain = None, 0, None, False, True
        for pos, elem in enumerate(elems):
            if isinstance(elem, ast.Name) and self._index_var(loop, elem.id):
                dim, found, index = pos, found + 1, elem.id
            elif isinstance(elem, ast.Slice) and elem.lower is None and elem.upper is None and elem.step is None:
                continue
            elif isinstance(elem, ast.Constant) and elem.value is Ellipsis:
                if not found:
                    return None  # `x[..., i]` hides which dim the loop walks
            elif self._unit_slice(loop, elem):
                dim, found, index, keeps_dim = pos, found + 1, elem.lower.id, True
            elif isinstance(elem, (ast.Slice, ast.Starred)) or self._varies(loop, elem):
                return None  # `x[i:i + chunk]`, `x[t, t - 1]`
            else:
                plain = False  # `q[b, h]` in the loop over `h`, `hidden[b, 0]`: one more index, fixed in the loop
        return _Batched(base, dim, plain, index, keeps_dim) if found == 1 else None

    def _unit_slice(self, loop: LoopInfo, elem: ast.AST) -> bool:
        """`i:i + 1` for a counter `i` that walks one step at a time: the item at `i`, keeping its dim."""
        if not (isinstance(elem, ast.Slice) and elem.step is None and isinstance(elem.lower, ast.Name)
                and self._index_var(loop, elem.lower.id) and isinstance(elem.upper, ast.BinOp)
                and isinstance(elem.upper.op, ast.Add)):
            return False
        left, right = elem.upper.left, elem.upper.right
        one = [side for side in (left, right) if isinstance(side, ast.Constant) and side.value == 1
               and type(side.value) is int]
        counter = [side for side in (left, right) if isinstance(side, ast.Name) and side.id == elem.lower.id]
        return bool(one) and bool(counter)

    def _varies(self, loop: LoopInfo, expr: ast.AST, held: tuple = ()) -> bool:
        """`expr` may differ between iterations: it reads the item or something the loop changes
        (other than through the items of the loops `held`), or calls something other than a
        method that lays a tensor out (`torch.randn(d)` draws anew on every pass)."""
        return (loop.depends_on_iteration(expr) or loop.changes(expr) and not self._held_by_inner(loop, held, expr)
                or any(isinstance(sub, ast.Call) and not self._lays_out(sub) for sub in walk_no_scopes(expr)))

    def _lays_out(self, call: ast.Call) -> bool:
        """`x.permute(0, 2, 1)`, `x.t()`: a tensor method that gives the same values laid out anew."""
        return (isinstance(call.func, ast.Attribute) and call.func.attr in _SHAPE_KEEPING_METHODS
                and self.ctx.qualname(call.func) is None)

    @staticmethod
    def _held_by_inner(loop: LoopInfo, inner, expr: ast.AST) -> bool:
        """`expr` changes in `loop` only through the items of the loops `inner` (nested in it), and
        does not depend on `loop`'s own iteration."""
        if not inner or loop.depends_on_iteration(expr):
            return False
        items = set().union(*(each.targets | each.derived for each in inner))
        if not loaded_names(expr) & items:
            return False
        return not any(part.__class__ in (ast.Name, ast.Attribute) and not loaded_names(part) & items
                       and loop.changes(part) for part in ast.walk(expr))

    def _transformed_item(self, loop: LoopInfo, op: ast.AST, depth: int, held: tuple = ()) -> Optional[_Batched]:
        """An item through a GEMM with fixed weights, arithmetic with fixed values, an elementwise
        torch function or an elementwise/row-wise module (`self.norm`, `self.embed`, `self.drop`)."""
        ctx = self.ctx
        gemm = as_gemm(ctx, op) if isinstance(op, (ast.BinOp, ast.Call)) else None
        if gemm is not None and gemm.operands:
            fixed = []
            if gemm.op == "nn.Linear":
                fixed.append(op.func)
            elif gemm.op == "linear":
                fixed.extend(op.args[2:] + [k.value for k in op.keywords])
            return self._combined(loop, gemm.operands, fixed, depth, held)
        if isinstance(op, ast.BinOp) and isinstance(op.op, _ARITHMETIC):
            return self._combined(loop, [op.left, op.right], [], depth, held)
        if isinstance(op, ast.UnaryOp) and isinstance(op.op, (ast.USub, ast.UAdd)):
            inner = self._batched(loop, op.operand, depth + 1, True, held)
            return inner.wrapped() if inner else None
        if not isinstance(op, ast.Call) or not op.args or isinstance(op.args[0], ast.Starred):
            return None
        qualname = ctx.qualname(op.func)
        if qualname in _JOINS and isinstance(op.args[0], (ast.List, ast.Tuple)) and not any(
                isinstance(e, ast.Starred) for e in op.args[0].elts):
            # `torch.cat([x[:, i], c[:, i], fixed], dim=1)`: items of one index joined with values fixed
            # in the loop are alike in every step (the batched form joins the whole tensors)
            return self._combined(loop, list(op.args[0].elts), op.args[1:] + [k.value for k in op.keywords], depth, held)
        if qualname in _ELEMENTWISE_FUNCTIONS:
            rest = op.args[1:] + [k.value for k in op.keywords]
        elif (qualname is None and len(op.args) == 1 and not op.keywords
              and _kinds.kind_of(ctx, op.func) == _kinds.MODULE
              and self._constructed_by(op.func, _ELEMENTWISE_MODULE_CLASSES)):
            rest = [op.func]
        else:
            return None
        if any(self._varies(loop, r, held) for r in rest):
            return None
        inner = self._batched(loop, op.args[0], depth + 1, True, held)
        return inner.wrapped() if inner else None

    def _combined(self, loop: LoopInfo, operands: list, fixed: list, depth: int, held: tuple = ()) -> Optional[_Batched]:
        """The per-item value of an operation whose operands are items of one index or fixed."""
        if any(self._varies(loop, f, held) for f in fixed):
            return None
        items = []
        for operand in operands:
            if loop.depends_on_iteration(operand):
                item = self._batched(loop, operand, depth + 1, True, held)
                if item is None:
                    return None
                items.append(item)
            elif self._varies(loop, operand, held):
                return None
        if not items or len({item.index for item in items}) != 1:
            return None
        return items[0].wrapped(*items[1:])

    def _tensor_base(self, base: ast.AST) -> bool:
        kind = _kinds.kind_of(self.ctx, base)
        if kind in _kinds.TENSORS:
            return True
        return kind is None and isinstance(base, ast.Name) and _kinds.looks_like_tensor(self.ctx, base)

    def _iterated_tensor(self, loop: LoopInfo, name: str) -> Optional[tuple]:
        """(the tensor whose slices the loop target `name` walks, the dim, whether a slice keeps
        it), if it is one: `for xt in x`, `for xt in x.unbind(1)`, `for xt in x.split(1, dim=1)`."""
        target, it = self._target_node(loop), loop.iter
        if target is None or it is None:
            return None
        source = None
        if isinstance(target, ast.Name) and target.id == name:
            source = it
        elif isinstance(target, ast.Tuple) and isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name) and elt.id == name:
                    if it.func.id == "zip" and i < len(it.args):
                        source = it.args[i]
                    elif it.func.id == "enumerate" and i == 1 and it.args:
                        source = it.args[0]
        if source is None:
            return None
        if isinstance(source, ast.Call):
            walked = self._slicing_call(source)
            return walked if walked is not None and self._tensor_base(walked[0]) else None
        return (source, 0, False) if self._tensor_base(source) else None

    def _slicing_call(self, call: ast.AST) -> Optional[tuple]:
        """(tensor, dim, keeps_dim) for `x.unbind(1)`, `torch.unbind(x, dim=1)`, `x.split(1, 1)`,
        `torch.split(x, 1, dim=1)`, `x.chunk(x.size(1), dim=1)`: the tensor's slices along a dim,
        one by one."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in _SLICING_CALLS):
            return None
        method = call.func.attr
        qualname = self.ctx.qualname(call.func)
        if qualname is None:
            tensor, args = call.func.value, call.args
        elif qualname == f"torch.{method}" and call.args:
            tensor, args = call.args[0], call.args[1:]
        else:
            return None
        given = dict(zip(_SLICING_CALLS[method], args))
        for keyword in call.keywords:
            if keyword.arg not in ("dim", "split_size", "split_size_or_sections", "chunks"):
                return None
            given[keyword.arg if keyword.arg in ("dim", "chunks") else "split_size_or_sections"] = keyword.value
        if len(given) < len(args) + len(call.keywords) or any(isinstance(a, ast.Starred) for a in args):
            return None
        dim = _kinds.int_const(given["dim"]) if "dim" in given else 0
        if dim is None or dim < 0:
            return None
        if method == "split" and _kinds.int_const(given.get("split_size_or_sections")) != 1:
            return None  # chunks of several items bound memory on purpose
        if method == "chunk" and not _size_along(given.get("chunks"), tensor, dim):
            return None  # as many chunks as items along the dim, or chunks of several items
        return tensor, dim, method != "unbind"

    def _sliced_sequence(self, loop: LoopInfo, name: ast.AST) -> Optional[tuple]:
        """(tensor, dim, keeps_dim) when `name` holds `x.unbind(d)` or `x.split(1, d)`, bound
        before the loop: `inputs = x.unbind(0)` then `inputs[i]`."""
        ctx = self.ctx
        if not isinstance(name, ast.Name) or loop.changes(name):
            return None
        assign = flow_of(ctx, ctx.scope).reaching(name)
        if assign is None or len(getattr(assign, "targets", ())) != 1 or not isinstance(assign.targets[0], ast.Name):
            return None
        walked = self._slicing_call(assign.value)
        return walked if walked is not None and self._tensor_base(walked[0]) else None

    def _assigned_value(self, loop: LoopInfo, load: ast.Name) -> Optional[ast.AST]:
        """The value `load` reads: that of the one assignment of its name in the loop's body, or
        of the one assignment earlier in the same pass that alone reaches it (`ynext = y[:, t]`
        in one arm, `ynext = sample(mu)` at the end of the body)."""
        assignment = self._single_assignment(loop, load.id)
        if assignment is None:
            stores = loop.assigned_this_pass(load)
            assignment = stores[0].value if stores is not None and len(stores) == 1 else None
        return assignment

    def _single_assignment(self, loop: LoopInfo, name: str) -> Optional[ast.AST]:
        values = []
        for stmt in loop.body:
            for sub in walk_no_scopes(stmt):
                if isinstance(sub, ast.Assign):
                    for target in sub.targets:
                        if isinstance(target, ast.Name) and target.id == name:
                            values.append(sub.value)
                        elif any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                            return None
                elif isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
                    if isinstance(sub.target, ast.Name) and sub.target.id == name:
                        return None
                elif isinstance(sub, (ast.For, ast.AsyncFor, ast.With)) and any(
                        isinstance(n, ast.Name) and n.id == name for n in ast.walk(sub.target if hasattr(sub, "target") else sub)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)):
                    return None
        return values[0] if len(values) == 1 else None


def _size_along(expr: Optional[ast.AST], tensor: ast.AST, dim: int) -> bool:
    """`expr` is the size of `tensor` along `dim`: `x.size(1)`, `x.shape[1]`."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "size" \
            and len(expr.args) == 1 and not expr.keywords:
        owner, index = expr.func.value, expr.args[0]
    elif isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape":
        owner, index = expr.value.value, expr.slice
    else:
        return False
    return _kinds.int_const(index) == dim and ast.dump(owner) == ast.dump(tensor)
