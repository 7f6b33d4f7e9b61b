"""Which calls are GEMMs, and what their operands are, in every spelling: `a @ b`,
`torch.matmul(a, b)`, `T.mm(a, b)`, `mm(a, b)` after `from torch import mm`, `a.matmul(b)`,
`torch.einsum("ij,jk->ik", a, b)`, `F.linear(x, w)`, operands passed by keyword
(`torch.matmul(a, other=b)`, `a.mm(mat2=b)`), and an `nn.Linear` module applied to `x`."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from . import kinds as _kinds

# Function -> index of the first tensor operand and how many operands are multiplied.
GEMM_FUNCTIONS = {
    "torch.matmul": "matmul",
    "torch.mm": "mm",
    "torch.bmm": "bmm",
    "torch.dot": "dot",
    "torch.vdot": "dot",
    "torch.mv": "mv",
    "torch.inner": "inner",
    "torch.tensordot": "tensordot",
    "torch.einsum": "einsum",
    "torch.nn.functional.linear": "linear",
    "torch.nn.functional.bilinear": "bilinear",
    "torch.addmm": "addmm",
    "torch.baddbmm": "baddbmm",
    "torch.addbmm": "addbmm",
    "torch.addmv": "addmv",
    "torch.chain_matmul": "chain_matmul",
    "torch.linalg.multi_dot": "multi_dot",
}
# Methods whose name alone says GEMM on a tensor receiver.
# Context managers (and decorators) under which autograd records nothing.
NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode"})

GEMM_METHODS = {"matmul", "mm", "bmm", "mv", "addmm", "baddbmm", "addbmm", "addmv"}
# `.dot` is also numpy's; it counts only on a receiver known to be a tensor.
GEMM_METHODS_NEEDING_TENSOR = {"dot", "inner"}
_ADD_FORMS = {"addmm", "baddbmm", "addbmm", "addmv"}


@dataclass
class Gemm:
    node: ast.AST
    op: str               # "@", "matmul", "mm", "einsum", "linear", "nn.Linear", ...
    operands: list        # the multiplied tensors, in order
    spelling: str         # how the user wrote the call, for messages
    subscripts: Optional[str] = None   # einsum's equation when it is a string literal
    method: bool = False  # x.mm(y) rather than torch.mm(x, y)


# Parameter names of the GEMMs whose operands can be passed by keyword (`torch.matmul(a, other=b)`).
_PARAMETERS = {
    "matmul": ("input", "other"), "mm": ("input", "mat2"), "bmm": ("input", "mat2"), "mv": ("input", "vec"),
    "dot": ("input", "other"), "inner": ("input", "other"), "linear": ("input", "weight", "bias"),
    "addmm": ("input", "mat1", "mat2"), "baddbmm": ("input", "batch1", "batch2"),
    "addbmm": ("input", "batch1", "batch2"), "addmv": ("input", "mat", "vec"),
}


def _call_args(call: ast.Call) -> list:
    return [a for a in call.args if not isinstance(a, ast.Starred)]


def _with_keyword_operands(op: str, args: list, keywords: list, method: bool) -> list:
    """`args` followed by the operands passed by keyword, in parameter order (a method's
    receiver is its `input`)."""
    params = _PARAMETERS.get(op)
    if params is None or not keywords:
        return args
    given = {k.arg: k.value for k in keywords if k.arg}
    operands = list(args)
    for name in params[int(method) + len(args):]:
        if name not in given:
            break
        operands.append(given[name])
    return operands


def as_gemm(ctx, node: ast.AST) -> Optional[Gemm]:
    """The GEMM `node` issues, or None. Worked out once per node, however many rules ask."""
    key = ("gemm", id(node))
    if key not in ctx.shared:
        ctx.shared[key] = _as_gemm(ctx, node)
    return ctx.shared[key]


def _as_gemm(ctx, node: ast.AST) -> Optional[Gemm]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return Gemm(node, "@", [node.left, node.right], "@")
    if not isinstance(node, ast.Call):
        return None
    args = _call_args(node)
    if len(args) != len(node.args):
        return None
    func = node.func
    qualname = ctx.qualname(func)
    if qualname in GEMM_FUNCTIONS:
        op = GEMM_FUNCTIONS[qualname]
        args = _with_keyword_operands(op, args, node.keywords, method=False)
        spelling = ctx.segment(func)
        if op == "einsum":
            if not args:
                return None
            eq = args[0]
            subscripts = eq.value if isinstance(eq, ast.Constant) and isinstance(eq.value, str) else None
            operands = args[1:]
            if len(operands) == 1 and isinstance(operands[0], (ast.List, ast.Tuple)):
                operands = list(operands[0].elts)
            if len(operands) < 2 and not any(isinstance(o, ast.Starred) for o in operands):
                return None  # `einsum("bhwc->bchw", x)`: a permute or a reduction, no product
            return Gemm(node, op, operands, spelling, subscripts)
        if op in _ADD_FORMS:
            return Gemm(node, op, args[1:3], spelling) if len(args) >= 3 else None
        if op == "linear":
            return Gemm(node, op, args[:2], spelling) if len(args) >= 2 else None
        if op in ("chain_matmul",):
            return Gemm(node, op, args, spelling)
        if op == "multi_dot":
            return Gemm(node, op, list(args[0].elts) if args and isinstance(args[0], (ast.List, ast.Tuple)) else args, spelling)
        return Gemm(node, op, args[:2], spelling) if len(args) >= 2 else None
    if qualname is not None:
        # An imported name that is not a GEMM (numpy.dot, a user module): not ours.
        if isinstance(func, ast.Attribute) and ctx.qualname(func.value) is not None:
            return None
    if isinstance(func, ast.Attribute):
        name = func.attr
        receiver = func.value
        if ctx.qualname(receiver) is not None and not _kinds.is_tensor(ctx, receiver):
            return None  # np.dot(...), scipy..., a module function
        is_gemm_method = name in GEMM_METHODS or (
            name in GEMM_METHODS_NEEDING_TENSOR and _kinds.is_tensor(ctx, receiver))
        if is_gemm_method:
            args = _with_keyword_operands(name, args, node.keywords, method=True)
        if is_gemm_method and args and not _kinds.is_non_tensor(ctx, receiver):
            if name in _ADD_FORMS:
                return Gemm(node, name, args[:2], "." + name, method=True) if len(args) == 2 else None
            # tensor.matmul(other) takes one tensor; two arguments mean a module function (d2l.matmul(a, b))
            return Gemm(node, name, [receiver, args[0]], "." + name, method=True) if len(args) == 1 else None
    # A Linear module applied to a tensor: self.proj(x), proj(x)
    if (len(args) == 1 and not node.keywords and _kinds.may_mention(ctx, "Linear")
            and _kinds.callee_kind(ctx, func) == _kinds.LINEAR):
        return Gemm(node, "nn.Linear", [args[0]], ctx.segment(func))
    return None


