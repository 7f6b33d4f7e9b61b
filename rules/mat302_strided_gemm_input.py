"""MAT302 strided-gemm-input: a GEMM operand whose layout forces a hidden copy on every call."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional

from matlint.rule import Only, Rule, bad, good

from ._flow import flow_of, function_text, has_word
from ._kinds import FACTORIES, int_const
from ._layout import Reorder, gemm_of_operand, mergeable, rank_of, reorder
from ._torch_api import as_gemm

_FOLDING = ("nn.Linear", "linear")
# Tensor factories whose result does not require grad unless asked (`as_tensor`/`asarray` may return their argument).
_NO_GRAD_FACTORIES = FACTORIES - {"as_tensor", "asarray"}
_PRODUCE = "produce it in the layout the GEMM reads (weights: transpose or select once at init)"


@dataclass
class _Copy:
    """Why a GEMM copies an operand (and when), who makes the copy, and what avoids it."""
    why: str
    who: str
    advice: str
_REORDERS = ("permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis")


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
    summary = "A GEMM operand cuBLAS cannot read in place (strided last dim, permuted batch dims): a hidden copy before the GEMM."
    docs = """
    ## What it does
    Flags GEMM operands whose memory layout forces a copy before the matrix units can read
    them, following the rule cuBLAS applies (`prepare_matrix_for_cublas`: a matrix is read in
    place when one of its last two dims has stride 1 and the other a stride at least the
    row length; `matmul` folds batch dims with `reshape`, which copies when they cannot merge):
    - a step slice of the last dim (`x[:, ::2] @ w`, `x[..., 1::2] @ w`, `F.linear(x[..., ::2], w)`):
      no dim has stride 1 any more;
    - a permute written inline as an operand whose leading dims `matmul` folds but cannot merge:
      `x.permute(1, 0, 2) @ w` (a 3-D left operand with a matrix on the right, or any input of a
      linear layer: matmul folds these only when the matrix requires grad, as every trainable
      parameter does, even under `torch.no_grad()`; otherwise it runs `bmm` on the view without a
      copy), and `torch.matmul(a.permute(0, 2, 1, 3), b.permute(0, 2, 3, 1))` (two batched
      operands: always folded);
    - a permute that leaves no unit-stride dim among the last two (`torch.bmm(x.permute(2, 0, 1), y)`).

    The message says when the GEMM runs inside a loop, where the copy repeats per iteration, and
    what avoids the copy: multiplying in the stored layout and permuting the product where the
    permute keeps the last dim in place (`(h @ w).permute(1, 0, 2)`); listing the batch dims in
    memory order in both operands and permuting the product back, where both store them together
    in the same order; otherwise only a tensor made in the layout the GEMM reads, and where a
    layer's output fixes the layout, it says the copy is the price of that product.

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
    s = torch.matmul(q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0)).permute(1, 0, 2, 3)
                                             # not q.permute(2, 1, 0, 3) and k.permute(2, 1, 3, 0)
    ```

    ## Stays quiet on
    - Layouts cuBLAS reads for free: a plain transpose of the last two dims (`x @ w.T`, `.mT`,
      `transpose(-2, -1)`), row-strided slices (`x[::2] @ w`, `x[:, ::2]` of a 3-D tensor, which
      steps the rows), and permutes of the batch dims of `bmm` or of a batched matmul whose batch
      dims still merge.
    - Operands whose rank or layout it cannot see: names assigned from a permute elsewhere,
      slices of tensors of unknown rank (`x[:, ::2]` could step a row dim), bases that are
      themselves transposed.
    - A permuted input times a matrix that never requires grad: a tensor factory such as
      `torch.randn(128, 8)`, inline or as the only value of a name, in a function that never
      mentions `requires_grad` (matmul does not fold then).

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
                return bmm(x.permute(2, 0, 1), y), bmm(permute(y, (2, 0, 1)), x), bmm(x.movedim(2, 0), y)
            """, (3, 16), (3, 44), (3, 75)),
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
        bad("""
            import torch
            import torch.nn as nn
            class M(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.proj = nn.Linear(64, 64)
                def forward(self, h, w):
                    assert h.ndim == 3 and w.ndim == 2
                    return h.transpose(0, 1) @ w, self.proj(torch.permute(h, (1, 0, 2)))
            """, (9, 16), (9, 49), message_contains="when `w` requires grad (as a trainable parameter does, even "
                                                    "under `torch.no_grad()`), so matmul copies it on every call; "
                                                    "multiply in the stored layout and permute the product instead: "
                                                    "`(h @ w).transpose(0, 1)`"),
        good("""
            import torch
            def f():
                y = torch.randn(4, 32, 128)
                w = torch.randn(128, 8)
                return y.permute(1, 0, 2) @ torch.randn(128, 8), [y.permute(1, 0, 2) @ w for _ in range(3)]
            """),
        bad("""
            import torch
            def relation_scores(q, k):
                assert q.ndim == 4 and k.ndim == 4  # (I, B, N, D), (J, B, N, D)
                return torch.matmul(q.permute(2, 1, 0, 3), k.permute(2, 1, 3, 0))
            """, (4, 25), (4, 48), message_contains="list them in memory order in both operands (here "
                                                    "`.permute(1, 2, 0, 3)`) and permute the product back with "
                                                    "`.permute(1, 0, 2, 3)`"),
        bad("""
            import torch
            def attend(embed, guide, bs: int, nh: int, hc: int, h: int, w: int):
                embed = embed.view(bs, nh, hc, h, w)
                guide = guide.view(bs, -1, nh, hc)
                return embed.flatten(3).transpose(2, 3) @ guide.permute(0, 2, 3, 1)
            """, (5, 47), message_contains="where a layer's output fixes this layout, the copy is the price of this product"),
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
            copy = self._copy(gemm, position, operand)
            if copy is not None:
                where = " on every iteration of the loop" if self.ctx.loops else " on every call"
                self.report(operand, f"`{self.ctx.segment(operand)}` {copy.why}, so {copy.who} copies it{where}; "
                                     f"{copy.advice}")

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

    def _copy(self, gemm, position: int, operand: ast.AST) -> Optional[_Copy]:
        if _strided_last_dim(self.ctx, operand):
            return _Copy("steps through its last dim, leaving no dim with stride 1", "the GEMM", _PRODUCE)
        view = reorder(self.ctx, operand, 3 if gemm.op == "bmm" else None)  # bmm takes 3-D batches only
        if view is None or view.perm is None or view.last_two_only or not isinstance(view.node, ast.Call):
            return None
        perm, rank = view.perm, len(view.perm)
        if rank < 3:
            return None
        if gemm.op == "bmm":
            return None if rank - 1 in perm[-2:] else self._no_unit_stride()
        if gemm.op in ("@", "matmul"):
            other = gemm.operands[1 - position]
            other_view = reorder(self.ctx, other)
            other_rank = len(other_view.perm) if other_view and other_view.perm else rank_of(self.ctx, other)
            if other_rank is None:
                return None
            if position == 0 and other_rank == 2:
                return None if self._never_requires_grad(other) else self._fold_rows(gemm, view, f"`{self.ctx.segment(other)}`")
            if other_rank != rank:
                return None
            if rank - 1 not in perm[-2:]:
                return self._no_unit_stride()
            return self._fold_batch(view, other_view)
        if gemm.op == "nn.Linear":
            return self._fold_rows(gemm, view, "the layer's weight")
        if gemm.op == "linear" and not self._never_requires_grad(gemm.operands[1]):
            return self._fold_rows(gemm, view, f"`{self.ctx.segment(gemm.operands[1])}`")
        return None

    def _never_requires_grad(self, matrix: ast.AST) -> bool:
        """`torch.randn(128, 8)`, inline or as the only value of a name, with no `requires_grad`
        anywhere in the function: matmul never folds for it."""
        values = [matrix]
        if isinstance(matrix, ast.Name):
            function = self.ctx.function
            if function is None or has_word(function_text(self.ctx, function), "requires_grad"):
                return False
            stores = flow_of(self.ctx, function).stores.get(matrix.id, [])
            if not stores or not all(simple for _, simple in stores):
                return False
            values = [stmt.value for stmt, _ in stores]
        for value in values:
            qual = self.ctx.qualname(value.func) if isinstance(value, ast.Call) else None
            if (qual is None or qual.rpartition(".")[0] != "torch" or qual.rpartition(".")[2] not in _NO_GRAD_FACTORIES
                    or any(k.arg == "requires_grad" for k in value.keywords)):
                return False
        return True

    @staticmethod
    def _no_unit_stride() -> _Copy:
        return _Copy("has no unit-stride dim among its last two", "the GEMM",
                     "only a tensor made with one of its last two dims innermost in memory avoids the copy; where "
                     "a layer's output fixes this layout, the copy is the price of this product")

    def _fold_rows(self, gemm, view: Reorder, weight: str) -> Optional[_Copy]:
        """A permuted input times a matrix: matmul reshapes its leading dims into rows, a copy
        unless they merge, and folds only when the matrix requires grad (else it runs `bmm` on
        the view with the matrix expanded, no copy)."""
        perm, rank = view.perm, len(view.perm)
        if all(mergeable(perm, i) for i in range(rank - 2)):
            return None
        why = (f"has permuted leading dims, which matmul folds into rows with `reshape` when {weight} requires "
               "grad (as a trainable parameter does, even under `torch.no_grad()`)")
        advice = _PRODUCE
        if perm[-1] == rank - 1:  # the product keeps the stored order of the leading dims: permute it instead
            product = self._product_in_stored_layout(gemm, view)
            if product is not None:
                advice = f"multiply in the stored layout and permute the product instead: `{product}`"
        return _Copy(why, "matmul", advice)

    def _product_in_stored_layout(self, gemm, view: Reorder) -> Optional[str]:
        seg = self.ctx.segment
        text, operand_text = seg(gemm.node), seg(view.node)
        if text.count(operand_text) != 1 or "\n" in text:
            return None
        base = seg(view.base)
        if not isinstance(view.base, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            base = f"({base})"
        product = text.replace(operand_text, base)
        if isinstance(gemm.node, ast.BinOp):
            product = f"({product})"
        suffix = operand_text[len(base):] if operand_text.startswith(base + ".") else None
        return product + (suffix or f".permute({', '.join(map(str, view.perm))})")

    @staticmethod
    def _fold_batch(view: Reorder, other_view: Optional[Reorder]) -> Optional[_Copy]:
        """Two batched operands: matmul reshapes the batch dims of each into one, a copy unless they merge."""
        perm, rank = view.perm, len(view.perm)
        batch = perm[:-2]
        if all(mergeable(perm, i) for i in range(rank - 3)):
            return None
        why = "has batch dims out of memory order, which matmul must fold into one with `reshape`"
        in_order = sorted(batch)
        if in_order != list(range(in_order[0], in_order[0] + len(in_order))):
            return _Copy(why, "matmul", "they are not next to each other in memory, so only a tensor made with "
                                        "them outermost avoids the copy; where a layer's output fixes this layout, "
                                        "the copy is the price of this product")
        # The batch dims lie together in memory, in another order: listing them in that order in
        # both operands (where the other one stores them the same way) and permuting the product
        # back removes the copy.
        order = [in_order.index(b) for b in batch]
        other_batch = other_view.perm[:-2] if other_view is not None and other_view.perm else tuple(range(rank - 2))
        if sorted(range(len(batch)), key=lambda i: batch[i]) != sorted(range(len(other_batch)), key=lambda i: other_batch[i]):
            return _Copy(why, "matmul", "the two operands store their batch dims in different orders: make them "
                                        "in one order where they are made")
        stored = ", ".join(map(str, in_order + list(perm[-2:])))
        back = ", ".join(map(str, order + [rank - 2, rank - 1]))
        return _Copy(why, "matmul", f"list them in memory order in both operands (here `.permute({stored})`) "
                                        f"and permute the product back with `.permute({back})`")
