"""MAT504 tiny-ops: per-parameter updates launched one small kernel at a time, where foreach,
fused optimizers or torch.compile would batch them."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.diagnostics import Edit, Fix
from matlint.rule import Only, Rule

from matlint.semantic import kinds as _kinds
from matlint.semantic.calls import file_calls
from matlint.semantic.kinds import identifier_text
from matlint.semantic.steps import OPTIMIZERS, updates_every_step, updates_once
from matlint.semantic.loops import LoopInfo, identifier, loaded_names, name_tokens
from matlint.semantic.names import REFERENCE, TESTS

_PARAMETER_SOURCES = {"parameters", "named_parameters"}
# Name tokens of a list of parameters (`self.shadow_params`, `model_params`, `parameters`).
_PARAMETER_WORDS = {"param", "params", "parameters"}
_INPLACE_MATH = {"add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "lerp_", "clamp_", "sqrt_", "pow_",
                 "neg_", "exp_"}
# `p.data = ...` (also `(p.data) = ...`, or with a line continuation before the `=`): a file
# without it has no `.data` update for visit_Assign to find.
_ASSIGNS_DATA = re.compile(r"data[\s\\)]*=(?!=)")
# Calls whose work per parameter is matrix work, autograd or a model, not a few element-wise ops.
_MATRIX_CALLS = {"backward", "forward", "grad", "einsum", "matmul", "mm", "bmm", "svd", "eigh", "qr", "cholesky",
                 "pinv", "inverse"}
# Name tokens of a helper defined in another file that does matrix work per parameter: Muon's
# Newton-Schulz orthogonalization, Shampoo/SOAP preconditioners, decompositions.
_MATRIX_HELPER_TOKENS = {"muon", "newtonschulz", "schulz", "zeropower", "orthogonalize", "orthogonalise",
                         "orthogonalization", "orthogonalisation", "orthogonalized", "shampoo", "precondition",
                         "preconditioner", "svd", "eig", "eigh", "qr", "cholesky", "inverse", "matmul", "einsum"}


def _zipped_lists(it: ast.AST) -> bool:
    """`zip(self.shadow_params, parameters)`: two or more lists held by names or attributes."""
    return isinstance(it, ast.Call) and getattr(it.func, "id", None) == "zip" and len(it.args) >= 2 \
        and all(isinstance(arg, (ast.Name, ast.Attribute)) for arg in it.args)


class TinyOps(Rule):
    code = "MAT504"
    name = "tiny-ops"
    quiet_in = (TESTS, REFERENCE)
    summary = "Per-parameter updates issued one small kernel at a time (`foreach=False`, a hand-written loop over `model.parameters()`)."
    runtime_docs = """
    On a GPU, the guard reports a line that launches at least 32 small kernels per step (at most
    65536 elements each, or under 10 µs each when kernels are profiled) in one module's forward,
    counting those of a built-in layer the line calls (`self.proj(x)` in a decoder's step loop)
    but not the insides of a built-in model called once (`nn.TransformerEncoder`'s layers), and
    times them against one fused foreach launch. A loop over a tensor's items is MAT501's,
    and a rollout's launches (the loop runs through the host anyway) and compiled code are quiet.
    """
    docs = """
    ## What it does
    Flags two sources of many tiny kernels per training step:
    - a `torch.optim` optimizer built with `foreach=False`;
    - a hand-written update loop over a model's parameters (`for p in model.parameters():`,
      `for name, p in model.named_parameters():`, `for e, p in zip(ema.parameters(),
      model.parameters()):`, `for p in group["params"]:`) whose body updates them, or the state
      kept for each in a dict keyed by the loop variable, in place with arithmetic
      (`p.data.add_(...)`, `p.mul_(...)`, `p.detach().mul_(...)`, `e.lerp_(p, w)`, `p -= lr * p.grad`, `p.data = p.data -
      ...`, `self.shadow[name].mul_(d).add_(p, alpha=1 - d)`, `p.data = ema.update_average(p.data,
      new.data)` through a method of the file that returns arithmetic of its arguments); also
      a dict of named parameters blended entry by entry and loaded back (`state =
      dict(critic.named_parameters())`, `for name in state: state[name] = tau * state[name] +
      (1 - tau) * target[name]`, then `load_state_dict(state)`: a soft target update);
    - the same over a list of tensors (`for param in params:`) where the update reads the
      gradient of the tensor it updates (`param -= lr * param.grad / batch_size`): a parameter;
      or over zipped lists, one named as parameters, where the update of one item reads its
      partner (`for s, p in zip(self.shadow_params, parameters): s.sub_((s - p) * (1 - d))`, an
      EMA of the model's parameters: `torch._foreach_lerp_(shadow, params, 1 - d)`).

    ## Why is this bad?
    Each in-place op on one parameter is one kernel launch. A model with 200 parameter
    tensors and 3 ops per update launches 600 kernels of a few microseconds of work each; at
    ~13 µs per eager launch on an H100, the update is bound by launch overhead. The foreach
    kernels (`torch._foreach_mul_`, `torch._foreach_lerp_`) process every tensor in a few
    launches, `fused=True` optimizers in one, and `torch.compile` fuses a hand-written loop.

    ## Example
    ```python
    @torch.no_grad()
    def update_ema(ema, model, decay=0.999):
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(decay).add_(p, alpha=1 - decay)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    ```

    ## Use instead
    ```python
    @torch.no_grad()
    def update_ema(ema, model, decay=0.999):
        torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1 - decay)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    ```

    ## Stays quiet on
    - Loops over parameters that launch no arithmetic: `p.requires_grad_(False)`,
      `p.grad = None`, `p.copy_(...)`, `p.zero_()`, initializers (`p.normal_()`), reading
      norms into a list.
    - Loops in functions that run once (`__init__`, `init*`, `reset*`, `load*`, `build*`,
      `setup*`, `copy*`, `convert*`, `prune*`, `quantize*`, and any name with `checkpoint` or
      `ckpt`: `average_checkpoints` runs offline), and functions that already use
      `torch._foreach_*` (the loop is the fallback).
    - Loops that also run GEMMs, linear algebra, autograd or a loss per parameter (Shampoo or
      Kron preconditioners, per-parameter Hessians), written inline or in a helper they call: a
      function of the file or a method of the class that does so, followed three calls deep
      (Muon's `muon_update` → `zeropower_via_newtonschulz5` → `X @ X.mT`), or a function from
      another file whose name says it does (`muon_update`, `newtonschulz`, `orthogonalize`,
      `precondition`, `svd`): their cost is not launch overhead. A helper of element-wise ops
      (`adam_update`) is still reported.
    - Loops that are not known to run every step: only an optimizer's `step`, a training
      step (a function that calls `.backward()` and an optimizer's `.step()` once per call, and
      the helpers it calls: a soft target update `tp.data.copy_(tau * p.data + (1 - tau) *
      tp.data)` after each update), a function whose name says it updates (a whole word of it: `update`, `step`, `ema`, `average`,
      `swa`, `sgd`, an optimizer's name; not `remap` or `swap`), the `__call__` of a class so
      named (`class EMA`), or a loop nested in a training loop counts; a one-off gradient
      rescale after training does not.
    - Updates under a test that picks a parameter by its full, dotted name (`if 'fc1.weight' in
      name:`): one tensor (a max-norm constraint on one layer), not every parameter.
    - Loops over a list of tensors (`for s in scales:`) whose update does not read their `.grad`,
      zipped lists none of which is named as parameters (`for buf, g in zip(self.buffers,
      grads):`) or whose update does not read the partner item, and tallies in a dict keyed by
      the parameter (`self.counts[name] += 1`).
    - `foreach=False` next to `differentiable=True` (meta-learning through the update) or next
      to `fused=` (unless it is `fused=False`: the fused kernel already does every parameter), and
      tests.

    ## Fix safety
    `foreach=False` has an unsafe fix that removes it: PyTorch then picks the foreach
    implementation on CUDA, which computes the same update but holds more intermediate memory
    and may round in a different order. Update loops have no fix.
    """

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        self._reported_loops: set = set()

    # An optimizer built as `torch.optim.AdamW(...)` or by a bare name (`AdamW(...)`), or an in-place update.
    only = {"visit_Call": Only(attrs=frozenset(OPTIMIZERS | _INPLACE_MATH | {"copy_"})),
            "visit_Assign": Only(if_file=lambda ctx: _ASSIGNS_DATA.search(identifier_text(ctx)) is not None
                                 or _kinds.may_mention(ctx, "named_parameters"))}

    def visit_Call(self, node: ast.Call) -> None:
        qualname = self.ctx.qualname(node.func) or ""
        if qualname.startswith("torch.optim.") and qualname.rsplit(".", 1)[-1] in OPTIMIZERS:
            self._optimizer(node)
            return
        func = node.func
        if isinstance(func, ast.Attribute) and (func.attr in _INPLACE_MATH or (
                func.attr == "copy_" and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp))):
            self._update(node)  # `tp.data.copy_(tau * p.data + (1 - tau) * tp.data)`: arithmetic, then a copy

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            self._update(node, target=node.target)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = node.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Name):
            # `sd[name] = tau * sd[name].clone() + (1 - tau) * target_sd[name].clone()` over a dict of
            # named parameters, loaded back with `load_state_dict` after the loop
            if isinstance(node.value, ast.BinOp) and ast.unparse(target) in {
                    ast.unparse(n) for n in ast.walk(node.value) if isinstance(n, ast.Subscript)}:
                self._update(node, target=target)
            return
        if not (isinstance(target, ast.Attribute) and target.attr == "data"):
            return
        if isinstance(node.value, ast.BinOp) and ast.unparse(target) in {
                ast.unparse(n) for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}:
            self._update(node, target=target)
        elif self._arithmetic_helper(node.value):
            self._update(node, target=target)  # `ma.data = self.update_average(old, new)`

    def _arithmetic_helper(self, value: ast.AST) -> bool:
        """A call of a function of the file (or a method of the class) that returns element-wise
        arithmetic of its arguments (`return old * self.beta + (1 - self.beta) * new`)."""
        if not isinstance(value, ast.Call) or not value.args:
            return False
        helper = self._helper(value.func)
        if helper is None:
            return False
        returns = [n.value for n in ast.walk(helper) if isinstance(n, ast.Return) and n.value is not None]
        return any(isinstance(r, ast.BinOp) for r in returns) and not any(self._heavy(n) for n in ast.walk(helper))

    # -- checks -------------------------------------------------------------------------
    def _optimizer(self, node: ast.Call) -> None:
        foreach = next((k for k in node.keywords if k.arg == "foreach"), None)
        if foreach is None or not (isinstance(foreach.value, ast.Constant) and foreach.value.value is False):
            return
        if any(k.arg == "differentiable" for k in node.keywords):
            return  # differentiable optimizers (meta-learning) choose their implementation for autograd
        if any(k.arg == "fused" and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in node.keywords):
            return  # `fused=True` (or a fused flag set elsewhere) already runs one kernel for all parameters
        self.report(foreach, "`foreach=False` updates every parameter with its own small kernels; drop it (PyTorch "
                             "picks foreach on CUDA) or pass `fused=True`",
                    fix=self._drop_keyword(node, foreach))

    def _drop_keyword(self, call: ast.Call, keyword: ast.keyword):
        source = self.ctx.source
        start, end = self._offset(keyword.lineno, keyword.col_offset), self._offset(keyword.end_lineno, keyword.end_col_offset)
        line_start = source.rfind("\n", 0, start) + 1
        line_end = source.find("\n", end)
        line_end = len(source) if line_end < 0 else line_end
        before = source[:start].rstrip()
        if not source[line_start:start].strip() and source[end:line_end].strip() in ("", ","):
            start, end = line_start, min(line_end + 1, len(source))  # the keyword has its own line: drop the line
        elif before.endswith(","):
            start = len(before) - 1
        else:
            after = source[end:]
            stripped = after.lstrip()
            if not stripped.startswith(","):
                return None
            end += len(after) - len(stripped) + 1
            end += len(source[end:]) - len(source[end:].lstrip(" "))
        row, col = self._position(start)
        end_row, end_col = self._position(end)
        return Fix("Drop `foreach=False`", (Edit("", row, col, end_row, end_col),), False)

    def _offset(self, row: int, byte_col: int) -> int:
        lines = self.ctx.source.splitlines(keepends=True)
        prefix = sum(len(line) for line in lines[:row - 1])
        return prefix + len(lines[row - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def _position(self, offset: int):
        head = self.ctx.source[:offset]
        row = head.count("\n") + 1
        return row, offset - (head.rfind("\n") + 1) + 1

    def _update(self, node: ast.AST, target: Optional[ast.AST] = None) -> None:
        loop = self._parameter_loop()
        if loop is None or id(loop.node) in self._reported_loops:
            return
        updated = target if target is not None else node.func.value
        if not self._is_parameter(updated, loop):
            return
        if not (self._iterates_parameters(loop.iter) or self._reads_own_gradient(node, updated)
                or self._blends_parameter_lists(node, updated, loop)):
            return  # `for p in params:` is a parameter list only where the update reads `p.grad`
        if isinstance(node, ast.AugAssign) and isinstance(updated, ast.Subscript) and not (
                loaded_names(node.value) & loop.targets):
            return  # `counts[name] += 1`: a tally keyed by the parameter, not an update from it
        if self._picks_one_by_name(node, loop):
            return
        function = self.ctx.function
        if function is not None and (updates_once(getattr(function, "name", "")) or self._uses_foreach(function)):
            return
        if self._does_other_work(loop) or not updates_every_step(self.ctx, loop):
            return
        self._reported_loops.add(id(loop.node))
        self.report(node, f"this loop over parameters (line {loop.node.lineno}) launches small kernels for every "
                          "parameter on every update; use `torch._foreach_*` ops on the parameter lists, a "
                          "`fused=True` optimizer, or `torch.compile` the update")

    def _picks_one_by_name(self, node: ast.AST, loop: LoopInfo) -> bool:
        """The update sits under a test that picks a parameter by its full, dotted name (`if
        'fc1.weight' in name:`, `if name == "fc.bias":`): a max-norm constraint on one layer,
        one tensor updated, not every parameter."""
        parents = self.ctx.parents
        start = next((i for i, p in enumerate(parents) if p is loop.node), None)
        for parent in parents[start + 1:] if start is not None else ():
            test = parent.test if isinstance(parent, ast.If) else None
            if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                    and isinstance(test.ops[0], (ast.In, ast.Eq))):
                continue
            sides = (test.left, test.comparators[0])
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and "." in a.value
                   and isinstance(b, ast.Name) and b.id in loop.targets for a, b in (sides, sides[::-1])):
                return True
        return False

    def _parameter_loop(self) -> Optional[LoopInfo]:
        if not self.ctx.loops:
            return None
        loop = self.ctx.loops[-1]
        if loop.is_comprehension or loop.iter is None:
            return None
        it = loop.iter
        if self._iterates_parameters(it) or isinstance(it, (ast.Name, ast.Attribute, ast.List, ast.Tuple)):
            return loop
        if _zipped_lists(it):
            return loop
        return None

    @staticmethod
    def _reads_own_gradient(node: ast.AST, updated: ast.AST) -> bool:
        """`param -= lr * param.grad`, `p.data.add_(p.grad, alpha=-lr)`: the update reads the
        gradient of the tensor it updates, so that tensor is a parameter."""
        root = updated
        while isinstance(root, (ast.Attribute, ast.Call)):
            root = root.func.value if isinstance(root, ast.Call) else root.value
        if not isinstance(root, ast.Name):
            return False
        return any(isinstance(sub, ast.Attribute) and sub.attr == "grad" and isinstance(sub.value, ast.Name)
                   and sub.value.id == root.id for sub in ast.walk(node))

    @staticmethod
    def _blends_parameter_lists(node: ast.AST, updated: ast.AST, loop: LoopInfo) -> bool:
        """`for s, p in zip(self.shadow_params, parameters): s.sub_((s - p) * (1 - d))`: a list
        named as parameters, zipped with another, whose item is updated in place from its partner
        (an EMA of the model's parameters)."""
        it = loop.iter
        if not _zipped_lists(it) or not any(_PARAMETER_WORDS.intersection(t.lower() for t in name_tokens(identifier(arg)))
                                            for arg in it.args):
            return False
        root = updated
        while isinstance(root, (ast.Attribute, ast.Call)):
            root = root.func.value if isinstance(root, ast.Call) else root.value
        if not isinstance(root, ast.Name):
            return False
        partners = loop.targets - {root.id}
        return bool(partners and loaded_names(node) & loop.assigned_from(partners))

    def _iterates_parameters(self, it: ast.AST) -> bool:
        calls = [it]
        if isinstance(it, ast.Call) and getattr(it.func, "id", None) in ("zip", "enumerate", "list", "reversed"):
            calls = it.args
        for expr in calls:
            if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in (
                    "items", "values", "keys") and not expr.args and isinstance(expr.func.value, ast.Name)):
                expr = expr.func.value  # `OrderedDict(model.named_parameters()).items()`
            for _ in range(3):  # `for name in sd:` after `sd = dict(params)`, `params = model.named_parameters()`
                if not isinstance(expr, ast.Name):
                    break
                expr = self._held_parameters(expr)
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _PARAMETER_SOURCES:
                return True
            if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and expr.slice.value == "params":
                return True
        return False

    def _held_parameters(self, name: ast.Name) -> ast.AST:
        """What `name` is assigned, seen through a dict or list made of it (`OrderedDict(x.named_parameters())`)."""
        entries = _kinds.bindings(self.ctx, name.id) or []
        values = [e[1] for e in entries if e[0] == "value"]
        if len(values) != 1 or len(entries) != 1:
            return name
        value = values[0]
        if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in (
                "OrderedDict", "dict", "list") and len(value.args) == 1:
            return value.args[0]
        return value

    @staticmethod
    def _is_parameter(expr: ast.AST, loop: LoopInfo) -> bool:
        """`p`, `p.data`, `p.grad`, `p.data.mul_(d)`, `p.detach().mul_(d)` (a view of the same
        storage) for a loop variable `p`, or the state kept for it in a dict keyed by the loop
        variable (`self.shadow[name]`)."""
        node = expr
        while isinstance(node, (ast.Attribute, ast.Call)):
            if isinstance(node, ast.Call):
                if not (isinstance(node.func, ast.Attribute) and (
                        node.func.attr in _INPLACE_MATH or node.func.attr == "detach" and not node.args)):
                    return False
                node = node.func.value
            else:
                if node.attr not in ("data", "grad"):
                    return False
                node = node.value
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id in loop.targets \
                and isinstance(node.value, (ast.Name, ast.Attribute)):
            return True
        return isinstance(node, ast.Name) and node.id in loop.targets

    def _does_other_work(self, loop: LoopInfo) -> bool:
        """The loop also runs GEMMs, linear algebra, autograd or a loss per parameter, inline or
        in a helper (`update = muon_update(p.grad, buf)`, whose Newton-Schulz steps are GEMMs):
        its cost is not launch overhead (Muon, Shampoo/Kron preconditioners, per-parameter Hessians)."""
        return any(self._heavy(node) or self._calls_heavy_helper(node)
                   for stmt in loop.body for node in ast.walk(stmt))

    def _heavy(self, node: ast.AST) -> bool:
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = identifier(node.func) or ""
            qualname = self.ctx.qualname(node.func) or ""
            return name in _MATRIX_CALLS or "loss" in name.lower() or qualname.startswith("torch.linalg.")
        return False

    def _calls_heavy_helper(self, node: ast.AST, depth: int = 0) -> bool:
        """A call of a function of this file (or a method of the class) that does matrix work,
        followed three calls deep; or of a function defined elsewhere whose name says it does
        (`zeropower_via_newtonschulz5`, `muon_update`, `orthogonalize`, `precondition`)."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        helper = self._helper(func)
        if helper is None and not isinstance(func, (ast.Name, ast.Attribute)):
            return False
        if helper is None:
            if (self.ctx.qualname(func) or "").startswith("torch."):
                return False
            return any(token in _MATRIX_HELPER_TOKENS for token in name_tokens(identifier(func)))
        if depth >= 3:
            return False
        key = ("mat504_heavy_helper", id(helper), depth)
        if key not in self.ctx.shared:
            self.ctx.shared[key] = False  # a recursive helper reaches itself: not (yet) known to be heavy
            self.ctx.shared[key] = any(self._heavy(sub) or self._calls_heavy_helper(sub, depth + 1)
                                       for stmt in helper.body for sub in ast.walk(stmt))
        return self.ctx.shared[key]

    def _helper(self, func: ast.AST) -> Optional[ast.AST]:
        """The function of this file (`f`) or method of the class (`self.f`) that `func` calls."""
        if isinstance(func, ast.Name):
            return self._functions().get(func.id)
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
                and self.ctx.class_ is not None):
            return next((s for s in self.ctx.class_.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and s.name == func.attr), None)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            # `ema_updater.update_average(old, new)`: the method of that name, where one class of the file has it
            methods = [table[func.attr] for table in file_calls(self.ctx).methods.values() if func.attr in table]
            return methods[0] if len(methods) == 1 else None
        return None

    def _functions(self) -> dict:
        """The module-level functions of the file, by name."""
        key = "mat504_functions"
        if key not in self.ctx.shared:
            self.ctx.shared[key] = {s.name: s for s in self.ctx.tree.body
                                    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        return self.ctx.shared[key]

    def _uses_foreach(self, function: ast.AST) -> bool:
        key = ("mat504_foreach", id(function))
        if key not in self.ctx.shared:
            self.ctx.shared[key] = "_foreach_" in self.ctx.segment(function)
        return self.ctx.shared[key]
