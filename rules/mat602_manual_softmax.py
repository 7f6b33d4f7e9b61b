"""MAT602 manual-softmax: `exp(x) / exp(x).sum(dim, keepdim=True)` instead of `softmax`."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule, bad, good

from ._flow import code_scope, flow_of, function_may_mention
from ._pointwise import PRODUCT_METHODS, is_eps, is_true, number, product, resolve, same, torch_op

_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)


class ManualSoftmax(Rule):
    code = "MAT602"
    name = "manual-softmax"
    summary = "Softmax written out as `exp(x) / exp(x).sum(dim, keepdim=True)`; `x.softmax(dim)` is one stable kernel."
    docs = """
    ## What it does
    Flags a division whose numerator is `torch.exp(x)` (or `x.exp()`, or a name holding it)
    and whose denominator is the sum of the same exponentials over one dim with
    `keepdim=True` (`torch.exp(x).sum(-1, keepdim=True)`, `torch.sum(e, dim=1, keepdim=True)`),
    also in the max-subtracted form `exp(x - x.max(dim, keepdim=True).values)` and with a
    small `+ eps` in the denominator.

    ## Why is this bad?
    It launches an exp, a reduction and a division, materializing the exponentials, where
    `softmax` is one kernel (and one saved tensor for backward). Without the max subtraction it
    is also numerically unstable: in float32 `exp(x)` overflows to `inf` for `x > 88` (in
    float16 for `x > 11`), and `inf / inf` is `nan`.

    ## Example
    ```python
    probs = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)
    ```

    ## Use instead
    ```python
    probs = logits.softmax(dim=-1)   # or F.softmax(logits, dim=-1)
    ```

    ## Stays quiet on
    - Normalized kernels whose exponent is written negated (`exp(-x.pow(2) / (2 * sigma ** 2))`
      divided by its sum): a Gaussian or RBF weighting, which reads as what it is and cannot
      overflow.
    - numpy and math (`np.exp(x) / np.exp(x).sum()`): not tensors.
    - Masked or weighted forms (`exp(x) * mask / (exp(x) * mask).sum(...)`), sums without
      `keepdim=True` or over all elements, and denominators that are not the sum of the
      numerator's exponentials (`exp(x) / (1 + exp(x))` is a sigmoid); sums over several dims
      (`dim=(-2, -1)`), which no one softmax call takes.
    - Exponentials changed between the `exp` and the division (masked in place with
      `masked_fill_` or `e[~mask] = 0`, rebound, or renormalized in a loop as in Sinkhorn).

    ## Fix safety
    The fix (`x.softmax(dim=D)`) is offered only when the exponentials are written inline, and
    it is **unsafe**: where the hand-written form overflowed to `nan`, softmax returns the
    right probabilities, and for an integer `x` softmax raises where `exp` promoted to float.
    There is no fix for the `+ eps` form (the result changes by the eps).
    """
    examples = [
        bad("""
            import torch
            def probs(logits):
                return torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)
            """, (3, 12), fixed="""
            import torch
            def probs(logits):
                return logits.softmax(dim=-1)
            """, unsafe=True, message_contains="overflows"),
        bad("""
            import torch
            def probs(x, w):
                return (x @ w).exp() / torch.sum((x @ w).exp(), 1, keepdim=True)
            """, (3, 12), fixed="""
            import torch
            def probs(x, w):
                return (x @ w).softmax(dim=1)
            """, unsafe=True),
        bad("""
            import torch
            def probs(scores):
                e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
                return e / e.sum(-1, keepdim=True)
            """, (4, 12), message_contains="scores.softmax(dim=-1)"),
        bad("""
            import torch
            def probs(scores, eps=1e-8):
                e = scores.exp()
                p = e / (e.sum(dim=2, keepdim=True) + eps)
                return p
            """, (4, 9)),
        bad("""
            import torch
            def softmax(X):
                X_exp = torch.exp(X)
                partition = X_exp.sum(1, keepdims=True)
                return X_exp / partition
            """, (5, 12)),
        bad("""
            import torch
            def probs(logits):
                e = logits.exp()
                return e.div(e.sum(-1, keepdim=True)), torch.div(e, e.sum(-1, keepdim=True))
            """, (4, 12), (4, 44)),
        good("""
            import torch
            def probs(logits):
                e = logits.exp()
                return e.div(e.sum(-1, keepdim=True), rounding_mode="floor"), e.mul(e.sum(-1, keepdim=True))
            """),
        good("""
            import torch
            def gaussian(x, sigma):
                gauss = torch.exp(-x.pow(2.0) / (2 * sigma.pow(2.0)))
                return gauss / gauss.sum(-1, keepdim=True)
            """),
        good("""
            import numpy as np
            import torch
            def f(x, mask):
                a = np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)
                b = torch.exp(x) * mask / (torch.exp(x) * mask).sum(-1, keepdim=True)
                c = torch.exp(x) / (1 + torch.exp(x))
                d = torch.exp(x) / torch.exp(x).sum()
                e = torch.exp(x) / torch.exp(mask).sum(-1, keepdim=True)
                return a, b, c, d, e
            """),
        bad("""
            import torch
            x = torch.randn(4, 8)
            e = torch.exp(x)
            probs = e / e.sum(-1, keepdim=True)
            class Table:
                w = torch.exp(x)
                p = w / w.sum(-1, keepdim=True)
            """, (4, 9)),
        good("""
            import torch
            def sinkhorn(scores, iters: int):
                P = torch.exp(scores)
                for _ in range(iters):
                    P = P / P.sum(dim=-1, keepdim=True)
                    P = P / P.sum(dim=-2, keepdim=True)
                return P
            def reassigned(x, y):
                e = torch.exp(x)
                s = e.sum(-1, keepdim=True)
                e = torch.exp(y)
                return e / s
            def masked_in_place(x, mask):
                e = torch.exp(x)
                e.masked_fill_(~mask, 0.0)
                return e / (e.sum(-1, keepdim=True) + 1e-6)
            def over_two_dims(x):
                a = torch.exp(x) / torch.exp(x).sum(dim=(-2, -1), keepdim=True)
                return a + torch.exp(x) / torch.sum(torch.exp(x), [2, 3], keepdim=True)
            def masked_by_index(x, mask):
                e = torch.exp(x)
                e[~mask] = 0
                return e / e.sum(-1, keepdim=True)
            """),
        bad("""
            import torch
            def per_item(xs):
                outs = []
                for x in xs:
                    e = torch.exp(x)
                    outs.append(e / e.sum(-1, keepdim=True))
                return outs
            """, (6, 21)),
    ]

    only = {"visit_Call": Only(attrs=PRODUCT_METHODS)}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Div):
            self._check(node, node.op.__class__, node.left, node.right)

    def visit_Call(self, node: ast.Call) -> None:
        found = product(self.ctx, node)  # `e.div(e.sum(-1, keepdim=True))`, `torch.div(e, s)`
        if found is not None:
            self._check(node, *found)

    def _check(self, node: ast.AST, op, left: ast.AST, right: ast.AST) -> None:
        function = code_scope(self.ctx)
        if op is not ast.Div or function is None:
            return
        if not function_may_mention(self.ctx, function, ("exp",)):
            return
        denominator, eps = right, None
        if isinstance(denominator, ast.BinOp) and isinstance(denominator.op, ast.Add):
            denominator, eps = denominator.left, denominator.right
        if not (self._may_be(left, "exp") and self._may_be(denominator, "sum")):
            return  # read off the syntax, before any data flow is built
        flow = flow_of(self.ctx, function)
        numerator = self._exp_argument(flow, left)
        if numerator is None:
            return
        total = torch_op(self.ctx, resolve(flow, denominator, depth=1))
        if total is None or total.name != "sum":
            return
        if not is_true(total.keywords.get("keepdim", total.keywords.get("keepdims", total.arg(2, "")))):
            return
        dim = total.arg(1, "dim")
        summed = total.args[0]
        if isinstance(dim, (ast.Tuple, ast.List, ast.Set)):
            return  # a sum over several dims: no one softmax call does that
        if dim is None or not (same(summed, left) or same(self._exp_argument(flow, summed), numerator)):
            return
        if eps is not None and not is_eps(eps):
            return
        logits, stable = self._unshifted(numerator, dim)
        suggestion = f"{self._atom(logits)}.softmax(dim={self.ctx.segment(dim)})"
        message = f"hand-written softmax: use `{suggestion}`, one fused kernel"
        if not stable:
            message += "; exp() also overflows to inf for large inputs (x > 88 in float32), making inf/inf = nan"
        fix = None
        if eps is None and not any(isinstance(n, ast.Name) for n in (left, right, total.args[0])):
            fix = self.replace(node, suggestion, "replace with softmax", safe=False)
        self.report(node, message, fix=fix)

    def _may_be(self, node: ast.AST, name: str) -> bool:
        """Whether `node` is, or is a name that may hold, a call of the torch op `name`."""
        if isinstance(node, ast.Name):
            return True
        op = torch_op(self.ctx, node)
        return op is not None and op.name == name

    def _exp_argument(self, flow, node: ast.AST) -> Optional[ast.AST]:
        op = torch_op(self.ctx, resolve(flow, node, depth=1))
        if op is None or op.name != "exp" or len(op.args) != 1 or op.keywords:
            return None
        exponent = op.args[0]
        if isinstance(exponent, ast.BinOp) and isinstance(exponent.op, (ast.Mult, ast.Div)):
            exponent = exponent.left
        if isinstance(exponent, ast.UnaryOp) and isinstance(exponent.op, ast.USub):
            return None  # exp(-d ** 2 / (2 * sigma ** 2)): a Gaussian / RBF kernel being normalized
        return op.args[0]

    def _unshifted(self, logits: ast.AST, dim: ast.AST):
        """(x, True) for `x - x.max(dim, keepdim=True)[0]` / `.values` / `x.amax(dim, keepdim=True)`."""
        if isinstance(logits, ast.BinOp) and isinstance(logits.op, ast.Sub):
            shift = logits.right
            if isinstance(shift, ast.Subscript) and number(shift.slice) == 0:
                shift = shift.value
            elif isinstance(shift, ast.Attribute) and shift.attr == "values":
                shift = shift.value
            op = torch_op(self.ctx, shift)
            if (op is not None and op.name in ("max", "amax") and same(op.args[0], logits.left)
                    and same(op.arg(1, "dim"), dim)):
                return logits.left, True
        return logits, False

    def _atom(self, node: ast.AST) -> str:
        text = self.ctx.segment(node)
        return text if isinstance(node, _ATOMS) else f"({text})"
