"""MAT304 contiguous-in-loop: the same layout copy made on every iteration of a loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.kinds import int_const
from matlint.semantic.flow import flow_of
from matlint.semantic.layout import rank_of, reorder
from matlint.semantic.loops import LoopInfo, loaded_names, walk_no_scopes
from matlint.semantic.shapes import shape_of
from matlint.semantic.torch_api import as_gemm
from .mat101_python_loop_matmul import PythonLoopMatmul

_TRAINING_CALLS = {"backward", "step", "zero_grad"}
# Methods that return a view of their receiver's data (or the receiver itself): the same data on every pass.
_VIEWS = {"transpose", "permute", "t", "expand", "expand_as", "view", "view_as", "reshape", "swapaxes", "swapdims",
          "movedim", "moveaxis", "narrow", "select", "unsqueeze", "squeeze", "flatten", "unflatten", "unfold",
          "detach", "contiguous", "size"}
# Views through which a callee can change the tensor it is handed (`contiguous()` may be a copy).
_SHARED_VIEWS = _VIEWS - {"contiguous", "size"}
# Calls that change none of their arguments.
_PURE_BUILTINS = {"print", "len", "isinstance", "str", "repr", "float", "int", "bool", "range", "enumerate", "zip",
                  "min", "max", "sum", "abs", "list", "tuple", "id", "type", "hasattr", "getattr", "iter", "next",
                  "sorted", "reversed", "dict", "set", "any", "all", "format", "round"}
# `outs.append(w)` keeps `w` without changing it; a view method gives it back.
_KEEPING_METHODS = _VIEWS | {"append", "extend", "insert"}


class _Step:
    """The tensor a step's slice is taken from, the dim the loop walks, and whether the slice is exactly `base[..., t, ...]`."""

    def __init__(self, base: ast.AST, dim: int, plain: bool):
        self.base, self.dim, self.plain = base, dim, plain


class ContiguousInLoop(Rule):
    code = "MAT304"
    name = "contiguous-in-loop"
    summary = "`.contiguous()` copies the same data on every iteration of a loop; make one copy before it."
    docs = """
    ## What it does
    Flags `.contiguous()` inside a `for`/`while` loop or comprehension when its receiver is a
    view that is certainly not contiguous (a transpose or permute, `.expand(...)`, or a slice
    that picks one index of a later dim, `x[:, t]`) and the copy could be made once for the whole
    loop:
    - the receiver does not change across iterations (`w.t().contiguous()` of a weight fixed
      before the loop; it reads no name the loop assigns, calls nothing but views, and the loop
      hands what it reads to no call that may change it): hoist the copy out of the loop;
    - the receiver is the step's slice of a tensor fixed before the loop (`x[:, t].contiguous()`,
      `x[..., t]` of a tensor of known rank, `x.select(2, t)`, `x[t].transpose(0, 1).contiguous()`,
      or the item `x_t` of `for x_t in x.unbind(1)`): copy the whole tensor into the wanted
      layout once (`x.movedim(1, 0).contiguous()`, then index `[t]` or iterate over it).

    ## Why is this bad?
    A copy per iteration is a kernel launch per iteration that moves the same bytes one small
    piece at a time (or, when the receiver does not change, the same copy over and over).
    One copy before the loop moves them in a single launch at full bandwidth.

    ## Example
    ```python
    for t in range(T):
        x_t = x[:, t].contiguous()
        h = cell(x_t, h)
    ```

    ## Use instead
    ```python
    xs = x.transpose(0, 1).contiguous()      # (T, B, ...): every step's slice is contiguous
    for t in range(T):
        h = cell(xs[t], h)
    ```

    ## Stays quiet on
    - Copies of values computed in the loop (`for blk in blocks: x = blk(x).transpose(1, 2).contiguous()`):
      each iteration has new data to lay out.
    - Items of something not known to be one tensor (`for a in t` over a tuple of tensors):
      each item is separate data.
    - `.contiguous()` of something that may already be contiguous (`x.contiguous()`, `x[t]`,
      `x[..., t]` of a tensor of unknown rank, `video[:, t]` where every dim before the index is
      known to have size 1, from the shape or from an `assert video.size(0) == 1` before the
      loop): no copy happens then.
    - Loops that update tensors in place (`w.add_(...)`, `orthogonal_(w)`, `torch.lerp(w, v, 0.1, out=w)`,
      `x[i] = ...`, `self.w = ...`) or run a training step (`.backward()`, `optimizer.step()`): the
      receiver may change between iterations.
    - Loops that hand the receiver, or the object it belongs to, to a call that may change it: a
      method of it (`self.refresh_weights()` before `self.weight.t().contiguous()`), or a call
      other than a torch function or a builtin that takes it as an argument
      (`train_one_epoch(model, loader, opt)` before `model.embed.weight.t().contiguous()`).
    - `.contiguous()` written as an operand of a GEMM on a last-two-dims transpose: MAT301
      reports that copy as needless altogether.

    ## Fix safety
    No automatic fix: hoisting adds a tensor that lives for the whole loop and changes the
    indexing in the body.
    """

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        # MAT101's analysis of per-step items, reused rather than copied.
        self._loop_gemms = PythonLoopMatmul(ctx)

    only = {"visit_Call": Only(in_loops=True, attrs=frozenset({"contiguous"}))}

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if not (self.ctx.loops and isinstance(func, ast.Attribute) and func.attr == "contiguous"
                and not node.args and not node.keywords):
            return
        loop = self.ctx.loops[-1]
        receiver = func.value
        seg = self.ctx.segment
        unbound = self._unbound_item(receiver, loop)
        if unbound is not None:
            base, dim = unbound
            if not self._mutates(loop) and not loaded_names(base) & (loop.assigned | loop.targets):
                self.report(node, f"`{seg(node)}` copies one step's slice per iteration: copy "
                                  f"`{seg(base)}.movedim({dim}, 0).contiguous()` once before the loop and iterate over it")
            return
        if not self._surely_strided(receiver) or self._is_gemm_operand(node) or self._mutates(loop):
            return
        if not (loaded_names(receiver) & (loop.assigned | loop.targets)):
            if self._may_change(receiver, loop):
                return  # `next(it).permute(...)`, `torch.randn(...).t()`: new data on every pass
            self.report(node, f"`{seg(node)}` makes the same copy on every iteration: hoist it out of the loop")
            return
        item = self._last_dim_item(receiver, loop) or self._loop_gemms._batched(loop, receiver, 0)
        if item is None or loaded_names(item.base) & (loop.assigned | loop.targets):
            return
        if not self._indexed(receiver, loop):
            # Iterated directly (`for a in t`): `t` must be known to be one tensor, not a tuple of them.
            if _kinds.kind_of(self.ctx, item.base) not in _kinds.TENSORS:
                return
        if item.plain and self._leading_ones(item.base, item.dim):
            return  # `video[:, t]` of a (1, T, ...) tensor: already contiguous
        whole = self._whole_copy(receiver, item)
        how = f"`{whole}` once before the loop" if whole else "the whole tensor into the wanted layout once before the loop"
        self.report(node, f"`{seg(node)}` copies one step's slice per iteration: copy {how} and index it per step")

    def _leading_ones(self, base: ast.AST, dim: Optional[int]) -> bool:
        """Every dim of `base` before `dim` is known to have size 1 (from its shape, or from an
        `assert x.size(0) == 1` that runs before the loop): the step's slice is contiguous."""
        if not dim:
            return False
        if self._asserted_ones(base) >= set(range(dim)):
            return True
        shape = shape_of(self.ctx, base)
        return shape is not None and shape.rank is not None and dim <= shape.rank and all(
            type(d) is int and d == 1 for d in shape.dims[:dim])

    def _asserted_ones(self, base: ast.AST) -> set:
        """The dims of name `base` that a top-level `assert x.size(k) == 1` (or `x.shape[k] == 1`)
        of the function states before the loop, where the name is not stored after the assert."""
        function, loop = self.ctx.function, self.ctx.loops[0].node if self.ctx.loops else None
        if not isinstance(base, ast.Name) or function is None or loop is None or "assert" not in self.ctx.source:
            return set()
        ones = set()
        stores = flow_of(self.ctx, function).stores.get(base.id, [])
        for stmt in function.body:
            if stmt.lineno >= loop.lineno:
                break
            if not isinstance(stmt, ast.Assert) or any(s is not None and s.end_lineno >= stmt.lineno for s, _ in stores):
                continue
            tests = stmt.test.values if isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.And) else [stmt.test]
            for test in tests:
                if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
                    continue
                for size, one in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
                    if int_const(one) == 1:
                        k = self._sized_dim(size, base.id)
                        if k is not None:
                            ones.add(k)
        return ones

    @staticmethod
    def _sized_dim(expr: ast.AST, name: str) -> Optional[int]:
        """k for `name.size(k)` or `name.shape[k]` (k a literal 0 or more)."""
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "size"
                and len(expr.args) == 1 and not expr.keywords):
            owner, k = expr.func.value, int_const(expr.args[0])
        elif isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape":
            owner, k = expr.value.value, int_const(expr.slice)
        else:
            return None
        return k if isinstance(owner, ast.Name) and owner.id == name and k is not None and k >= 0 else None

    def _last_dim_item(self, receiver: ast.AST, loop: LoopInfo):
        """`x[..., t]` with `t` the loop counter, of a tensor of known rank (2 or more) fixed before the loop."""
        if not (isinstance(receiver, ast.Subscript) and isinstance(receiver.slice, ast.Tuple)
                and len(receiver.slice.elts) == 2):
            return None
        first, index = receiver.slice.elts
        if not (isinstance(first, ast.Constant) and first.value is Ellipsis and isinstance(index, ast.Name)
                and self._loop_gemms._index_var(loop, index.id)):
            return None
        rank = rank_of(self.ctx, receiver.value)
        if rank is None or rank < 2 or not self._loop_gemms._tensor_base(receiver.value):
            return None
        return _Step(receiver.value, rank - 1, True)

    def _unbound_item(self, receiver: ast.AST, loop: LoopInfo):
        """(x, d) when `receiver` is the loop's item of `x.unbind(d)` (`for x_t in x.unbind(1)`,
        `for i, x_t in enumerate(torch.unbind(x, dim=1))`) and d is 1 or more: a strided view."""
        node = loop.node
        if not isinstance(receiver, ast.Name) or not isinstance(node, (ast.For, ast.AsyncFor)):
            return None
        target, it = node.target, node.iter
        if (isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(it, ast.Call)
                and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and self.ctx.qualname(it.func) is None
                and len(it.args) == 1 and not it.keywords):
            target, it = target.elts[1], it.args[0]
        if not (isinstance(target, ast.Name) and target.id == receiver.id and isinstance(it, ast.Call)):
            return None
        if isinstance(it.func, ast.Attribute) and it.func.attr == "unbind" and self.ctx.qualname(it.func) is None:
            base, args = it.func.value, it.args
        elif self.ctx.qualname(it.func) == "torch.unbind" and it.args:
            base, args = it.args[0], it.args[1:]
        else:
            return None
        given = list(args) + [k.value for k in it.keywords if k.arg == "dim"]
        if len(given) != 1 or len(it.keywords) > (len(given) - len(args)):
            return None
        dim = int_const(given[0])
        if dim is None or dim < 1 or _kinds.is_non_tensor(self.ctx, base) or self._leading_ones(base, dim):
            return None
        return base, dim

    def _may_change(self, receiver: ast.AST, loop: LoopInfo) -> bool:
        """Whether the receiver can hold other data on another pass although no name it reads is
        assigned in the loop: it calls something that is not a view (`next(it)`, `env.render()`,
        `torch.randn(...)`), or the loop calls a method of an object it reads (`self.refresh()`
        before `self.weight.t()`)."""
        for sub in ast.walk(receiver):
            if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Attribute) and sub.func.attr in _VIEWS):
                if reorder(self.ctx, sub) is None:
                    return True
        return not loaded_names(receiver).isdisjoint(self._handled_by_calls(loop))

    def _handled_by_calls(self, loop: LoopInfo) -> set:
        """Names the loop hands to calls that may change them: whose methods, other than views,
        it calls (`self` for `self.step()`, `env` for `env.reset()`), or that it passes to a call
        other than a torch function or a builtin (`model` in `train_one_epoch(model, loader)`)."""
        key = ("mat304_handled_by_calls", id(loop.node))
        names = self.ctx.shared.get(key)
        if names is None:
            names = self.ctx.shared[key] = set()
            for stmt in loop.body:
                for sub in walk_no_scopes(stmt):
                    if not isinstance(sub, ast.Call):
                        continue
                    func = sub.func
                    if isinstance(func, ast.Attribute) and func.attr not in _VIEWS:
                        base = self._root_name(func.value, ())
                        if base is not None and self.ctx.qualname(base) is None:
                            names.add(base.id)
                    if self._may_change_arguments(sub):
                        for arg in sub.args + [k.value for k in sub.keywords]:
                            root = self._root_name(arg, _SHARED_VIEWS)
                            if root is not None:
                                names.add(root.id)
        return names

    def _may_change_arguments(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name) and func.id in _PURE_BUILTINS and self.ctx.qualname(func) is None:
            return False
        if isinstance(func, ast.Attribute) and func.attr in _KEEPING_METHODS:
            return False
        qual = self.ctx.qualname(func)
        return not (qual is not None and qual.startswith("torch.") and not qual.endswith("_"))

    @staticmethod
    def _root_name(expr: ast.AST, views) -> Optional[ast.Name]:
        """`model` for `model.embed.weight`, `w[0]`, `*ws`, or (through `views`) `w.t()`."""
        while True:
            if isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)):
                expr = expr.value
            elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in views:
                expr = expr.func.value
            else:
                return expr if isinstance(expr, ast.Name) else None

    def _surely_strided(self, expr: ast.AST) -> bool:
        view = reorder(self.ctx, expr)
        if view is not None:
            return True
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            if expr.func.attr == "expand":
                return True
            if expr.func.attr == "select" and expr.args:  # `x.select(2, t)`: an index of a later dim
                dim = int_const(expr.args[0])
                return dim is not None and dim >= 1
        if (isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Tuple) and expr.slice.elts
                and isinstance(expr.slice.elts[0], ast.Constant) and expr.slice.elts[0].value is Ellipsis):
            return True  # `x[..., t]`: the rank decides, see `_last_dim_item`
        return self._column_slice(expr) is not None

    @staticmethod
    def _column_slice(expr: ast.AST) -> Optional[int]:
        """The dim of `x[:, t]`-like slices: full slices, then one index."""
        if not isinstance(expr, ast.Subscript) or not isinstance(expr.slice, ast.Tuple):
            return None
        elts = expr.slice.elts
        for pos, elt in enumerate(elts):
            if isinstance(elt, ast.Slice):
                if elt.lower is None and elt.upper is None and elt.step is None:
                    continue
                return None
            if pos == 0 or isinstance(elt, ast.Starred) or any(not isinstance(e, ast.Slice) for e in elts[pos + 1:]):
                return None
            return pos
        return None

    def _whole_copy(self, receiver: ast.AST, item) -> Optional[str]:
        seg = self.ctx.segment
        base = seg(item.base)
        if item.plain and item.dim:  # `x[:, t]`, `x[..., t]`, `x.select(2, t)`
            return f"{base}.movedim({item.dim}, 0).contiguous()"
        view = reorder(self.ctx, receiver)
        inner = view.base if view is not None else None
        if (item.dim == 0 and view is not None and isinstance(inner, ast.Subscript)
                and isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute)
                and receiver.func.attr in ("transpose", "swapaxes", "swapdims") and len(receiver.args) == 2):
            dims = [int_const(a) for a in receiver.args]
            if None not in dims and all(d >= 0 for d in dims):
                return f"{base}.{receiver.func.attr}({dims[0] + 1}, {dims[1] + 1}).contiguous()"
        return None

    @staticmethod
    def _indexed(receiver: ast.AST, loop: LoopInfo) -> bool:
        """The receiver indexes a tensor with the loop counter (`x[:, t]`), rather than being the item itself."""
        return any(isinstance(sub, ast.Subscript) and loaded_names(sub.slice) & loop.targets
                   for sub in ast.walk(receiver))

    def _is_gemm_operand(self, node: ast.Call) -> bool:
        parent = self.ctx.parent
        gemm = as_gemm(self.ctx, parent) if isinstance(parent, (ast.BinOp, ast.Call)) else None
        return gemm is not None and any(op is node for op in gemm.operands)

    def _mutates(self, loop: LoopInfo) -> bool:
        key = ("mat304_mutates", id(loop.node))
        cached = self.ctx.shared.get(key)
        if cached is None:
            cached = False
            for stmt in loop.body:
                for sub in walk_no_scopes(stmt):
                    if isinstance(sub, ast.Call):
                        func = sub.func
                        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                        # `w.add_(1)`, `orthogonal_(w)`, `torch.lerp(w, v, 0.1, out=w)`, `opt.step()`
                        if (name.endswith("_") and not name.startswith("_")) or any(k.arg == "out" for k in sub.keywords):
                            cached = True
                        elif isinstance(func, ast.Attribute) and name in _TRAINING_CALLS:
                            cached = True
                    elif isinstance(sub, (ast.Assign, ast.AugAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        if any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in targets):
                            cached = True
                    if cached:
                        break
                if cached:
                    break
            self.ctx.shared[key] = cached
        return cached
