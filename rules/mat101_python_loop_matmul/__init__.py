"""MAT101 python-loop-matmul: a GEMM issued once per item from a Python loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.flow import flow_of
from matlint.semantic.loops import LoopInfo, updates_weights, walk_no_scopes
from matlint.semantic.shapes import shape_of
from matlint.rule import GemmVisitor
from matlint.semantic.torch_api import as_gemm

# Methods that keep a per-item operand batchable (the batched tensor gets the same call).
_SHAPE_KEEPING_METHODS = {"float", "half", "bfloat16", "double", "to", "contiguous", "detach", "clone",
                          "t", "transpose", "unsqueeze", "squeeze", "view", "reshape", "permute", "flatten"}
_SHAPE_KEEPING_ATTRS = {"T", "mT", "H", "mH"}
_BATCH_LETTERS = "bnzyxwvutsrqpomlkhgfedca"
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
_RECURRENT_MODULES = frozenset({"torch.nn.RNNCell", "torch.nn.LSTMCell", "torch.nn.GRUCell",
                                "torch.nn.RNN", "torch.nn.LSTM", "torch.nn.GRU"})
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
# Calls whose items are the tensor's slices along a dim: `x.unbind(1)`, `torch.unbind(x, dim=1)`;
# `x.split(1, 1)` keeps the dim (size 1).
_SLICING_CALLS = {"unbind": ("dim",), "split": ("split_size_or_sections", "dim")}


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


class PythonLoopMatmul(GemmVisitor, Rule):
    code = "MAT101"
    name = "python-loop-matmul"
    summary = "A matrix multiply issued once per item from a Python loop; one batched call does them all."
    docs = """
    ## What it does
    Flags a GEMM (`@`, `torch.matmul`, `mm`, `bmm`, `einsum`, `dot`, `mv`, `tensordot`,
    `F.linear`, the `.matmul()`/`.mm()` methods, or an `nn.Linear` module) inside a `for`/`while`
    loop or comprehension when one of its operands is the loop's item: indexed by the loop
    variable (`x[i]`, `x[:, i]`, `x[i, ...]`, `x.select(0, i)`, `x[i:i + 1]` in a step-1 loop,
    `q[b, h]` in the loop over `h`, `hidden[b, 0]`), iterated over (`for xi in x`,
    `x.unbind(1)`, `torch.unbind(x, 0)`, `x.split(1)`), or assigned from such an item in
    the loop body, also through steps that treat every item alike: arithmetic with values fixed
    in the loop (`(x[i] - mean) @ W`), elementwise torch functions (`torch.relu(x[b])`), row-wise
    modules (`self.fc(self.norm(x[:, t]))` with a LayerNorm, Embedding, Dropout or activation),
    and earlier GEMMs of the item (`att @ v[i]` with `att = softmax(q[i] @ k[i].T)`). The
    message says which single call replaces the loop, with `einsum`
    subscripts written out when they can be derived. `matmul` treats a 1-D operand as a vector,
    so the call depends on the items' rank: `A @ x[i]` over vectors is `x @ A.T`, `x[i] @ y[i]`
    over vectors is `(x * y).sum(-1)`; where the rank is not known the message names the call
    for matrices and for vectors.

    A loop of GEMMs whose results are collected and stacked is reported here, once per GEMM;
    MAT103 (stacked-loop-products) stays quiet on it and reports only per-item products written
    as an elementwise multiply and a sum, which this rule does not see as GEMMs.

    ## Why is this bad?
    Each iteration launches a separate small GEMM (and its Python and dispatch overhead), which
    keeps the GPU's matrix units mostly idle. One batched call runs them all in a single kernel:
    on an H100, 64 looped 256×256 matmuls ran 46× slower than one `bmm`.

    ## Example
    ```python
    out = torch.empty(B, M, N)
    for b in range(B):
        out[b] = torch.mm(x[b], w[b])
    ```

    ## Use instead
    ```python
    out = torch.bmm(x, w)          # or x @ w, or torch.einsum("bij,bjk->bik", x, w)
    ```

    ## Stays quiet on
    - Loops over layers or modules (`for block in self.blocks: x = block(x)`), and over weights
      of a list (`for w in weights: x = x @ w`).
    - Recurrences: a loop where a GEMM consumes a value from the previous iteration (RNN state
      `h @ W_hh`, a state kept on `self`, Newton–Schulz, power iteration, a buffer filled step
      by step through `buf[t + 1] = ...`, `buf[t + 1].copy_(...)` or `out=buf[t + 1]`, also
      through another name for it: `out = x` then `out[t + 1] = x[t] @ W`, or views
      `prev, nxt = xs[:-1], xs[1:]` then `nxt[t] = prev[t] @ A`), or an
      RNN cell (`nn.LSTMCell`, `nn.GRUCell`, `nn.RNNCell`, `nn.LSTM`...) or a module class of
      the file consumes such a value. Input projections inside such loops are MAT105's.
    - Weights that change between steps: an optimizer step or `.backward()` in the loop, a
      call that may run a training step (handed an optimizer, `train_step(loss, opt)`; a loss
      and a model, `backprop(loss, model)`; or named so, `self.training_step(batch)`,
      `self.optimize_model()`, `sgd_step(...)`, `update(loss=...)`, `trainer.step(batch)`;
      not builtins, logging, bookkeeping or steps of something else: `print(loss)`,
      `losses.append(float(loss))`, `self.log_metric(..., loss)`, `meter.update(loss)`,
      `self.step(x, h)`, `model = fit(sample)`, `self._update_model_kwargs_for_generation(...)`), an
      operand or module the loop rebinds (`W = next(ws)`, `self.W = ...`), or an in-place
      update of one (`self.w += ...`, `self.W.data.add_(...)`, `self.proj.weight.data -= ...`,
      `self.fc.reset_parameters()`, `self.fc.load_state_dict(sd)`, `p.mul_(0.99)` for `p` in
      `self.fc.parameters()`).
    - Chunked loops (`range(0, n, step)`, `x.split(chunk)`, `x[i:i + chunk]`): chunking bounds
      memory on purpose.
    - Items transformed in ways that differ between items or read other items: BatchNorm (its
      statistics span each step's batch), a boolean mask per item (`x[i][mask[i]]`), fresh
      random values (`x[i] + torch.randn(d)`), `x[i] - x[i - 1]`.
    - Items whose shapes may differ: iterating a list, `range(len(xs))` over something not known
      to be a tensor, data loaders.
    - numpy arrays and anything not known to be a tensor.

    ## Fix safety
    No automatic fix: the batched call changes how results are stored (a stacked tensor instead
    of a loop of writes), which needs a human to restructure the loop.
    """

    gemms_in_loops_only = True

    def check_gemm(self, node: ast.AST) -> None:
        found = self.per_item(node, self.ctx.loops)
        if found is not None:
            self.report(node, self._message(*found))

    def per_item(self, node: ast.AST, loops: list) -> Optional[tuple]:
        """(gemm, loop, batched) when the GEMM `node` runs once per item of one of `loops` (the
        loops around it, outermost first): what this rule reports. MAT601 asks it too."""
        gemm = as_gemm(self.ctx, node)
        if gemm is None or not gemm.operands:
            return None
        for loop in reversed(loops):
            depends = [loop.depends_on_iteration(op) for op in gemm.operands]
            if not any(depends):
                continue
            batched = [self._batched(loop, op, 0, transforms=True) if dep else None
                       for op, dep in zip(gemm.operands, depends)]
            if any(dep and b is None for dep, b in zip(depends, batched)):
                return None
            # What is not the item must hold still: `W = next(ws)`, `self.W = ...`, `self.W.data.mul_()`
            # or `self.proj.weight.data -= ...` in the loop give each step other weights.
            fixed = [op for op, dep in zip(gemm.operands, depends) if not dep] + [
                source for b in batched if b for source in b.sources]
            if gemm.op == "nn.Linear":
                fixed.append(node.func)
            elif gemm.op == "linear":
                fixed.extend(node.args[2:] + [k.value for k in node.keywords])
            if any(loop.changes(expr) for expr in fixed):
                return None
            if self._is_recurrence(loop) or updates_weights(self.ctx, loop):
                return None  # each step reads the last one's result, or the weights change between steps
            return gemm, loop, batched
        return None

    # -- analysis ---------------------------------------------------------------
    def _is_recurrence(self, loop: LoopInfo) -> bool:
        key = ("mat101_recurrence", id(loop.node))
        cached = self.ctx.shared.get(key)
        if cached is None:
            cached = False
            if loop.carried:
                for stmt in loop.body:
                    for sub in walk_no_scopes(stmt):
                        gemm = as_gemm(self.ctx, sub) if isinstance(sub, (ast.BinOp, ast.Call)) else None
                        if gemm and any(loop.reads_carried(op) for op in gemm.operands):
                            cached = True
                        elif (gemm is None and isinstance(sub, ast.Call) and sub.args
                              and any(loop.reads_carried(a) for a in sub.args) and self._recurrent_module(sub.func)):
                            cached = True  # `h, c = self.cell(x_t, (h, c))`
                        if cached:
                            break
                    if cached:
                        break
            self.ctx.shared[key] = cached
        return cached

    def _recurrent_module(self, func: ast.AST) -> bool:
        """`func` is an RNN cell or layer of torch.nn (`self.cell` after `self.cell =
        nn.LSTMCell(...)`, `cell` after `cell = nn.GRUCell(...)`), or a module class of this file:
        called on the state, it multiplies the state by its weights."""
        kind = _kinds.kind_of(self.ctx, func)
        if kind == _kinds.USER_MODULE:
            return True
        return kind == _kinds.OTHER and self._constructed_by(func, _RECURRENT_MODULES)

    def _constructed_by(self, func: ast.AST, classes) -> bool:
        """Every value bound to `func` (`self.norm`, or a local `norm`) is a call of one of `classes`."""
        ctx = self.ctx
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and ctx.class_ is not None:
            method = ctx.functions[0] if ctx.functions else None
            params = method.args.posonlyargs + method.args.args if method is not None else []
            if not params or func.value.id != params[0].arg:
                return False
            values = [value for _, value in _kinds.class_attribute_values(ctx, ctx.class_, func.attr)]
        elif isinstance(func, ast.Name) and ctx.function is not None:
            assign = flow_of(ctx, ctx.function).reaching(func)
            values = [assign.value] if assign is not None else []
        else:
            return False
        return bool(values) and all(isinstance(v, ast.Call) and ctx.qualname(v.func) in classes for v in values)

    def _index_var(self, loop: LoopInfo, name: str) -> bool:
        """`name` walks 0..n-1 one step at a time: a plain range/enumerate counter or a while counter."""
        if name not in loop.targets:
            return False
        it = loop.iter
        if it is None:  # while loop counter
            return True
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

    def _batched(self, loop: LoopInfo, op: ast.AST, depth: int, transforms: bool = False) -> Optional[_Batched]:
        """The loop's item that `op` is (`x[i]`, `x[:, t]`, `xt` for `xt` in `x.unbind(1)`, `x[i:i + 1]`,
        `x[i].float()`), or with `transforms`, computes from items of one index and values fixed
        in the loop, element by element or row by row (`(x[i] - mean)`, `torch.relu(x[b])`,
        `self.norm(x[:, t])`, `softmax(q[i] @ k[i].T)`): the batched tensor takes the same steps."""
        if depth > 4:
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
            assignment = self._single_assignment(loop, op.id)
            if assignment is not None:
                inner = self._batched(loop, assignment, depth + 1, transforms)
                return inner.wrapped() if inner else None
            return None
        if (isinstance(op, ast.Call) and isinstance(op.func, ast.Attribute) and self.ctx.qualname(op.func) is None
                and (op.func.attr in _SHAPE_KEEPING_METHODS or transforms and op.func.attr in _ELEMENTWISE_METHODS)):
            if any(loop.depends_on_iteration(a) for a in op.args):
                return None
            if op.func.attr in _ELEMENTWISE_METHODS and any(
                    self._varies(loop, a) for a in op.args + [k.value for k in op.keywords]):
                return None
            inner = self._batched(loop, op.func.value, depth + 1, transforms)
            return inner.wrapped() if inner else None
        if isinstance(op, ast.Attribute) and op.attr in _SHAPE_KEEPING_ATTRS:
            inner = self._batched(loop, op.value, depth + 1, transforms)
            return inner.wrapped() if inner else None
        return self._transformed_item(loop, op, depth) if transforms else None

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

    def _varies(self, loop: LoopInfo, expr: ast.AST) -> bool:
        """`expr` may differ between iterations: it reads the item or something the loop changes,
        or calls something (`torch.randn(d)` draws anew on every pass)."""
        return (loop.depends_on_iteration(expr) or loop.changes(expr)
                or any(isinstance(sub, ast.Call) for sub in walk_no_scopes(expr)))

    def _transformed_item(self, loop: LoopInfo, op: ast.AST, depth: int) -> Optional[_Batched]:
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
            return self._combined(loop, gemm.operands, fixed, depth)
        if isinstance(op, ast.BinOp) and isinstance(op.op, _ARITHMETIC):
            return self._combined(loop, [op.left, op.right], [], depth)
        if isinstance(op, ast.UnaryOp) and isinstance(op.op, (ast.USub, ast.UAdd)):
            inner = self._batched(loop, op.operand, depth + 1, True)
            return inner.wrapped() if inner else None
        if not isinstance(op, ast.Call) or not op.args or isinstance(op.args[0], ast.Starred):
            return None
        qualname = ctx.qualname(op.func)
        if qualname in _ELEMENTWISE_FUNCTIONS:
            rest = op.args[1:] + [k.value for k in op.keywords]
        elif (qualname is None and len(op.args) == 1 and not op.keywords
              and _kinds.kind_of(ctx, op.func) == _kinds.MODULE
              and self._constructed_by(op.func, _ELEMENTWISE_MODULE_CLASSES)):
            rest = [op.func]
        else:
            return None
        if any(self._varies(loop, r) for r in rest):
            return None
        inner = self._batched(loop, op.args[0], depth + 1, True)
        return inner.wrapped() if inner else None

    def _combined(self, loop: LoopInfo, operands: list, fixed: list, depth: int) -> Optional[_Batched]:
        """The per-item value of an operation whose operands are items of one index or fixed."""
        if any(self._varies(loop, f) for f in fixed):
            return None
        items = []
        for operand in operands:
            if loop.depends_on_iteration(operand):
                item = self._batched(loop, operand, depth + 1, True)
                if item is None:
                    return None
                items.append(item)
            elif self._varies(loop, operand):
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
        `torch.split(x, 1, dim=1)`: the tensor's slices along a dim, one by one."""
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
            if keyword.arg not in ("dim", "split_size", "split_size_or_sections"):
                return None
            given[keyword.arg if keyword.arg == "dim" else "split_size_or_sections"] = keyword.value
        if len(given) < len(args) + len(call.keywords) or any(isinstance(a, ast.Starred) for a in args):
            return None
        dim = _kinds.int_const(given["dim"]) if "dim" in given else 0
        if dim is None or dim < 0:
            return None
        if method == "split" and _kinds.int_const(given.get("split_size_or_sections")) != 1:
            return None  # chunks of several items bound memory on purpose
        return tensor, dim, method == "split"

    def _sliced_sequence(self, loop: LoopInfo, name: ast.AST) -> Optional[tuple]:
        """(tensor, dim, keeps_dim) when `name` holds `x.unbind(d)` or `x.split(1, d)`, bound
        before the loop: `inputs = x.unbind(0)` then `inputs[i]`."""
        ctx = self.ctx
        if not isinstance(name, ast.Name) or ctx.function is None or loop.changes(name):
            return None
        assign = flow_of(ctx, ctx.function).reaching(name)
        if assign is None or len(getattr(assign, "targets", ())) != 1 or not isinstance(assign.targets[0], ast.Name):
            return None
        walked = self._slicing_call(assign.value)
        return walked if walked is not None and self._tensor_base(walked[0]) else None

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

    # -- message ----------------------------------------------------------------
    def _message(self, gemm, loop: LoopInfo, batched) -> str:
        seg = self.ctx.segment
        if gemm.op == "@":
            what = "`@`"
        elif gemm.method:
            what = f"`{gemm.spelling}()`"
        else:
            what = f"`{gemm.spelling}`"
        node = loop.node
        if loop.is_comprehension:
            where = f"the comprehension on line {node.lineno}"
        elif isinstance(node, ast.While):
            where = f"the `while` loop on line {node.lineno}"
        else:
            where = f"the `for {seg(node.target)}` loop on line {node.lineno}"
        if gemm.op == "nn.Linear" and isinstance(gemm.node.func, ast.Subscript) and loop.depends_on_iteration(
                gemm.node.func):
            layers = seg(gemm.node.func.value)
            return (f"{what} applies a different layer of one shape on every iteration of {where}: many small "
                    f"GEMMs instead of one; stack the layers' weights once (`W = torch.stack([m.weight for m in "
                    f"{layers}])`, the biases likewise) and apply them all in one `torch.einsum` (or `bmm`) with "
                    f"the layer index as a batch dim")
        suggestion = self._suggestion(gemm, batched)
        return (f"{what} runs once per iteration of {where}: many small GEMMs instead of one; "
                f"{suggestion}")

    def _suggestion(self, gemm, batched) -> str:
        seg = self.ctx.segment
        ops = gemm.operands
        items = [seg(b.base) if b else seg(op) for b, op in zip(batched, ops)]
        present = [b for b in batched if b is not None]
        # `x[i] @ x[j]` over two loop variables: all pairs, not one batch
        plain = all(b.plain for b in present) and len({b.index for b in present}) == 1
        dim0 = plain and all(b.dim == 0 for b in present)
        generic = ("do all iterations in one call: `torch.matmul`/`bmm` with the loop's items as a batch "
                   "dimension, or `torch.einsum` with a batch index")
        if any(b.keeps_dim for b in present) and not (
                gemm.op in ("nn.Linear", "linear")
                or gemm.op in ("@", "matmul", "mm") and batched[0] is not None and len(present) == 1):
            return generic  # `x[i:i + 1]` keeps its dim: only a left operand or a layer's input batches as is
        if gemm.op == "einsum":
            eq = self._batched_einsum(gemm.subscripts, batched) if plain else None
            return f'use one call: `torch.einsum("{eq}", {", ".join(items)})`' if eq else generic
        if gemm.op in ("nn.Linear", "linear") and plain and batched[0] is not None and len(present) == 1:
            call = gemm.spelling if gemm.op == "nn.Linear" else seg(gemm.node.func)
            args = [items[0]] + [seg(a) for a in gemm.node.args[1:]] + [
                f"{k.arg}={seg(k.value)}" if k.arg else f"**{seg(k.value)}" for k in gemm.node.keywords]
            then = "" if batched[0].dim == 0 else f" and index dim {batched[0].dim} of the result"
            return (f"apply it once to the whole tensor: `{call}({', '.join(args)})`{then} "
                    f"(a linear layer maps the last dim over any leading dims)")
        if gemm.op in ("nn.Linear", "linear") and batched[0] is not None and len(present) == 1:
            return (f"apply it once to the whole `{items[0]}`, after the same steps that make its item here, "
                    f"and index dim {batched[0].dim} of the result (a linear layer maps the last dim over any "
                    f"leading dims)" if batched[0].dim is not None and batched[0].sources == (batched[0].base,)
                    else generic)
        if len(ops) != 2 or not dim0:
            return generic
        a, b = [text if isinstance(op, _ATOMS) else f"({text})"
                for text, op in zip(items, [bt.base if bt else op for bt, op in zip(batched, ops)])]
        if gemm.op in ("@", "matmul", "mm", "bmm"):
            return self._matmul_suggestion(gemm.op, batched, ops, a, b) or generic
        if gemm.op in ("dot", "inner") and len(present) == 2:
            return f"use one call: `({a} * {b}).sum(-1)`"
        if gemm.op == "mv":
            if len(present) == 2:
                return f'use one call: `torch.einsum("bij,bj->bi", {a}, {b})`'
            if batched[0] is not None:
                return f'use one call: `torch.einsum("bij,j->bi", {a}, {b})`'
            return f"use one call: `{b} @ {a}.T`"
        return generic

    def _matmul_suggestion(self, op: str, batched, ops, a: str, b: str) -> Optional[str]:
        """The batched call for `a[i] @ b[i]`, `a[i] @ b` or `a @ b[i]`. `matmul` treats a 1-D
        operand as a vector, not as a batch of scalars: `A @ x[i]` over vectors `x[i]` is
        `x @ A.T`, not `A @ x`. `mm` and `bmm` take matrices only."""
        left, right = batched
        if left is not None and right is not None:
            if op in ("mm", "bmm"):
                return f"use one batched call: `{'torch.bmm' if op == 'mm' else 'torch.matmul'}({a}, {b})`"
            ranks = (self._item_rank(left), self._item_rank(right))
            if ranks == (1, 1):
                return f"use one call: `({a} * {b}).sum(-1)`"
            if ranks == (2, 1):
                return f'use one call: `torch.einsum("bij,bj->bi", {a}, {b})`'
            if ranks == (1, 2):
                return f'use one call: `torch.einsum("bj,bjk->bk", {a}, {b})`'
            if None in ranks:
                return (f"use one batched call: `torch.matmul({a}, {b})` if each item is a matrix "
                        f"(with vector items, `torch.einsum` with a batch index)")
            return f"use one batched call: `torch.matmul({a}, {b})`" if min(ranks) >= 2 else None
        broadcast = f"use one batched call: `{a} @ {b}` (matmul broadcasts over the batch dim)"
        fixed = shape_of(self.ctx, ops[1] if left is not None else ops[0])
        if fixed is not None and fixed.rank is not None and fixed.rank > 2:
            return None  # its own batch dims would meet the loop's
        if left is not None or op in ("mm", "bmm"):
            return broadcast
        rank = self._item_rank(right)
        if rank is not None and rank >= 2:
            return broadcast
        if fixed is not None and fixed.rank == 1:
            vector_form = f"`{b} @ {a}`"
        elif fixed is not None and fixed.rank == 2:
            vector_form = f"`{b} @ {a}.T`"
        else:
            vector_form = f"`{b} @ {a}.T` for a 2-D `{a}`"
        if rank == 1:
            return f"use one call: {vector_form}"
        return (f"use one batched call: `{a} @ {b}` if each item of `{b}` is a matrix "
                f"(with vector items, {vector_form})")

    def _item_rank(self, item: _Batched) -> Optional[int]:
        shape = shape_of(self.ctx, item.base)
        return shape.rank - 1 if shape is not None and shape.rank else None

    @staticmethod
    def _batched_einsum(subscripts: Optional[str], batched) -> Optional[str]:
        if not subscripts or "->" not in subscripts or "." in subscripts:
            return None
        lhs, rhs = subscripts.replace(" ", "").split("->")
        terms = lhs.split(",")
        if len(terms) != len(batched):
            return None
        letter = next((c for c in _BATCH_LETTERS if c not in subscripts), None)
        if letter is None:
            return None
        if any(b is not None and b.dim > len(t) for t, b in zip(terms, batched)):
            return None
        terms = [t[:b.dim] + letter + t[b.dim:] if b is not None else t for t, b in zip(terms, batched)]
        return ",".join(terms) + "->" + letter + rhs
