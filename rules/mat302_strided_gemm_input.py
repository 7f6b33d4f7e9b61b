"""MAT302 strided-gemm-input: a GEMM operand whose layout forces a hidden copy on every call."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule, bad, good

from ._kinds import int_const
from ._layout import gemm_of_operand, mergeable, rank_of, reorder
from ._torch_api import as_gemm

_FOLDING = ("nn.Linear", "linear")
_REORDERS = ("permute", "transpose", "swapaxes", "swapdims")


def _strided_last_dim(ctx, operand: ast.AST) -> bool:
    """`x[..., ::2]`, `x[:, 1::2]` of a tensor of known rank: the last dim has a step."""
    if not isinstance(operand, ast.Subscript) or not isinstance(operand.slice, ast.Tuple):
        return False
    elts = operand.slice.elts
    last = elts[-1]
    if not isinstance(last, ast.Slice) or last.step is None or int_const(last.step) in (1, -1):
        return False
    if any(isinstance(e, ast.Starred) for e in elts) or reorder(ctx, operand.value) is not None:
        return False
    first_is_ellipsis = isinstance(elts[0], ast.Constant) and elts[0].value is Ellipsis
    if first_is_ellipsis:
        return len(elts) >= 2
    if any(isinstance(e, ast.Constant) and e.value in (None, Ellipsis) for e in elts):
        return False
    return rank_of(ctx, operand.value) == len(elts) and len(elts) >= 2


class StridedGemmInput(Rule):
    code = "MAT302"
    name = "strided-gemm-input"
    summary = "A GEMM operand cuBLAS cannot read in place (strided last dim, permuted batch dims): matmul copies it on every call."
    docs = """
    ## What it does
    Flags GEMM operands whose memory layout forces a copy before the matrix units can read
    them, following the rule cuBLAS applies (`prepare_matrix_for_cublas`: a matrix is read in
    place when one of its last two dims has stride 1 and the other a stride at least the
    row length; `matmul` folds batch dims with `reshape`, which copies when they cannot merge):
    - a step slice of the last dim (`x[:, ::2] @ w`, `x[..., 1::2] @ w`, `F.linear(x[..., ::2], w)`):
      no dim has stride 1 any more;
    - a permute written inline as an operand whose batch dims `matmul` must fold but cannot
      merge: `x.permute(1, 0, 2) @ w` (a 3-D left operand with a matrix on the right, or any input
      of a linear layer), `torch.matmul(a.permute(0, 2, 1, 3), b.permute(0, 2, 3, 1))`;
    - a permute that leaves no unit-stride dim among the last two (`torch.bmm(x.permute(2, 0, 1), y)`).

    The message says when the GEMM runs inside a loop, where the copy repeats per iteration.

    ## Why is this bad?
    The copy is hidden inside the GEMM call (an `aten::clone` in matmul's `reshape`, or a copy
    inside the cuBLAS path that not even a dispatch mode sees): an extra kernel and a full read
    and write of the operand on every call, and usually again in backward.
    Laying the data out the way the GEMM reads it once (store the weight transposed at init,
    produce activations in `(..., rows, K)` order) removes it.

    ## Example
    ```python
    y = x[:, ::2] @ w                        # every other input feature
    z = h.permute(1, 0, 2) @ w               # (T, B, D) -> (B, T, D) then folded to rows
    ```

    ## Use instead
    ```python
    x_even = x[:, ::2].contiguous()          # once, where x is made or before the loop that reuses it
    y = x_even @ w
    z = (h @ w).permute(1, 0, 2)             # multiply in the stored layout, permute the result
    ```

    ## Stays quiet on
    - Layouts cuBLAS reads for free: a plain transpose of the last two dims (`x @ w.T`, `.mT`,
      `transpose(-2, -1)`), row-strided slices (`x[::2] @ w`, `x[:, ::2]` of a 3-D tensor, which
      steps the rows), and permutes of the batch dims of `bmm` or of a batched matmul whose batch
      dims still merge.
    - Operands whose rank or layout it cannot see: names assigned from a permute elsewhere,
      slices of tensors of unknown rank (`x[:, ::2]` could step a row dim), bases that are
      themselves transposed.

    ## Fix safety
    No automatic fix: the better layout has to be produced where the data is created.
    """
    examples = [
        bad("""
            import torch
            def f(w):
                x = torch.randn(64, 128)
                return x[:, ::2] @ w
            """, (4, 12), message_contains="no dim with stride 1"),
        bad("""
            import torch
            import torch.nn as nn
            import torch.nn.functional as F
            class M(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(64, 64)
                def forward(self, h, w, xs):
                    a = self.fc(h.permute(1, 0, 2))
                    b = F.linear(h[..., 1::2], w)
                    for x in xs:
                        c = torch.matmul(x.permute(0, 2, 1, 3), w.permute(0, 2, 3, 1))
                    return a, b, c
            """, (9, 21), (10, 22), (12, 30), (12, 53), message_contains="on every iteration"),
        bad("""
            from torch import bmm, permute
            def f(x, y):
                return bmm(x.permute(2, 0, 1), y), bmm(permute(y, (2, 0, 1)), x)
            """, (3, 16), (3, 44)),
        good("""
            import torch
            def f(x, w, q, k, y):
                a = x @ w.T
                b = x @ w.transpose(-2, -1)
                c = x[::2] @ w
                d = torch.bmm(y.permute(1, 0, 2), y)
                e = x[:, ::2] @ w
                t = torch.randn(4, 8, 16)
                g = t[:, ::2] @ w
                h = torch.matmul(q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3).mT)
                return a, b, c, d, e, g, h
            """),
        good("""
            import torch
            def f(x, w, z):
                u = z.permute(0, 2, 1, 3) @ w
                v = x.permute(1, 2, 0) @ w
                return u, v
            """),
    ]

    # The operand is visited: a step slice, or a call of `permute`/`transpose`/... (a method or a bare name).
    only = {"visit_Call": Only(attrs=frozenset(_REORDERS))}

    def visit_Call(self, node: ast.Call) -> None:
        self._visit_operand(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._visit_operand(node)

    def _visit_operand(self, node) -> None:
        if self._maybe_strided(node):
            gemm_node = gemm_of_operand(self.ctx, node, self._maybe_strided)
            if gemm_node is not None:
                self.check_gemm(gemm_node)

    def check_gemm(self, node: ast.AST) -> None:
        gemm = as_gemm(self.ctx, node)
        if gemm is None or gemm.op not in ("@", "matmul", "mm", "bmm") + _FOLDING:
            return
        operands = gemm.operands[:1] if gemm.op in _FOLDING else gemm.operands
        if len(gemm.operands) != (1 if gemm.op == "nn.Linear" else 2):
            return
        for position, operand in enumerate(operands):
            why = self._copy_reason(gemm, position, operand)
            if why:
                where = " on every iteration of the loop" if self.ctx.loops else " on every call"
                self.report(operand, f"`{self.ctx.segment(operand)}` {why}, so the GEMM copies it{where}; "
                                     "produce it in the layout the GEMM reads (weights: transpose or select "
                                     "once at init)")

    @staticmethod
    def _maybe_strided(expr: ast.AST) -> bool:
        """Syntax alone: a step slice, or a permute/transpose call (`.t()`, `.T`, `.mT` are always free)."""
        if isinstance(expr, ast.Subscript):
            last = expr.slice.elts[-1] if isinstance(expr.slice, ast.Tuple) and expr.slice.elts else None
            return isinstance(last, ast.Slice) and last.step is not None
        if not isinstance(expr, ast.Call):
            return False
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", None)
        return name in _REORDERS

    def _copy_reason(self, gemm, position: int, operand: ast.AST) -> Optional[str]:
        if _strided_last_dim(self.ctx, operand):
            return "steps through its last dim, leaving no dim with stride 1"
        view = reorder(self.ctx, operand)
        if view is None or view.perm is None or view.last_two_only or not isinstance(view.node, ast.Call):
            return None
        perm, rank = view.perm, len(view.perm)
        if rank < 3:
            return None
        if gemm.op == "bmm":
            return None if rank - 1 in perm[-2:] else "has no unit-stride dim among its last two"
        if gemm.op in ("@", "matmul"):
            other = gemm.operands[1 - position]
            other_view = reorder(self.ctx, other)
            other_rank = len(other_view.perm) if other_view and other_view.perm else rank_of(self.ctx, other)
            if other_rank is None:
                return None
            if position == 0 and other_rank == 2:
                return self._fold(perm, rank - 1)
            if other_rank != rank:
                return None
            if rank - 1 not in perm[-2:]:
                return "has no unit-stride dim among its last two"
            return self._fold(perm, rank - 2)
        if gemm.op in _FOLDING:
            return self._fold(perm, rank - 1)
        return None

    @staticmethod
    def _fold(perm: tuple, count: int) -> Optional[str]:
        """matmul reshapes the first `count` dims into one; a copy unless they merge in place."""
        if all(mergeable(perm, i) for i in range(count - 1)):
            return None
        return "has permuted leading dims that matmul must fold with `reshape`"
