"""MAT604 manual-rms-norm: `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` instead of
`F.rms_norm`."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of, function_may_mention
from matlint.semantic.tree import code_scope
from matlint.semantic.names import REFERENCE, TESTS, mentions, outermost_scope, subclasses
from matlint.semantic.pointwise import (KERNEL_SWITCH, PRODUCT_METHODS, difference, in_compiled_code, last_dim_reduction, may_take_root,
                         number, product, resolve, returned_affine, root_of, same, strip_casts, torch_op)

# A class or function that names one of these already has (or switches to) a fused RMS norm;
# the hand-written code is its fallback.
# torchrl's `@implement_for("torch", None, "2.4")` marks a fallback for releases without
# F.rms_norm; ONNX export patches decompose on purpose.
_FUSED_PATH = re.compile(KERNEL_SWITCH + r"|fused|apex|triton|liger|rms_norm|flash|implement_for|onnx|nn\.RMSNorm",
                         re.IGNORECASE)


class ManualRmsNorm(Rule):
    code = "MAT604"
    name = "manual-rms-norm"
    quiet_in = (TESTS, REFERENCE)
    summary = "RMS norm written out (`x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`); `F.rms_norm` is one call."
    docs = """
    ## What it does
    Flags the normalization step of a hand-written RMS norm over the last dim: `x` multiplied
    by the inverse root of the mean of its squares (`torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`,
    `(... + eps) ** -0.5`, `1 / torch.sqrt(...)`) or divided by the root
    (`x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)`). The squares may be spelled
    `x ** 2`, `x.pow(2)`, `torch.pow(x, 2)`, `x.square()` or `x * x`, with dtype casts around
    `x`, the weight multiplied first or last (`self.weight * x * torch.rsqrt(...)`) and the steps
    in separate statements (the `LlamaRMSNorm` shape: upcast to float32,
    normalize, cast back, multiply by the weight). Those classes are reported on purpose
    unless a kernel-hub decorator replaces them: they are the pattern, and `F.rms_norm`
    computes half-precision statistics in float32 as they do (see Fix safety for the last bit).
    A param-free norm that the function returns as it is (through a cast back), outside a class
    that holds a parameter, is told to use `F.rms_norm(x, (x.shape[-1],), eps=eps)`, without a
    weight.

    ## Why is this bad?
    Square, mean, add, rsqrt and multiply are separate kernels, each reading and writing the
    whole activation, with intermediates kept for backward; and the norm runs in every layer,
    twice. `F.rms_norm` (torch ≥ 2.4, or `nn.RMSNorm`) is a single call that recent PyTorch
    runs as one fused kernel, and torch.compile fuses either way. For half-precision inputs
    `F.rms_norm` computes its statistics in float32 itself, as the hand-written upcast does.

    ## Example
    ```python
    input_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + self.eps)
    return self.weight * x.to(input_dtype)
    ```

    ## Use instead
    ```python
    return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
    ```

    ## Stays quiet on
    - Classes and functions that already have a fused path: a kernel-hub decorator
      (transformers' `@use_kernel_forward_from_hub("RMSNorm")`), or an identifier or string
      naming a fused, apex, triton, liger or `rms_norm` implementation next to the manual code
      (whole identifiers or their parts: `_rms_normalize` names none; docstrings do not count).
    - Torch-version and export fallbacks: torchrl's `@implement_for("torch", None, "2.4")`
      implementations (for releases without `F.rms_norm`) and ONNX export patches.
    - Gated RMS norms (a `gate` parameter, as in Mamba-2, Bamba, Zamba-2, Falcon-H1): the
      models run mamba-ssm's fused gated-norm kernel when it is installed, and the written-out
      norm is the fallback; `F.rms_norm` does not cover the gate either.
    - Subclasses of `nn.RMSNorm` that override `forward`: the fused op was replaced on purpose.
    - Code compiled by torch.compile: a function (or class) under a decorator whose name says
      compile (`@torch.compile`), or a module-level function handed to one
      (`fast = torch.compile(f)`): its steps are fused already. TorchScript (`@torch.jit.script`)
      is reported: its default fuser leaves the mean a separate kernel.
    - Norms over any dim but the last, centered inputs (that is a layer norm: MAT603), an L2
      normalization without the mean (`x / x.norm(dim=-1, keepdim=True)`), and numpy.

    ## Fix safety
    No automatic fix. `F.rms_norm` upcasts internally, but where the weight is applied
    relative to the downcast differs between implementations (Llama casts back before the
    weight, Gemma multiplies by `1 + weight` in float32), so results can change in the last
    bit of bfloat16; the normalized shape and weight also need spelling out.
    """

    only = {"visit_Call": Only(attrs=PRODUCT_METHODS)}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, (ast.Div, ast.Mult)):
            self._check(node, node.op.__class__, node.left, node.right)

    def visit_Call(self, node: ast.Call) -> None:
        found = product(self.ctx, node)  # `x.mul(torch.rsqrt(v + eps))`, `torch.div(x, rms)`
        if found is not None:
            self._check(node, *found)

    def _check(self, node: ast.AST, op, left: ast.AST, right: ast.AST) -> None:
        function = code_scope(self.ctx)
        if function is None:
            return
        if not (may_take_root(self.ctx, function, ("sqrt", "rsqrt"))
                and function_may_mention(self.ctx, function, ("mean",))):
            return  # no root or no mean of squares in this function, so no RMS norm
        inverse = op is ast.Mult
        pairs = [(left, right)] if not inverse else [(left, right), (right, left)]
        for x, scale in pairs:
            if not isinstance(scale, ast.Name) and root_of(self.ctx, scale, inverse) is None:
                continue  # no root, and no name that could hold one: no data flow needed
            target = self._is_rms_of(flow_of(self.ctx, function), scale, x, inverse)
            if target is not None:
                if (mentions(self.ctx, outermost_scope(self.ctx), _FUSED_PATH) or self._is_gated(function)
                        or subclasses(self.ctx, self.ctx.class_, "torch.nn.RMSNorm")
                        or in_compiled_code(self.ctx, reductions=True)):
                    return
                # Returned as it is, with no factor besides x: a norm without weight.
                weightless = target is x and returned_affine(self.ctx, node) == "none"
                call = "F.rms_norm(x, (x.shape[-1],), eps=eps)" if weightless else "F.rms_norm(x, (x.shape[-1],), weight, eps)"
                self.report(node, f"hand-written RMS norm over the last dim: use `{call}` (torch >= 2.4, or "
                                  "`nn.RMSNorm`), one call that runs as a fused kernel instead of one kernel per step")
                return

    @staticmethod
    def _is_gated(function: ast.AST) -> bool:
        """A gated RMS norm (`forward(self, hidden_states, gate=None)`, Mamba-2's norm): the model
        runs mamba-ssm's fused gated-norm kernel when it is installed, and this is the fallback."""
        args = getattr(function, "args", None)  # none for the module
        return args is not None and any("gate" in a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)

    def _is_rms_of(self, flow, scale: ast.AST, x: ast.AST, inverse: bool) -> Optional[ast.AST]:
        """The factor of `x` (`x` itself, or `x` in `w * x`) that `scale` is the RMS of, else None."""
        root = root_of(self.ctx, resolve(flow, scale), inverse)
        if root is None:
            return None
        squares_of = last_dim_reduction(self.ctx, flow, root[0], ("mean",))
        if squares_of is None:
            return None
        square = torch_op(self.ctx, strip_casts(self.ctx, resolve(flow, squares_of)))
        if square is None or square.name != "pow" or number(square.args[1]) != 2:
            return None
        base = strip_casts(self.ctx, square.args[0])
        for factor in self._factors(x, 3):
            target = strip_casts(self.ctx, factor)
            if same(base, target) or same(resolve(flow, base), resolve(flow, target)):
                centered = difference(self.ctx, resolve(flow, target))  # `x - x.mean(...)`: a layer norm
                plain = centered is None or last_dim_reduction(self.ctx, flow, centered[1], ("mean",)) is None
                return factor if plain else None
        return None

    def _factors(self, node: ast.AST, depth: int):
        """`node`, and when it is a product the factors inside it: the weight may come first
        (`w * x * rsqrt(...)` multiplies `w * x` by the root)."""
        yield node
        found = product(self.ctx, node) if depth else None
        if found is not None and found[0] is ast.Mult and not same(found[1], found[2]):  # `x * x` is a square
            yield from self._factors(found[1], depth - 1)
            yield from self._factors(found[2], depth - 1)
