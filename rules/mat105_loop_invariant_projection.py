"""MAT105 loop-invariant-projection: in a time-step recurrence, the input projection that does
not depend on the recurrent state, issued once per step instead of once for all steps."""
from __future__ import annotations

import ast

from matlint.rule import Rule

from matlint.semantic.kinds import class_attribute_values, keeps_itself, module_class_of
from matlint.semantic.loops import bound_names, loaded_names, updates_weights, walk_no_scopes
from matlint.semantic.shapes import method_of, self_name_of
from matlint.rule import GemmVisitor
from matlint.semantic.torch_api import as_gemm
from matlint.semantic.tree import fills_own_cache
from .mat101_python_loop_matmul import PythonLoopMatmul


_LINEAR = frozenset({"torch.nn.Linear", "torch.nn.LazyLinear"})
# Wrappers that give back the layer they are handed, its weight reparametrized.
_REPARAMETRIZED = frozenset({"torch.nn.utils.weight_norm", "torch.nn.utils.spectral_norm",
                             "torch.nn.utils.weight_norm.weight_norm", "torch.nn.utils.spectral_norm.spectral_norm",
                             "torch.nn.utils.parametrizations.weight_norm",
                             "torch.nn.utils.parametrizations.spectral_norm"})


def _projection_layer(value: ast.AST, qualname) -> bool:
    """`value` builds a layer that projects each position alike: an `nn.Linear`, an `nn.Conv1d`
    of kernel size 1 (a linear map of the channels at each position), also wrapped in
    `weight_norm(...)` or `spectral_norm(...)`."""
    if not isinstance(value, ast.Call):
        return False
    name = qualname(value.func)
    if name in _LINEAR:
        return True
    if name in _REPARAMETRIZED and value.args:
        return _projection_layer(value.args[0], qualname)
    if name == "torch.nn.Conv1d":
        size = value.args[2] if len(value.args) > 2 else next(
            (k.value for k in value.keywords if k.arg == "kernel_size"), None)
        stride = value.args[3] if len(value.args) > 3 else next((k.value for k in value.keywords if k.arg == "stride"), None)
        one = lambda v: isinstance(v, ast.Constant) and v.value == 1 or isinstance(v, (ast.Tuple, ast.List)) and len(
            v.elts) == 1 and isinstance(v.elts[0], ast.Constant) and v.elts[0].value == 1
        return size is not None and one(size) and (stride is None or one(stride)) and len(value.args) <= 4
    return False


def _leading_rows_of(arg: ast.AST) -> ast.AST:
    """`x` for `x[:k]` (leading rows, whatever `k`): a row-wise projection of them is the rows of
    the projection of `x`. Any other expression is itself."""
    if (isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Slice) and arg.slice.lower is None
            and arg.slice.step is None):
        return arg.value
    return arg


# Methods that give the same values in another layout: a projection of each position after
# them is the projection of the tensor they are called on, laid out so.
_LAYOUT_METHODS = frozenset({"permute", "transpose", "t", "contiguous", "unsqueeze"})


def _relaid(value: ast.AST, param: str) -> bool:
    """`value` is `param` through layout methods only (`ref.permute(1, 2, 0)`)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _LAYOUT_METHODS:
        value = value.func.value
    return isinstance(value, ast.Name) and value.id == param


def _projection_of(ctx, cls: ast.ClassDef, forward, param: str, qualname):
    """(the call `self.layer(param)` in `forward` of a projection (`_projection_layer`) that
    `cls` builds in `__init__` and stores nowhere else, the layout `param` is given first or
    None): `param` is never rebound in `forward`, or only by one statement of its body that lays
    it out anew before the call (`ref = ref.permute(1, 2, 0)`), and the call fills no cache of the
    module (`if self.key is None: self.key = self.proj_k(enc)`); else None."""
    stores = [n for n in ast.walk(forward) if isinstance(n, ast.Name) and n.id == param and not isinstance(n.ctx, ast.Load)]
    layout = None
    if stores:
        statement = next((stmt for stmt in forward.body if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                          and stmt.targets[0] is stores[0]), None)
        if len(stores) != 1 or statement is None or not _relaid(statement.value, param):
            return None
        layout = statement.value
    self_name = (forward.args.posonlyargs + forward.args.args)[0].arg
    cached = {id(sub) for branch in ast.walk(forward) if isinstance(branch, ast.If) and fills_own_cache(branch, self_name)
              for sub in ast.walk(branch)}  # `if self.key is None: self.key = self.proj_k(enc)`: projected once
    for sub in ast.walk(forward):
        if id(sub) in cached:
            continue
        if (isinstance(sub, ast.Call) and len(sub.args) == 1 and not sub.keywords
                and isinstance(sub.args[0], ast.Name) and sub.args[0].id == param
                and isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == self_name and (layout is None or sub.lineno > layout.lineno)):
            stores = [value for method, value in class_attribute_values(ctx, cls, sub.func.attr)
                      if not keeps_itself(method, value, sub.func.attr)]  # `self.W = self.W.cuda()` keeps it
            if stores and all(_projection_layer(v, qualname) for v in stores):
                return sub, layout
    return None


def _laid_out(layout, param: str, text: str, tensor: ast.AST) -> str:
    """`text`, the source of `tensor`, passed for `param`, laid out as `layout` lays out `param`."""
    if layout is None:
        return text
    if not isinstance(tensor, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
        text = f"({text})"  # `(a + b).permute(1, 2, 0)`
    relaid = _ReplaceName(param, text).visit(ast.parse(ast.unparse(layout), mode="eval"))
    return ast.unparse(relaid)


def _bound_in(function) -> set:
    """The names `function` binds: its parameters and what it assigns."""
    args = function.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a is not None}
    return names | bound_names(function)


class _ReplaceName(ast.NodeTransformer):
    def __init__(self, name: str, text: str):
        self.name, self.text = name, text

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(self.text if node.id == self.name else node.id, node.ctx)


class LoopInvariantProjection(GemmVisitor, Rule):
    code = "MAT105"
    name = "loop-invariant-projection"
    summary = "An input projection recomputed at every step of a recurrence although it does not depend on the state; do all steps in one GEMM before the loop."
    docs = """
    ## What it does
    In a recurrence (a loop where some GEMM reads a value the previous iteration produced, such
    as an RNN's `h @ W_hh` or `self.h @ W_hh`, or where an RNN cell such as `nn.LSTMCell`, or a
    module class of the file, is called on it), flags each GEMM that reads the step's slice of
    a tensor fixed before the loop (`x[t] @ W_xh`, `x[:, t] @ W`, `self.W_ih(x[:, t])`,
    `F.linear(x_t, w, b)` with `x_t = x[t]`, `torch.einsum("bd,dh->bh", x[:, t], W)`, `x_t @ W`
    for `x_t` in `x`, `x.unbind(1)`, `torch.unbind(x, 1)` or `x.split(1, dim=1)`, `inputs[i]`
    after `inputs = x.unbind(0)`, or such a slice through the steps MAT101 follows, as in
    `self.in_proj(self.embed(tgt[:, t]))`) and a loop-invariant weight, and nothing from the
    recurrent state. The
    message gives the hoisted call and how the loop reads it (`proj[t]`, with the loop's own
    counter, or iterating over `proj` in place of `x`). A name read after an assignment of the
    step's slice in the same pass counts as the slice, though other passes give it another value
    (teacher forcing: `ynext = y[:, t]` in one arm, the step before's prediction in the other,
    where the read of the prediction stays quiet).
    MAT101 stays quiet on recurrences; this rule covers the part of them that is not sequential.

    It also looks into a step function the loop calls with the step's slice and the recurrent
    state (`hidden = recurrence(x[t], hidden)`, a function the enclosing function defines, or
    `h = self.step(x[:, t], h)`, a method of the class defined above the caller): a GEMM there that
    reads only the parameter receiving the slice, with weights fixed before the loop, is flagged
    where it is written, and the message names the call.

    It also flags a call, in such a loop, of a module the class holds (`self.attention(memory, h)`
    after `self.attention = Attention(...)`, a class of the file or of a project module it
    imports) whose `forward` applies one of its projections (an `nn.Linear`, also wrapped in
    `weight_norm`/`spectral_norm`, or an `nn.Conv1d` of kernel size 1) straight to the parameter
    that receives a tensor fixed before the loop, or leading rows of one (`memory[:n]`): the
    decoder attention's `self.W(features)`, recomputed at every decode step. The `forward` may
    first lay the parameter out anew in one statement (`ref = ref.permute(1, 2, 0)`, also
    `transpose`, `t`, `contiguous`, `unsqueeze`): the projection is then of the tensor so laid
    out. Such a call in a step function nested in the method (`def recurrence(x, hidden):
    ... self.pointer(h, context)`, a pointer network's decoder), which the loop calls with the
    recurrent state, counts where the tensor is a name of the method that the step function
    does not bind and the loop does not change. The message names the projection to compute
    once before the loop and pass in (`self.pointer.project_ref(context.permute(1, 2, 0))`).

    ## Why is this bad?
    Only `h @ W_hh` has to wait for the previous step. The input projection of every step can
    be computed up front as one large GEMM (`x @ W_xh` over all T steps), which runs at full
    matrix-unit throughput instead of T small GEMMs with T launches; cuDNN's RNNs do exactly this.

    ## Example
    ```python
    for t in range(T):
        h = torch.tanh(x[t] @ W_xh + h @ W_hh + b)
    ```

    ## Use instead
    ```python
    xw = x @ W_xh                      # all steps at once
    for t in range(T):
        h = torch.tanh(xw[t] + h @ W_hh + b)
    ```

    ## Stays quiet on
    - Loops that are not recurrences (MAT101 reports their GEMMs), and GEMMs that read the state
      (`h @ W_hh`) or anything derived from it in the step.
    - Module calls whose argument changes per step (`x[:, t]`, the state, a parameter of the
      step function or a value it computes, or a call, which may give another value each step:
      `self.decoder.get_query()`), that project into a cache the module fills when it is empty
      (`if self.key is None: self.key = self.proj_k(enc)`), that the module transforms before projecting
      (`features = features * h`; a new layout is no transform), or that it does not project
      with a layer of its own (a projection already hoisted and passed in), nor with a layer
      that mixes positions (an `nn.Conv1d` of kernel size 3).
    - Inputs that are not a per-step slice of one tensor (a list of steps, a value fed
      back from the previous prediction, `x[t:t + k]` or `x.split(k, 1)` chunks), tensors rebound or written in
      place inside the loop (`ys[:, t + 1].copy_(h)`, also through another name for the same
      memory: `buf = x` then `buf[t + 1] = h @ Wo`), and weights that change per step
      (`self.W_x.data.mul_(0.99)`, an optimizer step in the loop, a call that may run one:
      `train_step(loss, opt)`, `self.training_step(batch)`; logging a loss, `print(loss)` or
      `losses.append(float(loss))` steps nothing).

    ## Fix safety
    No automatic fix: hoisting adds a tensor of all steps' projections and changes the loop body.
    """

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        # MAT101's loop analysis (per-step items, recurrences), reused rather than copied.
        self._loop_gemms = PythonLoopMatmul(ctx)
        self._reported_in_callees: set = set()  # GEMMs and module calls of a step function, reported once however often called

    gemms_in_loops_only = True

    def visit_Call(self, node: ast.Call) -> None:
        super().visit_Call(node)  # a GEMM of the step
        if self.ctx.loops:
            loop = self.ctx.loops[-1]
            if not loop.is_comprehension and self._loop_gemms._is_recurrence(loop):
                self._check_module_call(node, loop)
            self._check_step_function(node)

    def _check_step_function(self, node: ast.Call) -> None:
        """`hidden = recurrence(x[t], hidden)`: a function the enclosing function defines (or a
        method of the class, `self.cell(x[t], h)`) called with the step's slice of a tensor fixed
        before the loop and with the recurrent state. Each GEMM in it that reads the parameter
        receiving the slice, with weights fixed before the loop, is the input projection."""
        loop = self.ctx.loops[-1]
        if loop.is_comprehension or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            return
        callee = self._step_function(node.func)
        if callee is None:
            return
        if not any(loop.reads_carried(arg) for arg in node.args) or updates_weights(self.ctx, loop):
            return  # no recurrent state goes in (MAT101's loop, not a recurrence), or the weights change
        if isinstance(node.func, ast.Name):  # a function nested in this one: what it reads of ours is fixed
            for call in walk_no_scopes(callee):
                if isinstance(call, ast.Call):
                    self._check_module_call(call, loop, callee)
        if not self._gemms_of(callee):
            return
        params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
        if isinstance(node.func, ast.Attribute):
            params = params[1:]
        passed = list(zip(params, node.args))
        rebound = {n.id for n in ast.walk(callee) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        for param, arg in passed:
            if param in rebound:
                continue
            item, forced = self._step_item(loop, arg)
            if item is None or any(loop.changes(source) for source in item.sources):
                continue
            for gemm in self._projections_of(callee, param, set(params), loop):
                if id(gemm.node) in self._reported_in_callees:
                    continue
                self._reported_in_callees.add(id(gemm.node))
                given = (f"the step's slice `{self.ctx.segment(arg)}`" if forced is None else
                         f"`{self.ctx.segment(arg)}`, the step's slice `{self.ctx.segment(forced)}` on the steps "
                         f"that take it (line {forced.lineno}; the other steps still project what they take)")
                self.report(gemm.node, f"this projection reads only `{param}`, which the call at line {node.lineno} "
                                       f"(`{self.ctx.segment(node.func)}(...)`) gives {given}, "
                                       f"not the recurrent state: {self._suggestion(gemm, item, arg, loop)}, and "
                                       f"hand `{callee.name}` the step's projected rows in place of `{param}`")

    def _step_item(self, loop, arg: ast.AST) -> tuple:
        """(the step's slice of a tensor fixed before the loop that `arg` is, the slice's
        expression when `arg` is a name that only some of the assignments it reads give the
        slice): `x[:, t]`, `x_t` after `x_t = x[:, t]`, or, under teacher forcing, `ins` after
        `ins = x[:, t]` in one arm and `ins = preds[t - 1]` (the step before's prediction) in the
        other, where the slice's steps can take a projection computed before the loop. (None,
        None) for anything else, or a value of the step before alone."""
        items = self._loop_gemms
        if not loop.reads_carried(arg):
            if isinstance(arg, ast.Name) and arg.id not in loop.targets:  # `x_t = x[t]` then `x_t @ W`
                arg = items._assigned_value(loop, arg)
            return (items._batched(loop, arg, 0, transforms=True) if arg is not None else None), None
        if not isinstance(arg, ast.Name) or arg.id in loop.targets:
            return None, None
        stores = loop.assigned_this_pass(arg)
        if stores is None or len(stores) < 2 or not all(isinstance(s, ast.Assign) for s in stores):
            return None, None
        slices = [(items._batched(loop, s.value, 0, transforms=True), s.value) for s in stores]
        slices = [(item, value) for item, value in slices if item is not None and not loop.reads_carried(value)]
        if not slices or len({(ast.dump(item.base), item.dim) for item, _ in slices}) != 1:
            return None, None
        return slices[0]

    def _step_function(self, func: ast.AST):
        """The function a call in the loop runs: one the enclosing function defines once under
        that name, or a method of the enclosing class called on `self` defined above the method
        that calls it."""
        ctx = self.ctx
        if isinstance(func, ast.Name) and ctx.function is not None:
            return self._nested_functions(ctx.function).get(func.id)
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and ctx.class_ is not None
                and ctx.functions and func.value.id == self_name_of(ctx.functions[0])):
            method = method_of(ctx.class_, func.attr)
            # one the walk has been through already: what its GEMMs are was read in its own scope
            return method if method is not None and method.lineno < ctx.functions[0].lineno else None
        return None

    def _nested_functions(self, function) -> dict:
        """The functions `function` defines, by name, where the name is bound by that one `def`
        and nothing else in it (read once per function)."""
        key = ("mat105_nested", id(function))
        found = self.ctx.shared.get(key)
        if found is None:
            defs, stored = {}, set()
            for sub in ast.walk(function):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub is not function:
                    defs.setdefault(sub.name, []).append(sub)
                elif isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                    stored.add(sub.id)
            found = self.ctx.shared[key] = {name: found[0] for name, found in defs.items()
                                            if len(found) == 1 and name not in stored}
        return found

    def _gemms_of(self, callee) -> list:
        """The GEMMs `callee`'s body issues (read once per function)."""
        key = ("mat105_gemms", id(callee))
        found = self.ctx.shared.get(key)
        if found is None:
            found = self.ctx.shared[key] = [g for g in (as_gemm(self.ctx, sub) for sub in ast.walk(callee)
                                                        if isinstance(sub, (ast.Call, ast.BinOp)))
                                            if g is not None and g.operands]
        return found

    def _projections_of(self, callee, param: str, params: set, loop) -> list:
        """The GEMMs in `callee` with `param` as their only per-call operand: every other operand
        is a weight fixed before the loop (`self.W`, a layer of the class, a name of the
        enclosing scope the loop does not change), none another parameter."""
        found = []
        for gemm in self._gemms_of(callee):
            sub = gemm.node
            operands = list(gemm.operands)
            extra = list(sub.args[len(gemm.operands):]) if gemm.op == "linear" else []
            if sum(isinstance(op, ast.Name) and op.id == param for op in operands) != 1:
                continue
            others = [op for op in operands if not (isinstance(op, ast.Name) and op.id == param)] + extra
            if gemm.op == "nn.Linear":
                others.append(sub.func)
            if any(loaded_names(op) & params or loop.changes(op) for op in others):
                continue
            found.append(gemm)
        return found

    def _check_module_call(self, node: ast.Call, loop, step=None) -> None:
        """`self.attention(encoder_out, h)` in the recurrence `loop`, a module of a class of the
        project whose `forward` applies a linear layer straight to the parameter that receives
        `encoder_out`, the same tensor (or leading rows of it) in every step. `step`: the nested
        function the call is in, which the loop calls; then the tensor is a name of the
        enclosing function that `step` does not bind."""
        func = node.func
        if (id(node) in self._reported_in_callees or not node.args or not isinstance(func, ast.Attribute)
                or not isinstance(func.value, ast.Name) or any(isinstance(a, ast.Starred) for a in node.args)):
            return
        held = module_class_of(self.ctx, func)
        if held is None:
            return
        cls, qualname, where = held
        forward = method_of(cls, "forward")
        if forward is None or (step is None and updates_weights(self.ctx, loop)) or loop.changes(node.func):
            return
        bound = _bound_in(step) if step is not None else set()
        params = [a.arg for a in forward.args.posonlyargs + forward.args.args][1:]
        passed = dict(zip(params, node.args))
        passed.update((k.arg, k.value) for k in node.keywords if k.arg in params)
        for param, arg in passed.items():
            fixed = _leading_rows_of(arg)
            if step is not None and (not isinstance(fixed, ast.Name) or fixed.id in bound):
                continue  # a value of the step's own
            if (loop.depends_on_iteration(fixed) or loop.changes(fixed) or loop.reads_carried(fixed)
                    or loop.reads_carried(arg) or any(isinstance(sub, ast.Call) for sub in ast.walk(fixed))):
                continue  # a call may give another value each step (`self.decoder.get_query()` reads its state)
            found = _projection_of(self.ctx, cls, forward, param, qualname)
            if found is None:
                continue
            layer, layout = found
            self._reported_in_callees.add(id(node))
            seg = self.ctx.segment
            rows = "" if fixed is arg else f", and `{seg(arg)}` is leading rows of it, which are the rows of that projection"
            line = f"line {layer.lineno}" if where is None else f"{where}:{layer.lineno}"
            every = "every step" if step is None else f"every step of the loop on line {loop.node.lineno} (through `{step.name}`)"
            relaid = "" if layout is None else f" (after `{ast.unparse(layout)}`)"
            self.report(node, f"`{seg(node.func)}` applies `self.{layer.func.attr}` to `{param}`{relaid} ({line}) at "
                              f"{every}, but `{seg(fixed)}` is the same tensor in every step{rows}: compute "
                              f"`{seg(node.func)}.{layer.func.attr}({_laid_out(layout, param, seg(fixed), fixed)})` once "
                              f"before the loop and pass the projection in")
            return

    def check_gemm(self, node: ast.AST) -> None:
        gemm = as_gemm(self.ctx, node)
        if gemm is None or not gemm.operands:
            return
        loop = self.ctx.loops[-1]
        if loop.is_comprehension or not self._loop_gemms._is_recurrence(loop) or updates_weights(self.ctx, loop):
            return  # no recurrence, or the weights change between steps (`opt.step()` in the loop)
        stepped = [op for op in gemm.operands if loop.depends_on_iteration(op) or loop.reads_carried(op)]
        if len(stepped) != 1:
            return
        step_input = stepped[0]
        item, forced = self._step_item(loop, step_input)
        if item is None or any(loop.changes(source) for source in item.sources):
            return
        others = [op for op in gemm.operands if op is not step_input]
        extra = [a for a in getattr(node, "args", [])[len(gemm.operands):]] if gemm.op == "linear" else []
        if any(loop.changes(op) for op in others + extra):
            return
        if gemm.op == "nn.Linear" and loop.changes(node.func):
            return
        forced_text = "" if forced is None else (
            f" (`{self.ctx.segment(step_input)}` is the step's slice `{self.ctx.segment(forced)}` on the steps "
            f"that take it, line {forced.lineno}; the other steps still project what they take)")
        self.report(node, f"this projection reads only the step's input{forced_text}, not the recurrent state: "
                          f"{self._suggestion(gemm, item, step_input, loop)}")

    def _suggestion(self, gemm, item, step_input, loop) -> str:
        seg = self.ctx.segment
        base = seg(item.base)
        dim = item.dim
        whole = None
        if item.keeps_dim:
            pass  # `x.split(1, 1)`: the hoisted result is indexed differently
        elif item.plain and gemm.op == "nn.Linear":
            whole = f"{gemm.spelling}({base})"
        elif item.plain and gemm.op == "linear":
            whole = f"{seg(gemm.node.func)}({', '.join([base] + [seg(a) for a in gemm.node.args[1:]])})"
        elif item.plain and item.dim == 0 and gemm.op in ("@", "matmul") and gemm.operands[0] is step_input:
            whole = f"{base} @ {seg(gemm.operands[1])}"
        elif item.plain and gemm.op == "einsum":
            batched = [item if op is step_input else None for op in gemm.operands]
            eq = PythonLoopMatmul._batched_einsum(gemm.subscripts, batched)
            if eq:  # the steps' letter leads the output
                operands = ", ".join(base if b else seg(op) for b, op in zip(batched, gemm.operands))
                whole = f'{seg(gemm.node.func)}("{eq}", {operands})'
                dim = 0
        if whole is None:
            return "compute it for all steps in one GEMM before the loop and index the result per step"
        hoist = f"compute all steps in one GEMM before the loop (`proj = {whole}`)"
        index = self._step_index(loop, item)
        if index is None:
            if dim != 0:
                return f"{hoist} and index it per step"
            return f"{hoist} and iterate over `proj` in place of `{base}`"
        return f"{hoist} and read `proj[{', '.join([':'] * dim + [index])}]` in the loop"

    def _step_index(self, loop, item):
        """The loop's counter of steps: `t` in `x[t]`, `i` in `for i, x_t in enumerate(x)`; None
        for `for x_t in x`."""
        if self._loop_gemms._index_var(loop, item.index):
            return item.index
        target = self._loop_gemms._target_node(loop)
        if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
            if self._loop_gemms._index_var(loop, target.elts[0].id):
                return target.elts[0].id
        return None
