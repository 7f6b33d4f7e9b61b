"""MAT603 manual-layer-norm: `(x - x.mean(-1, keepdim=True)) / sqrt(var + eps)` instead of
`F.layer_norm`."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of, function_may_mention
from matlint.semantic.tree import code_scope
from matlint.semantic.loops import scope_statements
from matlint.semantic.names import REFERENCE, TESTS, mentions, outermost_scope, subclasses
from matlint.semantic.pointwise import (KERNEL_SWITCH, PRODUCT_METHODS, difference, feeds_only, in_compiled_code, is_eps,
                         last_dim_reduction, may_take_root, number, product, resolve, returned_affine, root_of, same,
                         strip_casts, torch_op)


# A class or function that names one of these has a fused layer norm next to the manual one.
_FUSED_PATH = re.compile(KERNEL_SWITCH + r"|fused|apex|triton|liger|^layer_norm$", re.IGNORECASE)


_ROOT_METHODS = frozenset({"sqrt", "rsqrt", "pow"})


def _may_be_spread(value: ast.AST) -> bool:
    """Whether an assigned value can be a root (`torch.sqrt(...)`, `(...).rsqrt()`, `** -0.5`,
    `1 / sqrt(...)`, a bare-name alias) or a std plus eps, by its outer syntax alone."""
    cls = value.__class__
    if cls is ast.BinOp:
        return value.op.__class__ in (ast.Pow, ast.Div, ast.Add)
    return cls is ast.Call and (value.func.__class__ is not ast.Attribute or value.func.attr in _ROOT_METHODS)


class ManualLayerNorm(Rule):
    code = "MAT603"
    name = "manual-layer-norm"
    quiet_in = (TESTS, REFERENCE)
    summary = "Layer norm written out (`(x - mean) / sqrt(var + eps)`); `F.layer_norm` is one fused kernel."
    docs = """
    ## What it does
    Flags the normalization step of a hand-written layer norm over the last dim: `x` minus its
    mean (`x - x.mean(-1, keepdim=True)`, `x.sub(torch.mean(x, dim=-1, keepdim=True))`), divided by the
    square root of its variance plus eps (`torch.sqrt(var + eps)`, `(var + eps).sqrt()`,
    `** 0.5`) or multiplied by its inverse root (`torch.rsqrt(var + eps)`, `** -0.5`). The
    variance may be `x.var(-1, keepdim=True, unbiased=False)` or the mean of the squared
    centered values (`.pow(2)`, `** 2`, `.square()`, `xc * xc`), and the steps may sit in
    separate statements (`std = (var + eps).sqrt()`, then `(x - mean) / std`;
    `rstd = torch.rsqrt(var + eps)`, then `xc * rstd * w + b`). The "annotated transformer" form `(x - mean) / (x.std(-1, keepdim=True) + eps)`
    is reported too, with a note that it differs slightly from a layer norm. The call it
    suggests takes what the code applies where it returns the norm: nothing for a param-free
    norm returned as it is, outside a class that holds a parameter (`F.layer_norm(x,
    (x.shape[-1],), eps=eps)`), a weight where it is returned times one factor; otherwise a
    weight and a bias.

    ## Why is this bad?
    Each step is a separate kernel (mean, subtract, square, mean, add, sqrt, divide, then
    the affine multiply and add), each reading and writing the whole activation, and autograd
    keeps the intermediates. `F.layer_norm` (or `nn.LayerNorm`) does it in one fused kernel
    forward and one backward.

    ## Example
    ```python
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + self.eps)
    x = self.weight * x + self.bias
    ```

    ## Use instead
    ```python
    x = F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
    ```

    ## Stays quiet on
    - Normalization over any dim but the last (channels-first `LayerNorm2d` over dim 1,
      group/instance norms over several dims): `F.layer_norm` normalizes trailing dims only, and
      the permutes around it cost copies.
    - Centering without a division by the spread, standardization by statistics that were
      computed elsewhere (running stats, a batch-norm's buffers), and numpy.
    - Classes and functions that also have a fused path (a kernel-hub decorator, apex,
      triton, or an `F.layer_norm` switch next to the manual code): the manual code is the fallback.
      Only code counts, as whole identifiers or their parts (`FusedLayerNorm`, `use_fused`): a
      docstring that mentions a fused kernel, or a conv's `kernel_size`, is no fused path.
    - Subclasses of `nn.LayerNorm` that override `forward` with the written-out computation:
      the fused kernel was replaced on purpose (transformers' flow-head layer norms work around
      wrong forward-mode JVP gradients of the fused op).
    - Statistics wanted on their own: a name holding the mean or the spread that is also read
      outside the normalization (`return x, mu, std` to de-normalise later,
      `ctx.save_for_backward(xc, rstd)`); `F.layer_norm` returns neither. Checks
      (`assert torch.isfinite(var).all()`, `torch._assert`) and metadata reads (`var.shape`,
      `mean.dtype`) are no such use: the norm is reported.
    - Code compiled by torch.compile: a function (or class) under a decorator whose name says
      compile (`@torch.compile`), or a module-level function handed to one
      (`fast = torch.compile(f)`): its steps are fused already. TorchScript (`@torch.jit.script`)
      is reported: its default fuser leaves the reductions separate kernels.
    - Unbiased variance (`x.var(-1, keepdim=True)`): that is not what a layer norm computes.
    - A std plus something that is not an eps (`std + 1.0`, `std + floor`): no layer norm.

    ## Fix safety
    No automatic fix: the affine part usually lives in another statement, `F.layer_norm`
    needs the normalized shape, weight and bias spelled out, and in half precision it computes
    its statistics in float32 where the hand-written code may not, so results change in the
    last bits.
    """

    only = {"visit_Call": Only(attrs=PRODUCT_METHODS)}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, (ast.Div, ast.Mult)):
            self._check(node, node.op.__class__, node.left, node.right)

    def visit_Call(self, node: ast.Call) -> None:
        found = product(self.ctx, node)  # `centered.div(std)`, `torch.mul(centered, torch.rsqrt(var + eps))`
        if found is not None:
            self._check(node, *found)

    def _check(self, node: ast.AST, op, left: ast.AST, right: ast.AST) -> None:
        function = code_scope(self.ctx)
        if function is None:
            return
        if not (may_take_root(self.ctx, function, ("sqrt", "rsqrt", "std"))
                and function_may_mention(self.ctx, function, ("mean",))):
            return  # no root or no mean in this function, so no layer norm
        inverse = op is ast.Mult
        pairs = [(left, right)] if op is ast.Div else [(left, right), (right, left)]
        for centered, spread in pairs:
            form = self._spread_form(spread, inverse)
            if form is None and not (spread.__class__ is ast.Name and self._may_hold_root(function, spread.id)):
                continue  # read off the syntax: most products stop here, before any data flow is built
            flow = flow_of(self.ctx, function)
            if form is None:  # a name that may hold the root: `std = (var + eps).sqrt()`, `rstd = torch.rsqrt(...)`
                form = self._spread_form(resolve(flow, spread), inverse)
                if form is None:
                    continue
            found = self._centered(flow, centered)
            if found is None:
                continue
            x, mean = found
            note = self._spread(flow, form, centered, x)
            if note is None:
                continue
            if (mentions(self.ctx, outermost_scope(self.ctx), _FUSED_PATH)
                    or subclasses(self.ctx, self.ctx.class_, "torch.nn.LayerNorm")
                    or self._statistics_wanted(flow, node, (mean, spread, form[1]))
                    or in_compiled_code(self.ctx, reductions=True)):
                return
            # The weight and bias the code applies, where it returns the norm as it is or times one factor.
            affine = returned_affine(self.ctx, node) if difference(self.ctx, resolve(flow, centered)) else None
            args = {"none": "eps=eps", "scale": "weight, eps=eps"}.get(affine, "weight, bias, eps")
            self.report(node, f"hand-written layer norm over the last dim: use `F.layer_norm(x, (x.shape[-1],), {args})` "
                              "(or `nn.LayerNorm`), one fused kernel forward and backward instead of one kernel "
                              f"per step{note}")
            return

    def _may_hold_root(self, function: ast.AST, name: str) -> bool:
        """Whether `function` assigns `name` a root or a std plus eps (`std = (var + eps).sqrt()`,
        `rstd = torch.rsqrt(var + eps)`): read off its statements before any data flow is built."""
        key = ("roots_assigned", id(function))
        roots = self.ctx.shared.get(key)
        if roots is None:
            roots = self.ctx.shared[key] = {}
            for stmt in scope_statements(function.body):
                if stmt.__class__ is ast.Assign and len(stmt.targets) == 1 and stmt.targets[0].__class__ is ast.Name:
                    roots.setdefault(stmt.targets[0].id, []).append(stmt.value)
        values = roots.get(name)
        if values.__class__ is list:  # decided on first ask: the same name is asked about again and again
            values = roots[name] = any(self._spread_form(v, True) or self._spread_form(v, False)
                                       for v in values if _may_be_spread(v))
        return bool(values)

    def _statistics_wanted(self, flow, node: ast.AST, statistics) -> bool:
        """Whether a name holding the mean or the spread is read outside the normalization
        (`return x, mu, std` to de-normalise later, `ctx.save_for_backward(x, mean, rstd)`):
        F.layer_norm returns neither. Checks (`assert torch.isfinite(var).all()`) and metadata
        reads (`var.shape`) are no such use."""
        for name in statistics:
            if name.__class__ is ast.Name:
                assign = flow.reaching(name)
                if assign is not None and not feeds_only(self.ctx, flow, assign, node):
                    return True
        return False

    def _centered(self, flow, node: ast.AST, depth: int = 4) -> Optional[tuple]:
        """(x, the mean) for `x - x.mean(-1, keepdim=True)` or `x.sub(...)` (or a name holding it).
        `depth` bounds the products looked into: in a loop, `h = h * s` reaches its own read of `h`."""
        value = resolve(flow, node)
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):  # weight * (x - mean) / std
            if not depth:
                return None
            return self._centered(flow, value.left, depth - 1) or self._centered(flow, value.right, depth - 1)
        found = difference(self.ctx, value)
        if found is None:
            return None
        x, mean = found
        mean_of = last_dim_reduction(self.ctx, flow, mean, ("mean",))
        return (x, mean) if mean_of is not None and self._same_tensor(flow, mean_of, x) else None

    def _spread_form(self, node: ast.AST, inverse: bool) -> Optional[tuple]:
        """("std", s) for `s + eps`, ("root", v) for the (inverse) root of `v + eps`, read off the
        node itself (the caller resolves a name); None for anything else."""
        if not inverse and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ("std", node.left) if is_eps(node.right) else None  # `std + 1.0` is no layer norm
        root = root_of(self.ctx, node, inverse)
        return ("root", root[0]) if root is not None and root[1] is not None else None

    def _spread(self, flow, form: tuple, centered: ast.AST, x: ast.AST) -> Optional[str]:
        """"" when `form` is the (inverse) root of x's biased variance plus eps, a note for
        the `std + eps` form, None otherwise."""
        kind, base = form
        if kind == "std":
            std_of = last_dim_reduction(self.ctx, flow, base, ("std",))
            if std_of is None or not self._same_tensor(flow, std_of, x):
                return None
            if self._biased(torch_op(self.ctx, strip_casts(self.ctx, resolve(flow, base)))):
                return (" (this form divides by the std plus eps; F.layer_norm puts eps inside the root, "
                        "so results differ slightly)")
            return (" (this form divides by the unbiased std plus eps; F.layer_norm uses the biased "
                    "variance with eps inside the root: results differ by a factor √((n−1)/n) for rows "
                    "of n, which matters for short rows)")
        variance = base
        var_of = last_dim_reduction(self.ctx, flow, variance, ("var",))
        if var_of is not None:
            op = torch_op(self.ctx, strip_casts(self.ctx, resolve(flow, variance)))
            return "" if self._biased(op) and self._same_tensor(flow, var_of, x) else None
        squares_of = last_dim_reduction(self.ctx, flow, variance, ("mean",))
        if squares_of is None:
            return None
        square = torch_op(self.ctx, resolve(flow, squares_of))
        if square is None or square.name != "pow" or number(square.args[1]) != 2:
            return None
        inner = square.args[0]
        if same(inner, centered) or same(resolve(flow, inner), resolve(flow, centered)):
            return ""
        return None

    @staticmethod
    def _biased(op) -> bool:
        """`x.var(..., unbiased=False)` / `correction=0`: the variance a layer norm computes."""
        biased = op.keywords.get("unbiased")
        return isinstance(biased, ast.Constant) and biased.value is False or number(op.keywords.get("correction")) == 0

    def _same_tensor(self, flow, a: ast.AST, b: ast.AST) -> bool:
        return same(strip_casts(self.ctx, a), strip_casts(self.ctx, b)) or same(
            resolve(flow, strip_casts(self.ctx, a)), resolve(flow, strip_casts(self.ctx, b)))
