"""MAT501 per-element-loop: tensor elements (or rows) computed one by one in a Python loop."""
from __future__ import annotations

import ast
from typing import Optional

from matlint.rule import Only, Rule, bad, good

from . import _kinds
from ._loops import LoopInfo, loaded_names
from ._names import in_test_code

# Element-wise functions an element expression may call, by qualified name or tensor method.
_ELEMENTWISE_FUNCTIONS = {
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "abs", "sin", "cos", "tan", "tanh", "sigmoid", "relu",
    "clamp", "clip", "pow", "maximum", "minimum", "floor", "ceil", "round", "sign", "square", "erf",
}
_SMALL_RANGE = 8


def _range_bound(loop: LoopInfo) -> Optional[ast.AST]:
    """The stop of `for i in range(...)`, or None when the loop is not a range loop over a name."""
    node = loop.node
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return None
    it = node.iter
    if not (isinstance(it, ast.Call) and getattr(it.func, "id", None) == "range" and it.args and not it.keywords):
        return None
    return it.args[1] if len(it.args) >= 2 else it.args[0]


class PerElementLoop(Rule):
    code = "MAT501"
    name = "per-element-loop"
    summary = "Tensor elements (or rows) computed one at a time in a Python `range` loop, one small op per element."
    docs = """
    ## What it does
    Flags, inside `for i in range(...)` loops (nested or not), element-wise tensor work
    written per index:
    - an element or slice of a tensor assigned from an element-wise expression of other
      elements at the loop indices: `out[i] = a[i] * 2 + b[i]`, `t[i, j] = x[i, j].exp()`,
      `t[:, i] = 0`, `if t[i] < 0: t[i] = 0`;
    - a Python accumulator summing elements: `total += x[i]`, `s += (a[i] - b[i]) ** 2`.
    The expression may use numbers, names, other tensors indexed by the loop variables, and
    element-wise functions (`torch.exp`, `math.sqrt`, `.abs()`, `.clamp()` ...).

    ## Why is this bad?
    Every indexing, arithmetic and assignment is a separate tensor op: on the GPU a kernel
    launch (~13 µs on an H100 for a few bytes of work), on the CPU microseconds of dispatch per
    element. One vectorized expression over the whole tensor does the same work in one or a
    few kernels.

    ## Example
    ```python
    for i in range(len(x)):
        out[i] = x[i] * w[i] + b[i]
    for i in range(x.shape[0]):
        if x[i] < 0:
            x[i] = 0
    ```

    ## Use instead
    ```python
    out = x * w + b
    x = x.clamp(min=0)            # or torch.where(x < 0, 0, x)
    ```

    ## Stays quiet on
    - Recurrences and scans: the value reads the tensor being written (`h[t] = h[t - 1] * a
      + x[t]`, dynamic programming) or a value carried from the previous iteration.
    - Indices that are data (`t[idx[i]] = ...`, `mask[i, :lengths[i]] = 1`): scatters and
      ragged writes need more than a one-line rewrite.
    - Loops that do anything besides element-wise assignments and tests (other calls,
      `break`, matrix products, per-item logic that happens to write one element), and
      right-hand sides that call anything but element-wise math (modules, losses, `.item()`),
      loops over small literal ranges (`range(3)` over channels), targets that are not known
      to be tensors (lists, numpy arrays), sums of products of two indexed tensors (a dot or
      matrix product, the loops family's rules), and tests.

    ## Fix safety
    No fix: the vectorized form depends on the shapes and on what the loop covers.
    """
    examples = [
        bad("""
            import torch
            def scale(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
                out = torch.empty_like(x)
                for i in range(len(x)):
                    out[i] = x[i] * w[i] + b[i]
                for i in range(x.shape[0]):
                    if x[i] < 0:
                        x[i] = 0
                total = 0.0
                for i in range(x.size(0)):
                    total += (x[i] - b[i]) ** 2
                return out, total
            """, (5, 9), (8, 13), (11, 9)),
        bad("""
            import math
            import torch
            def softplus_grid(n, m, device):
                t = torch.zeros(n, m, device=device)
                src = torch.randn(n, m, device=device)
                for i in range(n):
                    for j in range(m):
                        t[i, j] = math.log(1 + src[i, j].exp())
                for j in range(m):
                    t[:, j] *= 0.5
                return t
            """, (8, 13), (10, 9)),
        bad("""
            import torch
            def double(n, m):
                src = torch.randn(n, m)
                out = torch.zeros(n, m)
                for i in range(n):
                    for j in range(m):
                        out[i][j] = src[i][j] * 2
                return out
            """, (7, 13)),
        good("""
            import torch
            def fill(n, m, idx):
                grid = [[0.0] * m for _ in range(n)]
                src = torch.randn(n, m)
                out = torch.zeros(n, m)
                for i in range(n):
                    for j in range(m):
                        grid[i][j] = float(i * j)
                for i in range(n):
                    for j in range(m):
                        out[i][j] = src[idx[i]][j]
                for i in range(n):
                    for j in range(m):
                        out[i][j] = out[i][j - 1] + src[i][j]
                return grid, out
            """),
        good("""
            import torch
            def scan(x: torch.Tensor, a: float):
                h = torch.zeros_like(x)
                for t in range(1, len(x)):
                    h[t] = h[t - 1] * a + x[t]
                acc = torch.zeros(4)
                for t in range(len(x)):
                    acc = acc * a + x[t]
                return h, acc
            def ragged(lengths, n, idx, src):
                mask = torch.zeros(n, 10)
                for i in range(n):
                    mask[i, :lengths[i]] = 1
                out = torch.zeros(n)
                for i in range(n):
                    out[idx[i]] = src[i]
                return mask, out
            """),
        good("""
            import numpy as np
            import torch
            def other(model, x: torch.Tensor, rgb: torch.Tensor, a: torch.Tensor, b: torch.Tensor, n):
                arr = np.zeros(10)
                for i in range(10):
                    arr[i] = i * 2
                feats = [0] * n
                for i in range(n):
                    feats[i] = x[i] * 2
                for c in range(3):
                    rgb[c] = (rgb[c] - 0.5) / 0.25
                for i in range(n):
                    x[i] = model(x[i])
                for b in range(n):
                    pos = (x[b] == 0).nonzero()
                    if len(pos) == 0:
                        continue
                    x[b] = 1
                for c in range(n):
                    out = a[:, c] @ b
                    x[:, c] = out + a[:, c] @ b
                dot = 0.0
                for i in range(n):
                    dot += a[i] * b[i]
                return arr, feats, dot
            """),
    ]

    def __init__(self, ctx, options=None):
        super().__init__(ctx, options)
        self._reported_loops: set = set()

    only = {"visit_Assign": Only(in_loops=True), "visit_AugAssign": Only(in_loops=True)}

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1:
            self._check(node, node.targets[0], node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check(node, node.target, node.value, augmented=node.op)

    def _check(self, node: ast.AST, target: ast.AST, value: ast.AST, augmented=None) -> None:
        loops = self._range_loops()
        if not loops:
            return
        outer = loops[0]
        if id(outer.node) in self._reported_loops:
            return
        indices = set().union(*(loop.targets for loop in loops))
        if isinstance(target, ast.Subscript):
            written = self._element_base(target, indices)
            if written is None or not self._is_tensor(written):
                return
            if loaded_names(written) & loaded_names(value):
                return  # reads the tensor it writes: a recurrence
            reads = self._element_reads(value, indices)
            if reads is None or (not reads and not isinstance(value, ast.Constant)):
                return
            if isinstance(augmented, ast.Add) and self._is_product_of_elements(value):
                return
        elif isinstance(target, ast.Name) and isinstance(augmented, (ast.Add, ast.Sub, ast.Mult)):
            reads = self._element_reads(value, indices)
            if not reads or not any(self._is_tensor(r) for r in reads):
                return
            if isinstance(augmented, ast.Add) and self._is_product_of_elements(value):
                return
        else:
            return
        if any(loop.reads_carried(value) for loop in loops) or in_test_code(self.ctx):
            return
        if not self._only_element_work(outer.node.body, indices):
            return
        self._reported_loops.add(id(outer.node))
        self.report(node, "element-by-element tensor work in a Python loop: every index, operation and "
                          "assignment is a separate small op (a kernel launch on the GPU) per element; write "
                          "it once on whole tensors (`out = a * w + b`, slicing, `torch.where`, `.sum()`)")

    # -- helpers --------------------------------------------------------------------
    def _range_loops(self) -> list:
        """The innermost run of enclosing `for i in range(...)` loops, outermost first."""
        run = []
        for loop in reversed(self.ctx.loops):
            bound = _range_bound(loop)
            if bound is None:
                break
            if isinstance(bound, ast.Constant) and isinstance(bound.value, int) and bound.value <= _SMALL_RANGE:
                return []
            run.append(loop)
        return list(reversed(run))

    @staticmethod
    def _element_base(node: ast.Subscript, indices: set) -> Optional[ast.AST]:
        """The tensor an element access indexes (`x[i]`, `x[i, j]`, `x[:, i]`, `x[i][j]`, `x[i + 1]`)
        when every index is a loop variable, a constant or a full slice; else None."""
        parts = []
        while isinstance(node, ast.Subscript):
            index = node.slice
            parts.extend(index.elts if isinstance(index, ast.Tuple) else [index])
            node = node.value
        uses_loop_variable = False
        for part in parts:
            if isinstance(part, ast.Slice):
                if part.lower or part.upper or part.step:
                    return None
                continue
            names = loaded_names(part)
            if not names <= indices or any(isinstance(n, (ast.Call, ast.Subscript, ast.Attribute)) for n in ast.walk(part)):
                return None
            uses_loop_variable |= bool(names)
        return node if uses_loop_variable else None

    def _element_reads(self, value: ast.AST, indices: set) -> Optional[list]:
        """The indexed reads in an element-wise expression, or None when it is not element-wise."""
        reads = []
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Subscript):
                base = self._element_base(node, indices)
                if base is None:
                    return None
                reads.append(base)
                continue
            if isinstance(node, ast.Call):
                if not self._is_elementwise_call(node):
                    return None
                stack.extend(node.args)
                stack.extend(k.value for k in node.keywords)
                if isinstance(node.func, ast.Attribute) and self.ctx.qualname(node.func) is None:
                    stack.append(node.func.value)
                continue
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                return None
            if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Compare, ast.IfExp, ast.BoolOp)):
                stack.extend(ast.iter_child_nodes(node))
                continue
            if isinstance(node, (ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context)):
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                continue  # self.scale, cfg.eps
            return None
        return reads

    def _only_element_work(self, body: list, indices: set) -> bool:
        """The loop does nothing but element-wise assignments, tests and nested range loops: the
        whole loop is one vectorizable expression, not per-item logic that also writes a result."""
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    if isinstance(target, ast.Subscript):
                        if self._element_base(target, indices) is None:
                            return False
                    elif not isinstance(target, ast.Name):
                        return False
                if self._element_reads(stmt.value, indices) is None:
                    return False
            elif isinstance(stmt, ast.If):
                if self._element_reads(stmt.test, indices) is None:
                    return False
                if not self._only_element_work(stmt.body + stmt.orelse, indices):
                    return False
            elif isinstance(stmt, ast.For):
                if not isinstance(stmt.target, ast.Name):
                    return False
                if not self._only_element_work(stmt.body, indices | {stmt.target.id}):
                    return False
            elif not isinstance(stmt, (ast.Pass, ast.Continue)):
                return False
        return True

    def _is_elementwise_call(self, call: ast.Call) -> bool:
        qualname = self.ctx.qualname(call.func)
        if qualname is not None:
            module, _, name = qualname.rpartition(".")
            return module in ("torch", "math", "torch.nn.functional") and name in _ELEMENTWISE_FUNCTIONS
        if isinstance(call.func, ast.Attribute):
            return call.func.attr in _ELEMENTWISE_FUNCTIONS
        return getattr(call.func, "id", None) in ("abs", "min", "max")

    @staticmethod
    def _is_product_of_elements(value: ast.AST) -> bool:
        return (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)
                and isinstance(value.left, ast.Subscript) and isinstance(value.right, ast.Subscript))

    def _is_tensor(self, expr: ast.AST) -> bool:
        return _kinds.kind_of(self.ctx, expr) in _kinds.TENSORS or (
            isinstance(expr, ast.Name) and _kinds.looks_like_tensor(self.ctx, expr))
