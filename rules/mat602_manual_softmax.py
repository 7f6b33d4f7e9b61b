"""MAT602 manual-softmax: `exp(x) / exp(x).sum(dim, keepdim=True)` instead of `softmax`."""
from __future__ import annotations

import ast
import re
from typing import Optional

from matlint.rule import Only, Rule

from matlint.semantic.flow import flow_of, function_may_mention
from matlint.semantic.tree import code_scope
from matlint.semantic.names import REFERENCE, TESTS
from matlint.semantic.pointwise import (PRODUCT_METHODS, difference, feeds_only, in_compiled_code, is_eps, is_true, number, product,
                         resolve, same, torch_op)

_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
# How far above the hand-written steps a comment about softmax still explains them.
_COMMENT_LINES_ABOVE = 5
# Words of a comment that gives a reason for writing softmax out (`the dim-1 softmax kernel is
# several times slower here`), not merely a label for the steps (`# softmax over the keys`) or
# for the max subtraction (`# subtract the max to avoid overflow`).
_REASON = re.compile(r"\b(?:slow|fast|speed|perf|avoid|instead|workaround|work around|because|deliberate|"
                     r"on purpose|intentional|bug|bypass|onnx|export|tensorrt|unsupported|not supported)"
                     r"(?![^.;]{0,40}(?:overflow|underflow|\bnan|\binf\b|stabil|numeric))",
                     re.IGNORECASE)


class ManualSoftmax(Rule):
    code = "MAT602"
    name = "manual-softmax"
    quiet_in = (TESTS, REFERENCE)
    summary = "Softmax written out as `exp(x) / exp(x).sum(dim, keepdim=True)`; `x.softmax(dim)` is one stable kernel."
    docs = """
    ## What it does
    Flags a division (`/`, `.div`, `torch.div`, `e /= ...`) whose numerator is `torch.exp(x)`
    (or `x.exp()`, or a name holding it) and whose denominator is the sum of the same
    exponentials over one dim with `keepdim=True` (`torch.exp(x).sum(-1, keepdim=True)`,
    `torch.sum(e, dim=1, keepdim=True)`, numpy's spelling `e.sum(axis=-1, keepdims=True)`),
    also in the max-subtracted form `exp(x - x.max(dim, keepdim=True).values)` (the max may sit
    in a name: the message then suggests softmax of the unshifted `x` and claims no overflow)
    and with a small `+ eps` in the denominator. A maximum taken over another dim, or over all
    of `x`, also keeps every exponent <= 0: the message then warns of underflow (a row of zeros
    gives 0/0 = nan) instead of overflow.

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
    - Normalized kernels whose exponent is written negated (`exp(-x.pow(2) / (2 * sigma ** 2))`,
      `exp(-0.5 * dist / sigma ** 2)`, a negative factor anywhere in the product, `d.neg()`, or
      a name holding such an exponent, divided by its sum): a Gaussian or RBF weighting, which
      reads as what it is and cannot overflow.
    - numpy and math (`np.exp(x) / np.exp(x).sum()`): not tensors.
    - Masked or weighted forms (`exp(x) * mask / (exp(x) * mask).sum(...)`), sums without
      `keepdim=True` or over all elements (`dim=None`), and denominators that are not the sum of the
      numerator's exponentials (`exp(x) / (1 + exp(x))` is a sigmoid); sums over several dims
      (`dim=(-2, -1)`), which no one softmax call takes.
    - Exponentials changed between the `exp` and the division (masked in place with
      `masked_fill_` or `e[~mask] = 0`, rebound, or renormalized in a loop as in Sinkhorn).
    - A sum held in a name that is also read elsewhere (`x_exp @ grid / x_sum` next to
      `x_exp / x_sum`): softmax would compute it again, adding kernels instead of removing them.
    - Hand-written steps with comments, on their lines or up to five lines above them, that
      mention softmax and give a reason for writing it out (it is faster or slower, avoids or
      works around something, is deliberate, serves an export: `# softmax(dim=1) as exp(x - max)
      / sum: the dim-1 kernel is slower here`): the form was chosen knowingly. A comment that
      only names the op (`# softmax over the keys`) is a label, and one that explains the max
      subtraction (`# subtract the max to avoid overflow`) explains no choice against softmax:
      the steps are reported.
    - Code compiled by torch.compile: a function (or class) under a decorator whose name says
      compile (`@torch.compile`, `@torch.compile(mode=...)`), or a module-level function handed
      to one (`fast = torch.compile(f)`): its steps are fused already. TorchScript
      (`@torch.jit.script`) is reported: its default fuser fuses elementwise ops only, so the
      exp, the sum and the division stay separate kernels.

    ## Fix safety
    The fix (`x.softmax(dim=D)`) is offered only when the exponentials are written inline, and
    it is **unsafe**: where the hand-written form overflowed to `nan`, softmax returns the
    right probabilities, and for an integer `x` softmax raises where `exp` promoted to float.
    There is no fix for the `+ eps` form (the result changes by the eps).
    """

    only = {"visit_Call": Only(attrs=PRODUCT_METHODS)}

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Div):
            self._check(node, node.op.__class__, node.left, node.right)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Div) and isinstance(node.target, ast.Name):  # `e /= e.sum(-1, keepdim=True)`
            self._check(node, ast.Div, node.target, node.value)

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
        dim = total.arg(1, "dim") or total.keywords.get("axis")
        summed = total.args[0]
        if isinstance(dim, (ast.Tuple, ast.List, ast.Set)) or isinstance(dim, ast.Constant) and dim.value is None:
            return  # a sum over several dims or all elements: no one softmax call does that
        if dim is None or not (same(summed, left) or same(self._exp_argument(flow, summed), numerator)):
            return
        if eps is not None and not is_eps(eps):
            return
        if self._reused(flow, node, denominator) or self._explained(flow, node, left) or in_compiled_code(self.ctx, reductions=True):
            return
        logits, shift = self._unshifted(flow, numerator, dim)
        suggestion = f"{logits}.softmax(dim={self.ctx.segment(dim)})"
        message = f"hand-written softmax: use `{suggestion}`, one fused kernel"
        if shift is None:
            message += "; exp() also overflows to inf for large inputs (x > 88 in float32), making inf/inf = nan"
        elif shift == "other":
            message += ("; the maximum subtracted is not taken over the summed dim, so a whole row can "
                        "underflow to 0, making 0/0 = nan")
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
        if self._negated(flow, op.args[0], 4):
            return None  # exp(-d ** 2 / (2 * sigma ** 2)): a Gaussian / RBF kernel being normalized
        return op.args[0]

    def _negated(self, flow, node: ast.AST, depth: int) -> bool:
        """Whether an exponent is written negated: `-d`, `-0.5 * d / s ** 2`, `d.neg()`, a negative
        factor anywhere in a product (`(-g * d2) / tau`), or a name holding one."""
        if isinstance(node, ast.Name):
            node = resolve(flow, node, depth=1)
        if isinstance(node, ast.UnaryOp):
            return isinstance(node.op, ast.USub)
        value = number(node)
        if value is not None:
            return value < 0
        if not depth:
            return False
        found = product(self.ctx, node)
        if found is not None:
            return self._negated(flow, found[1], depth - 1) != self._negated(flow, found[2], depth - 1)
        op = torch_op(self.ctx, node)
        return op is not None and op.name in ("neg", "negative")

    def _reused(self, flow, node: ast.AST, total: ast.AST) -> bool:
        """Whether a name holding the sum is also read outside this division (`x_exp @ grid / x_sum`
        next to `x_exp / x_sum`): the sum is computed anyway, and softmax would compute it again,
        adding kernels instead of removing them. (Exponentials reused elsewhere still leave the
        sum and the division to fuse: `p = e / e.sum(...)` next to `e.T / e.T.sum(...)`.)"""
        if isinstance(total, ast.Name):
            assign = flow.reaching(total)
            return assign is not None and not feeds_only(self.ctx, flow, assign, node)
        return False

    def _explained(self, flow, node: ast.AST, exps: ast.AST) -> bool:
        """Whether the comments on the lines of the hand-written steps, or in the few lines above
        them, mention softmax and give a reason for writing it out (`# softmax(dim=1) as exp(sim -
        column max) / column sum: the dim-1 kernel is slower here`): the form was chosen knowingly.
        A label (`# softmax over the keys`) explains nothing."""
        first = flow.statement(node) or node
        if isinstance(exps, ast.Name):
            first = flow.reaching(exps) or first
        top = max(first.lineno - _COMMENT_LINES_ABOVE, getattr(flow.function, "lineno", 1))
        comments = []
        for line in self.ctx.lines[top - 1:node.end_lineno]:
            at = line.find("#")
            if at >= 0:
                comments.append(line[at + 1:])
        text = " ".join(comments)
        return "softmax" in text.lower() and _REASON.search(text) is not None

    def _unshifted(self, flow, logits: ast.AST, dim: ast.AST):
        """(text of x, "same") for `x - x.max(dim, keepdim=True)[0]` / `.values` / `x.amax(dim, keepdim=True)`,
        also held in names and scaled (`(x - m) / T` gives the text of `x / T`); else the text of
        the exponent, with "other" when it is x less its maximum over another dim or all of x
        (every exponent is <= 0: no overflow, but a row can underflow), "shifted" when such a
        difference is scaled by a factor of unknown sign, None when it is not shifted."""
        value = resolve(flow, logits, depth=1)
        scale = None  # (operator, factor) of `(x - m) / T`, `(x - m) * c`, `c * (x - m)`
        shifted = difference(self.ctx, value)
        if shifted is None:
            found = product(self.ctx, value)
            if found is not None:
                operator, left, right = found
                shifted = difference(self.ctx, resolve(flow, left, depth=1))
                scale = (operator, right)
                if shifted is None and operator is ast.Mult:
                    shifted = difference(self.ctx, resolve(flow, right, depth=1))
                    scale = (operator, left)
        if shifted is not None:
            x, shift = shifted
            shift = resolve(flow, shift, depth=1)
            while True:
                if isinstance(shift, ast.Subscript) and number(shift.slice) == 0:
                    shift = shift.value
                elif isinstance(shift, ast.Attribute) and shift.attr == "values":
                    shift = shift.value
                elif (isinstance(shift, ast.Call) and isinstance(shift.func, ast.Attribute)
                      and shift.func.attr == "detach" and not shift.args):
                    shift = shift.func.value
                else:
                    break
            op = torch_op(self.ctx, shift)
            if op is not None and op.name in ("max", "amax") and same(op.args[0], x):
                over = op.arg(1, "dim")
                if same(over, dim):
                    if scale is None:
                        return self._atom(x), "same"
                    operator = "*" if scale[0] is ast.Mult else "/"
                    return f"({self._atom(x)} {operator} {self._atom(scale[1])})", "same"
                if over is None and len(op.args) == 1 or is_true(op.keywords.get("keepdim", op.arg(2, ""))):
                    factor = None if scale is None else number(scale[1])
                    # exponents <= 0 unless a scale of unknown sign multiplies them
                    return self._atom(logits), "other" if scale is None or factor is not None and factor > 0 else "shifted"
        return self._atom(logits), None

    def _atom(self, node: ast.AST) -> str:
        text = self.ctx.segment(node)
        return text if isinstance(node, _ATOMS) else f"({text})"
