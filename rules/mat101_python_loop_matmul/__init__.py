"""MAT101 python-loop-matmul: a GEMM issued once per item from a Python loop."""
from __future__ import annotations

import ast
import os
import re
from typing import Optional

from matlint.rule import Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import CallSite, argument_for, file_calls
from matlint.semantic.file import Position
from matlint.semantic.flow import flow_of
from matlint.semantic.shapes import Instance, forward_of, method_of, value_of
from matlint.semantic.loops import LoopInfo, loaded_names, updates_weights, walk_no_scopes
from matlint.rule import GemmVisitor
from matlint.semantic.torch_api import as_gemm

from .advice import _BatchedAdvice
from .items import _PerItemOperands


def _writes_state(function) -> bool:
    """`function` stores into an attribute or a subscript, or declares `global`/`nonlocal`: a
    call's effects may depend on the calls before it."""
    for sub in walk_no_scopes(function):
        if sub.__class__ in (ast.Global, ast.Nonlocal):
            return True
        if sub.__class__ in (ast.Assign, ast.AugAssign, ast.AnnAssign):
            targets = sub.targets if sub.__class__ is ast.Assign else [sub.target]
            if any(t.__class__ in (ast.Attribute, ast.Subscript) for t in targets):
                return True
    return False


_DEF = re.compile(r"\bdef\s+(\w+)")


def _defined_names(ctx) -> frozenset:
    """The names of the file's functions and methods, read off its text."""
    found = ctx.shared.get("mat101.defined_names")
    if found is None:
        found = ctx.shared["mat101.defined_names"] = frozenset(_DEF.findall(ctx.source))
    return found


def _gemm_on(ctx, function, cls, params: set, source=None):
    """The first GEMM of `function` (outside its own loops and nested functions) with an operand
    computed from `params`, seen from inside the function in `source` (the file that defines
    it: this one unless given); None if there is none."""
    key = ("mat101.gemm_on", id(function), frozenset(params))
    if key not in ctx.shared:
        ctx.shared[key] = _first_gemm_on(source or ctx, function, cls, params)
    return ctx.shared[key]


def _first_gemm_on(source, function, cls, params: set):
    at = Position(source, (function,), cls)
    tainted = set(params)
    for stmt in _straight_line(function.body):
        for sub in walk_no_scopes(stmt):
            if sub.__class__ in (ast.BinOp, ast.Call):
                gemm = as_gemm(at, sub)
                if gemm is not None and any(loaded_names(op) & tainted for op in gemm.operands):
                    return gemm
        if stmt.__class__ is ast.Assign and loaded_names(stmt.value) & tainted:
            tainted |= {n.id for t in stmt.targets for n in ast.walk(t) if n.__class__ is ast.Name}
    return None


def _straight_line(body: list):
    """The statements of `body`, those of its `if`/`with`/`try` blocks in order, not of loops."""
    for stmt in body:
        if stmt.__class__ in (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef,
                              ast.ClassDef):
            continue
        if stmt.__class__ in (ast.If, ast.With, ast.AsyncWith, ast.Try):
            yield from _straight_line(stmt.body)
            yield from _straight_line(getattr(stmt, "orelse", []))
            for handler in getattr(stmt, "handlers", []):
                yield from _straight_line(handler.body)
            yield from _straight_line(getattr(stmt, "finalbody", []))
            continue
        yield stmt


_RECURRENT_MODULES = frozenset({"torch.nn.RNNCell", "torch.nn.LSTMCell", "torch.nn.GRUCell",
                                "torch.nn.RNN", "torch.nn.LSTM", "torch.nn.GRU"})


class PythonLoopMatmul(_PerItemOperands, _BatchedAdvice, GemmVisitor, Rule):
    code = "MAT101"
    name = "python-loop-matmul"
    summary = "A matrix multiply issued once per item from a Python loop; one batched call does them all."
    runtime_docs = """
    `with matlint.guard():` reports a line that issues at least 4 GEMMs of one shape per step
    that do not feed each other, and says what to batch them into from what the calls share: one
    weight (one call of the layer on the stacked inputs), one input (one GEMM on the concatenated
    weights), neither (`torch.bmm`, or `torch.func.stack_module_state` + `torch.vmap` for
    per-module weights). Quiet where each call feeds the next (a recurrence, a stack of layers, a
    decode loop) and in a rollout whose next input the host makes from a value it read. The
    estimate times the calls one by one against the batched call at the observed shapes.
    """
    docs = """
    ## What it does
    Flags a GEMM (`@`, `torch.matmul`, `mm`, `bmm`, `einsum`, `dot`, `mv`, `tensordot`,
    `F.linear`, the `.matmul()`/`.mm()` methods, or an `nn.Linear` module) inside a `for`/`while`
    loop or comprehension when one of its operands is the loop's item: indexed by the loop
    variable (`x[i]`, `x[:, i]`, `x[i, ...]`, `x.select(0, i)`, `x[i:i + 1]` in a step-1 loop,
    `q[b, h]` in the loop over `h`, `hidden[b, 0]`), iterated over (`for xi in x`,
    `x.unbind(1)`, `torch.unbind(x, 0)`, `x.split(1)`, `x.chunk(x.size(1), dim=1)`), or assigned
    from such an item in the loop body, also through steps that treat every item alike: arithmetic with values fixed
    in the loop (`(x[i] - mean) @ W`), joins of items of one index with such values
    (`torch.cat([xf[:, i], c[:, i], ctx], dim=1)`), elementwise torch functions (`torch.relu(x[b])`), row-wise
    modules (`self.fc(self.norm(x[:, t]))` with a LayerNorm, Embedding, Dropout or activation),
    and earlier GEMMs of the item (`att @ v[i]` with `att = softmax(q[i] @ k[i].T)`). Also a
    call that hands the item to a function or method of the file, or to a module whose class
    the file or a project module it imports defines (its `forward`), where that function runs
    such a GEMM on it outside any loop of its own (`self.score(hidden[:, b], enc[i, b])`,
    `model(x)` for `x` in `X`, `self.att(c * q.select(1, i))` after `from layers import
    Linear` and `self.att = Linear(d, 1)`). The
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
    - A called function that stores into an attribute or subscript or declares `global` (each
      call may depend on the ones before), whose GEMM reads only values fixed in the loop, or
      runs in a loop of its own (reported there when it is per item); a call handed the value
      of the step before (`h = step(x[t], h)`).
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
        elif node.__class__ is ast.Call:
            called = self.per_item_call(node, self.ctx.loops)
            if called is not None:
                self.report(node, self._call_message(node, *called))

    def per_item_call(self, node: ast.Call, loops: list) -> Optional[tuple]:
        """(function, gemm, loop, the file defining the function) when `node` calls a function or
        method of the file, or a module whose class the file or a project module defines (its
        `forward`), with the loop's item, and that function runs a GEMM on it outside any loop of
        its own: the GEMM runs once per item, as if written in the loop."""
        found = self._callee(node)
        if found is None:
            return None
        function, site, cls, source = found
        if function.name == "__init__" or function in self.ctx.functions:
            return None  # a constructor, or a recursion
        if any(a.__class__ is ast.Starred for a in node.args) or any(k.arg is None for k in node.keywords):
            return None
        params = [a.arg for a in function.args.posonlyargs + function.args.args][1 if site.bound else 0:]
        params += [a.arg for a in function.args.kwonlyargs]
        passed = {p: argument_for(site, function, p) for p in params}
        for loop in reversed(loops):
            items = {p for p, arg in passed.items() if arg is not None and loop.depends_on_iteration(arg)}
            if not items:
                continue
            gemm = _gemm_on(self.ctx, function, cls, items, source)
            if gemm is None or _writes_state(function):
                return None  # no GEMM on the item, or a call whose effects depend on the calls before
            if any(self._batched(loop, passed[p], 0, transforms=True) is None or loop.reads_carried(passed[p])
                   for p in items):
                return None  # not an item of one tensor, or a value of the step before (a recurrence)
            if any(loop.changes(arg) for p, arg in passed.items() if arg is not None and p not in items):
                return None
            if self._is_recurrence(loop) or updates_weights(self.ctx, loop):
                return None
            return function, gemm, loop, source
        return None

    def _callee(self, node: ast.Call) -> Optional[tuple]:
        """(function, CallSite, its class, the file that defines it) for what `node` runs: a
        function or method of the file, or the `forward` of a module whose class a project
        module defines (`self.proj(x)` after `self.proj = Linear(d, 1)` and `from utils.nn
        import Linear`)."""
        ctx = self.ctx
        if self._may_call_the_files_code(node):
            calls = file_calls(ctx)
            found = calls.callee(node, tuple(ctx.functions), ctx.class_)
            if found is not None:
                return found[0], found[1], calls.class_of.get(id(found[0])), ctx
        if ctx.qualname(node.func) is not None or _kinds.kind_of(ctx, node.func) != _kinds.USER_MODULE:
            return None
        instance = value_of(ctx, node.func)
        if instance.__class__ is not Instance or instance.source is ctx or instance.source is None:
            return None
        run = forward_of(instance.cls)
        function = method_of(instance.cls, run) if run is not None else None
        if function is None:
            return None
        return function, CallSite(node, tuple(ctx.functions), ctx.class_, True, (), False), instance.cls, instance.source

    def _may_call_the_files_code(self, node: ast.Call) -> bool:
        """Read off the syntax, before the file's calls are resolved: `f(...)` or `obj.m(...)`
        where the file defines a function `f` or `m`, or `model(...)` in a file whose classes can
        be called (a `forward` or `__call__`). An imported name (`torch.relu`) is none of them."""
        func = node.func
        if self.ctx.qualname(func) is not None:
            return False
        defined = _defined_names(self.ctx)
        if func.__class__ is ast.Attribute:
            return func.value.__class__ is ast.Name and (func.attr in defined or (
                func.value.id == "self" and ("forward" in defined or "__call__" in defined)))
        return func.__class__ is ast.Name and (func.id in defined or "forward" in defined or "__call__" in defined)

    def per_item(self, node: ast.AST, loops: list) -> Optional[tuple]:
        """(gemm, loop, batched) when the GEMM `node` runs once per item of one of `loops` (the
        loops around it, outermost first): what this rule reports. MAT601 asks it too."""
        gemm = as_gemm(self.ctx, node)
        if gemm is None or not gemm.operands:
            return None
        inner = []  # loops inside the next one whose item an operand is, in no way a batch dim holds
        for loop in reversed(loops):
            depends = [loop.depends_on_iteration(op) for op in gemm.operands]
            if not any(depends):
                continue
            batched = [self._batched(loop, op, 0, transforms=True, held=tuple(inner)) if dep else None
                       for op, dep in zip(gemm.operands, depends)]
            if any(dep and b is None for dep, b in zip(depends, batched)):
                if not inner and all(b is None for b in batched) and self._repeats_alike(loop, loops):
                    inner.append(loop)  # `polys[k]` of `for k in range(K)`: a batched loop may hold it
                    continue
                return None
            # What is not the item must hold still: `W = next(ws)`, `self.W = ...`, `self.W.data.mul_()`
            # or `self.proj.weight.data -= ...` in the loop give each step other weights. An operand
            # that only a loop inside this one changes (`polys[k]` of the inner `for k`) holds still
            # for each of that loop's items: one call per item of it does all of this loop's.
            fixed = [op for op, dep in zip(gemm.operands, depends) if not dep] + [
                source for b in batched if b for source in b.sources]
            if gemm.op == "nn.Linear":
                fixed.append(node.func)
            elif gemm.op == "linear":
                fixed.extend(node.args[2:] + [k.value for k in node.keywords])
            if any(loop.changes(expr) and not self._held_by_inner(loop, inner, expr) for expr in fixed):
                return None
            if self._is_recurrence(loop) or updates_weights(self.ctx, loop) or any(
                    self._is_recurrence(each) for each in inner):
                return None  # each step reads the last one's result, or the weights change between steps
            return gemm, loop, batched
        return None

    def _repeats_alike(self, loop: LoopInfo, loops: list) -> bool:
        """`loop` runs inside another of `loops` and goes over the same items on every pass of
        it (`for k in range(self.K)`, `for w in self.weights`)."""
        index = next(i for i, each in enumerate(loops) if each is loop)
        if index == 0 or loop.is_comprehension or not isinstance(loop.node, ast.For):
            return False
        outer = loops[index - 1]
        return not outer.depends_on_iteration(loop.node.iter) and not outer.changes(loop.node.iter)

    def _call_message(self, node: ast.Call, function, gemm, loop: LoopInfo, source) -> str:
        what = f"`{self.ctx.segment(node.func)}(...)`"
        text = " ".join(source.segment(gemm.node).split())
        where = "" if source is self.ctx else f" in {os.path.relpath(source.filename, os.path.dirname(self.ctx.filename))}"
        inner = f"`{text if len(text) <= 60 else text[:57] + '...'}` on line {gemm.node.lineno} of `{function.name}`{where}"
        return (f"{what} runs a GEMM on this loop's item ({inner}) once per iteration of {loop.described}: many small "
                f"GEMMs instead of one; call it once on all items stacked along a batch dim (the GEMM "
                f"batches over leading dims: `matmul`, `bmm` or the layer itself)")

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
