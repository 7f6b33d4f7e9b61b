"""MAT102 scalar-loop-matmul: a matrix product computed one scalar at a time in a triple loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule, bad, good

from . import _kinds
from ._loops import loaded_names


def _range_var(loop) -> Optional[str]:
    """The counter of `for v in range(n)` / `range(0, n)`, a whole dim from 0, else None."""
    node = loop.node
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return None
    it = node.iter
    if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) in (1, 2) and not it.keywords):
        if len(it.args) == 2 and not (isinstance(it.args[0], ast.Constant) and it.args[0].value == 0):
            return None  # `range(1, n)` leaves a row out
        return node.target.id
    return None


def _indices(expr: ast.AST):
    """(base, [index names]) for `A[i][k]` or `A[i, k]`, else None."""
    if not isinstance(expr, ast.Subscript):
        return None
    if isinstance(expr.slice, ast.Tuple):
        elts = expr.slice.elts
        if len(elts) == 2 and all(isinstance(e, ast.Name) for e in elts):
            return expr.value, [e.id for e in elts]
        return None
    inner = expr.value
    if isinstance(expr.slice, ast.Name) and isinstance(inner, ast.Subscript) and isinstance(inner.slice, ast.Name):
        return inner.value, [inner.slice.id, expr.slice.id]
    return None


class ScalarLoopMatmul(Rule):
    code = "MAT102"
    name = "scalar-loop-matmul"
    summary = "A matrix product computed element by element in a Python triple loop; `A @ B` does it in one call."
    docs = """
    ## What it does
    Flags three nested `for ... in range(...)` loops whose body accumulates a product of two
    tensor elements into a third: `C[i][j] += A[i][k] * B[k][j]` (also `C[i, j] += ...`,
    `C[i][j] = C[i][j] + ...`, and a scalar accumulator `s += A[i, k] * B[k, j]` stored to
    `C[i, j] = s` after the innermost loop), in any loop order and with either operand
    transposed (`A[k][i]`). The message gives the single call, `A @ B` or the `einsum`.

    ## Why is this bad?
    Every scalar multiply-add is a Python operation plus, on tensors, a dispatch and a
    0-d tensor allocation (on a GPU, a kernel launch and a sync per element): millions of times
    slower than one GEMM on the matrix units.

    ## Example
    ```python
    for i in range(n):
        for j in range(m):
            for k in range(p):
                C[i][j] += A[i][k] * B[k][j]
    ```

    ## Use instead
    ```python
    C += A @ B
    ```

    ## Stays quiet on
    - Loops that are not three plain `range` counters over whole dims (`range(0, n, step)`
      tiles, `range(1, n)`, a bound that reads another counter as in `range(i + 1)`, loops over
      lists), sums added under an `if`, scalar accumulators not reset to 0 for each element, sums whose indices do not form a product (`A[i][k] * B[i][k]`, `A[i][j] * B[j][k]`
      into `C[i][k]` with `j` not a loop counter).
    - Operands not known to be tensors: Python lists of lists and numpy arrays (textbook code
      about loops), names of unknown kind.

    ## Fix safety
    No automatic fix: the loops may do more than the product (bounds, other statements), and
    replacing them needs a human.
    """
    examples = [
        bad("""
            import torch
            def matmul(A, B, n, m, p):
                C = torch.zeros(n, m)
                A = A.view(n, p)
                for i in range(n):
                    for j in range(m):
                        for k in range(p):
                            C[i][j] += A[i][k] * B[k][j]
                return C
            """, (5, 5), message_contains="C += A @ B"),
        bad("""
            import torch as T
            a = T.randn(4, 3)
            b = T.randn(3, 5)
            c = T.empty(4, 5)
            for row in range(4):
                for col in range(5):
                    acc = 0.0
                    for inner in range(3):
                        acc += a[inner, row] * b[inner, col]
                    c[row, col] = acc
            """, (5, 1), message_contains="c = a.T @ b"),
        bad("""
            import torch
            x = torch.rand(8, 8)
            y = torch.rand(8, 8)
            out = torch.zeros(8, 8)
            for k in range(8):
                for i in range(8):
                    for j in range(0, 8):
                        out[i, j] = out[i, j] + y[k, j] * x[i, k]
            """, (5, 1), message_contains="out += x @ y"),
        good("""
            import torch
            def f(A, B, n):
                C = [[0] * n for _ in range(n)]
                for i in range(n):
                    for j in range(n):
                        for k in range(n):
                            C[i][j] += A[i][k] * B[k][j]
                return C
            """),
        good("""
            import numpy as np
            import torch
            A = np.random.rand(3, 3)
            C = np.zeros((3, 3))
            for i in range(3):
                for j in range(3):
                    for k in range(3):
                        C[i, j] += A[i, k] * A[k, j]
            """),
        good("""
            import torch
            x = torch.rand(8, 8)
            out = torch.zeros(8, 8)
            for i in range(8):
                for j in range(8):
                    for k in range(0, 8, 2):
                        out[i, j] += x[i, k] * x[k, j]
                    out[i, j] += x[i, j] * x[j, i]
            """),
        good("""
            import torch
            def tri(A: torch.Tensor, B: torch.Tensor, n: int):
                C = torch.zeros(n, n)
                for i in range(n):
                    for j in range(n):
                        for k in range(i + 1):
                            C[i, j] += A[i, k] * B[k, j]
                return C
            def skip_first(A: torch.Tensor, B: torch.Tensor, n: int):
                C = torch.zeros(n, n)
                for i in range(n):
                    for j in range(n):
                        for k in range(1, n):
                            C[i, j] += A[i, k] * B[k, j]
                return C
            def off_diagonal(A: torch.Tensor, B: torch.Tensor, n: int):
                C = torch.zeros(n, n)
                for i in range(n):
                    for j in range(n):
                        for k in range(n):
                            if k != i:
                                C[i, j] += A[i, k] * B[k, j]
                return C
            def running(A: torch.Tensor, B: torch.Tensor, n: int):
                C = torch.zeros(n, n)
                s = 0.0
                for i in range(n):
                    for j in range(n):
                        for k in range(n):
                            s += A[i, k] * B[k, j]
                        C[i, j] = s
                return C
            """),
    ]

    only = {"visit_AugAssign": Only(in_loops=True), "visit_Assign": Only(in_loops=True)}

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Add) and len(self.ctx.loops) >= 3:
            self._check(node.target, node.value, node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1 or len(self.ctx.loops) < 3:
            return
        value = node.value
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
            same = self.ctx.segment(node.targets[0])
            if self.ctx.segment(value.left) == same:
                self._check(node.targets[0], value.right, node)
            elif self.ctx.segment(value.right) == same:
                self._check(node.targets[0], value.left, node)

    def _check(self, target: ast.AST, value: ast.AST, stmt: ast.AST) -> None:
        loops = self.ctx.loops[-3:]
        counters = [_range_var(loop) for loop in loops]
        if None in counters or len(set(counters)) != 3:
            return
        if any(loaded_names(loop.node.iter) & set(counters) for loop in loops):
            return  # `range(i + 1)`: a triangular sum, not the whole product
        if stmt not in loops[2].node.body:
            return  # under an `if` in the innermost loop: not every term is added
        if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)):
            return
        left, right = _indices(value.left), _indices(value.right)
        if left is None or right is None:
            return
        if isinstance(target, ast.Name):
            out = self._stored_accumulator(target.id, loops)
        else:
            out = _indices(target)
        if out is None:
            return
        out_base, (row, col) = out
        if row == col or not {row, col} <= set(counters):
            return
        inner = (set(counters) - {row, col}).pop()
        if not self._tensors(out_base, left[0], right[0]):
            return
        # Put the operand holding the output row first.
        if row not in left[1]:
            left, right = right, left
        if sorted(left[1]) != sorted([row, inner]) or sorted(right[1]) != sorted([inner, col]):
            return
        key = ("mat102", id(loops[0].node))
        if key in self.ctx.shared:
            return
        self.ctx.shared[key] = True
        seg = self.ctx.segment
        a = seg(left[0]) + (".T" if left[1] == [inner, row] else "")
        b = seg(right[0]) + (".T" if right[1] == [col, inner] else "")
        assign = "=" if isinstance(target, ast.Name) else "+="
        first = loops[0].node
        self.report(first, f"a matrix product computed one element at a time in a Python triple loop; use one call: "
                           f"`{seg(out_base)} {assign} {a} @ {b}`", end_node=first.iter)

    def _stored_accumulator(self, name: str, loops):
        """`s += ...` in the innermost loop, and `C[i][j] = s` right after it in the middle loop."""
        innermost = loops[2].node
        body = loops[1].node.body
        if innermost not in body:
            return None
        before = body[:body.index(innermost)]
        if not any(isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                   and stmt.targets[0].id == name and isinstance(stmt.value, ast.Constant) and stmt.value.value == 0
                   for stmt in before):
            return None  # not started from 0 for each element: a running sum, not C[i, j]
        for stmt in body[body.index(innermost) + 1:]:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Name)
                    and stmt.value.id == name):
                return _indices(stmt.targets[0])
        return None

    def _tensors(self, *bases) -> bool:
        kinds = [_kinds.kind_of(self.ctx, b) for b in bases]
        if any(k in _kinds.NON_TENSORS for k in kinds):
            return False
        return sum(k in _kinds.TENSORS or (k is None and _kinds.looks_like_tensor(self.ctx, b))
                   for k, b in zip(kinds, bases)) >= 2
